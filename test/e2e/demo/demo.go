// Package demo is `make demo`: the e2e environment (a local control plane, a node
// namespace running `shardproxy run` with three instances, pods on two nodes, an external
// client), sample Services for each instance, real traffic through every way in, and a
// table of which instance served which Service and what the endpoints saw.
package demo

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Options configure a demo run.
type Options struct {
	// RepoRoot is the repository (for deploy/ and building the binary).
	RepoRoot string
	// WorkDir holds the config, kubeconfig, binary and logs.
	WorkDir string
	// Out receives the report.
	Out io.Writer
	// Logf reports progress.
	Logf func(format string, args ...any)
}

// The demo's endpoint port and its load-balancer address.
const (
	targetPort = 8080
	lbIP       = "192.168.200.50"
)

// sample is one demo Service.
type sample struct {
	ns, name string
	label    string // service-proxy-name; "" = unlabeled
	backends []env.Backend
	edits    []env.ServiceSpec
	lbIP     string
}

func samples() []sample {
	return []sample{
		{ns: "shop", name: "frontend", backends: []env.Backend{env.Pod1v4, env.Remotev4, env.Pod1v6, env.Remotev6},
			edits: []env.ServiceSpec{env.WithType(corev1.ServiceTypeNodePort), env.WithDualStack()}},
		{ns: "team-a", name: "api", label: "team-a", backends: []env.Backend{env.Pod1v4, env.Remotev4},
			edits: []env.ServiceSpec{env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalLocal()}, lbIP: lbIP},
		{ns: "team-b", name: "cache", label: "team-b", backends: []env.Backend{env.Pod1v4, env.Remotev4},
			edits: []env.ServiceSpec{env.WithClientIPAffinity()}},
		{ns: "team-b", name: "empty", label: "team-b"},
		{ns: "elsewhere", name: "foreign", label: "another-proxy", backends: []env.Backend{env.Pod1v4}},
	}
}

// Demo is a running demo.
type Demo struct {
	Env  *env.Env
	opts Options
}

// Start brings the environment up and creates the sample Services. On error, Close must
// still be called on a non-nil Demo.
func Start(ctx context.Context, opts Options) (*Demo, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	e, err := env.Start(ctx, env.Options{RepoRoot: opts.RepoRoot, WorkDir: opts.WorkDir, Logf: opts.Logf})
	d := &Demo{Env: e, opts: opts}
	if err != nil {
		return d, err
	}
	for ns, name := range map[string]string{e.TP.Pod1: "pod1", e.TP.Pod2: "pod2", e.TP.Remote: "remote"} {
		for _, proto := range []string{"tcp", "udp"} {
			stop, err := e.TP.Serve(ns, name, proto, "", targetPort, opts.Logf)
			if err != nil {
				return d, err
			}
			e.OnClose(stop)
		}
	}
	ports := []env.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: targetPort},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: targetPort},
	}
	for _, s := range samples() {
		edits := s.edits
		if s.label != "" {
			edits = append(edits, env.WithProxyName(s.label))
		}
		if _, err := e.CreateService(ctx, s.ns, s.name, ports, s.backends, edits...); err != nil {
			return d, err
		}
		if s.lbIP != "" {
			if _, err := e.SetLoadBalancerIngress(ctx, s.ns, s.name, s.lbIP); err != nil {
				return d, err
			}
		}
	}
	opts.Logf("created %d sample Services", len(samples()))
	return d, nil
}

// Close tears everything down.
func (d *Demo) Close() error {
	if d.Env == nil {
		return nil
	}
	return d.Env.Close()
}

// row is one line of the report.
type row struct {
	service, instance, wayIn, from, target, answered, sources string
}

// Report sends traffic through every way into every sample Service and writes the table.
// It returns an error if any Service an instance owns was not served as expected.
func (d *Demo) Report(ctx context.Context) error {
	e := d.Env
	// Give the instances a moment to program the last changes.
	time.Sleep(time.Second)
	var rows []row
	var problems []string
	for _, s := range samples() {
		svc, err := e.Client.CoreV1().Services(s.ns).Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		owner := d.owner(svc.Spec.ClusterIP)
		type way struct {
			name, from, fromNS, proto, addr string
			port                            int
		}
		ways := []way{{"ClusterIP", "pod2", e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80}}
		ways = append(ways, way{"ClusterIP (UDP)", "pod2", e.TP.Pod2, "udp", svc.Spec.ClusterIP, 53})
		if len(svc.Spec.ClusterIPs) > 1 {
			ways = append(ways, way{"ClusterIP (IPv6)", "pod2", e.TP.Pod2, "tcp", svc.Spec.ClusterIPs[1], 80})
		}
		if svc.Spec.Type != corev1.ServiceTypeClusterIP {
			ways = append(ways, way{"NodePort", "client", e.TP.Client, "tcp", netns.NodeIPv4, int(svc.Spec.Ports[0].NodePort)})
		}
		if s.lbIP != "" {
			ways = append(ways, way{"LoadBalancer IP", "client", e.TP.Client, "tcp", s.lbIP, 80})
		}
		for _, w := range ways {
			answered, sources := probe(e, w.fromNS, w.proto, w.addr, w.port)
			rows = append(rows, row{
				service: s.ns + "/" + s.name, instance: owner, wayIn: w.name, from: w.from,
				target: joinHostPort(w.addr, w.port), answered: answered, sources: sources,
			})
			served := !strings.HasPrefix(answered, "(")
			switch {
			case s.label == "another-proxy" && served:
				problems = append(problems, fmt.Sprintf("%s/%s belongs to no local instance but was served", s.ns, s.name))
			case s.label != "another-proxy" && len(s.backends) > 0 && !served:
				problems = append(problems, fmt.Sprintf("%s/%s via %s: %s", s.ns, s.name, w.name, answered))
			case len(s.backends) == 0 && answered != "(refused)":
				problems = append(problems, fmt.Sprintf("%s/%s has no endpoints, want refused, got %s", s.ns, s.name, answered))
			}
		}
	}
	w := tabwriter.NewWriter(d.opts.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tINSTANCE\tWAY IN\tFROM\tTO\tANSWERED BY (of 10)\tSOURCE THE ENDPOINT SAW")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.service, r.instance, r.wayIn, r.from, r.target, r.answered, r.sources)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(d.opts.Out, "\nINSTANCE is read from the kernel (whose table holds the cluster IP). Sources: %s/%s = the pod itself,\n"+
		"%s = the client (kept by externalTrafficPolicy Local), %s/%s = the node (masqueraded).\n\n",
		netns.Pod2IPv4, netns.Pod2IPv6, netns.ClientIPv4, netns.PodGatewayIPv4, netns.NodeClusterIPv4)
	out, err := e.CLI("status", "--address", fmt.Sprintf("127.0.0.1:%d", env.HealthzPort))
	if err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	fmt.Fprint(d.opts.Out, out)
	if len(problems) > 0 {
		return fmt.Errorf("the demo saw problems:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// owner names the instance whose table holds the cluster IP, read from the kernel.
func (d *Demo) owner(clusterIP string) string {
	var owners []string
	for _, inst := range []string{"default", "team-a", "team-b"} {
		out, err := d.Env.TP.Exec(d.Env.TP.Node, "nft", "list", "set", "ip", tables.TableName("shardproxy", inst), "cluster-ips")
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

// probe dials ten times and summarises who answered and which sources they saw.
func probe(e *env.Env, ns, proto, addr string, port int) (answered, sources string) {
	counts := map[string]int{}
	srcs := map[string]bool{}
	var lastErr error
	failures := 0
	for range 10 {
		r, err := e.TP.DialWith(ns, proto, addr, port, netns.DialOptions{Timeout: 1500 * time.Millisecond})
		if err != nil {
			lastErr = err
			if failures++; failures >= 2 && len(counts) == 0 {
				break // not served at all; no need to wait out ten timeouts
			}
			continue
		}
		counts[r.Server]++
		srcs[r.Source] = true
	}
	if len(counts) == 0 {
		switch {
		case netns.IsRefused(lastErr):
			return "(refused)", ""
		case netns.IsTimeout(lastErr):
			return "(no answer)", ""
		default:
			return "(" + lastErr.Error() + ")", ""
		}
	}
	var a, s []string
	for k, v := range counts {
		a = append(a, fmt.Sprintf("%s×%d", k, v))
	}
	for k := range srcs {
		s = append(s, k)
	}
	sort.Strings(a)
	sort.Strings(s)
	return strings.Join(a, " "), strings.Join(s, " ")
}

func joinHostPort(addr string, port int) string {
	if strings.Contains(addr, ":") {
		return fmt.Sprintf("[%s]:%d", addr, port)
	}
	return fmt.Sprintf("%s:%d", addr, port)
}
