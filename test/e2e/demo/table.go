package demo

import (
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// The cells of a way in that nobody served.
const (
	Refused  = "(refused)"
	NoAnswer = "(no answer)"
)

// Row is one line of the demo's table: one way into one Service and what answered.
type Row struct {
	Service, Instance, WayIn, From, Target, Answered, Sources string
}

// Served reports whether an endpoint answered.
func (r Row) Served() bool { return !strings.HasPrefix(r.Answered, "(") }

// Instances are the demo's instances; Sample.WantInstance names one of them.
var Instances = []string{"default", "team-a", "team-b"}

// Sample is one demo Service: its namespace and name, the proxy it is labelled for ("" for
// none), its endpoints, the changes to a plain two-port Service, and the load-balancer
// ingress address a cloud would write.
type Sample struct {
	NS, Name string
	Label    string
	Backends []env.Backend
	Edits    []env.ServiceSpec
	LBIP     string
}

// OtherProxy is the proxy name no instance of the demo serves.
const OtherProxy = "another-proxy"

// WantInstance is the instance that must hold s's cluster IP, "(none)" for a Service
// labelled for another proxy.
func (s Sample) WantInstance() string {
	switch s.Label {
	case "":
		return "default"
	case OtherProxy:
		return "(none)"
	}
	return s.Label
}

// Spec is s's Service with its edits applied (no name, ports or endpoints).
func (s Sample) Spec() *corev1.Service {
	svc := &corev1.Service{}
	for _, edit := range s.Edits {
		edit(svc)
	}
	return svc
}

// Problem is what is wrong with row r of s, "" if nothing: the wrong instance holds its
// cluster IP; a Service of another proxy was served; one with endpoints was not, or not
// by one endpoint alone under ClientIP affinity; one without endpoints was not refused;
// the client's address was lost where externalTrafficPolicy Local keeps it (client is
// the outside client's address).
func (s Sample) Problem(r Row, client string) string {
	spec := s.Spec()
	switch {
	case r.Instance != s.WantInstance():
		return fmt.Sprintf("%s is held by instance %s, want %s", r.Service, r.Instance, s.WantInstance())
	case s.Label == OtherProxy && r.Served():
		return fmt.Sprintf("%s belongs to no local instance but was served via %s", r.Service, r.WayIn)
	case s.Label == OtherProxy:
		return ""
	case len(s.Backends) > 0 && !r.Served():
		return fmt.Sprintf("%s via %s: %s", r.Service, r.WayIn, r.Answered)
	case len(s.Backends) == 0 && r.Answered != Refused:
		return fmt.Sprintf("%s has no endpoints, want %s, got %s", r.Service, Refused, r.Answered)
	case spec.Spec.SessionAffinity == corev1.ServiceAffinityClientIP && strings.Contains(r.Answered, " "):
		return fmt.Sprintf("%s has ClientIP affinity but via %s was answered by %s", r.Service, r.WayIn, r.Answered)
	case spec.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && r.Served() &&
		(r.WayIn == "NodePort" || r.WayIn == "LoadBalancer IP") && r.Sources != client:
		return fmt.Sprintf("%s via %s: the endpoint saw %s, want the client %s (externalTrafficPolicy Local)", r.Service, r.WayIn, r.Sources, client)
	}
	return ""
}

// Tally counts the tries of one row.
type Tally struct {
	counts   map[string]int
	sources  map[string]bool
	failures int
	lastFail string
}

// Answer counts an answer from server, which saw the client as source.
func (t *Tally) Answer(server, source string) {
	if t.counts == nil {
		t.counts, t.sources = map[string]int{}, map[string]bool{}
	}
	t.counts[server]++
	t.sources[source] = true
}

// Fail counts a try nobody answered (cell: Refused, NoAnswer or "(error)"); it reports
// whether to give up: two failures and no answer say the way is not served, with no need
// to wait out ten timeouts.
func (t *Tally) Fail(cell string) (giveUp bool) {
	t.failures++
	t.lastFail = cell
	return t.failures >= 2 && len(t.counts) == 0
}

// Cells are the row's ANSWERED BY and SOURCE cells.
func (t *Tally) Cells() (answered, sources string) {
	if len(t.counts) == 0 {
		return t.lastFail, ""
	}
	var a, s []string
	for k, v := range t.counts {
		a = append(a, fmt.Sprintf("%s×%d", k, v))
	}
	for k := range t.sources {
		s = append(s, k)
	}
	sort.Strings(a)
	sort.Strings(s)
	return strings.Join(a, " "), strings.Join(s, " ")
}

// WriteTable writes rows as the demo's table.
func WriteTable(out io.Writer, rows []Row) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tINSTANCE\tWAY IN\tFROM\tTO\tANSWERED BY (of 10)\tSOURCE THE ENDPOINT SAW")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Service, r.Instance, r.WayIn, r.From, r.Target, r.Answered, r.Sources)
	}
	return w.Flush()
}

// Owner names the instances whose table holds clusterIP, read from the kernel by nft
// (which runs `nft ARGS...` on the node), "(none)" if no instance's does.
func Owner(nft func(args ...string) (string, error), clusterIP string) string {
	var owners []string
	for _, inst := range Instances {
		out, err := nft("list", "set", "ip", tables.TableName("shardproxy", inst), "cluster-ips")
		if err != nil {
			continue
		}
		fields := strings.Fields(strings.NewReplacer("{", " ", "}", " ", ",", " ").Replace(out))
		if slices.Contains(fields, clusterIP) {
			owners = append(owners, inst)
		}
	}
	if len(owners) == 0 {
		return "(none)"
	}
	return strings.Join(owners, ",")
}

// JoinHostPort is net.JoinHostPort with a numeric port.
func JoinHostPort(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }
