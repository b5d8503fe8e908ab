// Package demo is `make demo`: the e2e environment (a local control plane, a node
// namespace running `shardproxy run` with three instances, pods on two nodes, an external
// client), sample Services for each instance, real traffic through every way in, and a
// table of which instance served which Service and what the endpoints saw.
package demo

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	TargetPort = 8080
	LBIP       = "192.168.200.50"
)

// Samples are the demo's Services: one per instance and way of serving, one without
// endpoints and one labelled for a proxy that does not run here.
func Samples() []Sample {
	return []Sample{
		{NS: "shop", Name: "frontend", Backends: []env.Backend{env.Pod1v4, env.Remotev4, env.Pod1v6, env.Remotev6},
			Edits: []env.ServiceSpec{env.WithType(corev1.ServiceTypeNodePort), env.WithDualStack()}},
		{NS: "team-a", Name: "api", Label: "team-a", Backends: []env.Backend{env.Pod1v4, env.Remotev4},
			Edits: []env.ServiceSpec{env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalLocal()}, LBIP: LBIP},
		{NS: "team-b", Name: "cache", Label: "team-b", Backends: []env.Backend{env.Pod1v4, env.Remotev4},
			Edits: []env.ServiceSpec{env.WithClientIPAffinity()}},
		{NS: "team-b", Name: "empty", Label: "team-b"},
		{NS: "elsewhere", Name: "foreign", Label: OtherProxy, Backends: []env.Backend{env.Pod1v4}},
	}
}

// Ports are every demo Service's ports (TCP and UDP, to TargetPort).
func Ports() []env.ServicePort {
	return []env.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: TargetPort},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: TargetPort},
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
			stop, err := e.TP.Serve(ns, name, proto, "", TargetPort, opts.Logf)
			if err != nil {
				return d, err
			}
			e.OnClose(stop)
		}
	}
	for _, s := range Samples() {
		edits := s.Edits
		if s.Label != "" {
			edits = append(edits, env.WithProxyName(s.Label))
		}
		if _, err := e.CreateService(ctx, s.NS, s.Name, Ports(), s.Backends, edits...); err != nil {
			return d, err
		}
		if s.LBIP != "" {
			if _, err := e.SetLoadBalancerIngress(ctx, s.NS, s.Name, s.LBIP); err != nil {
				return d, err
			}
		}
	}
	opts.Logf("created %d sample Services", len(Samples()))
	return d, nil
}

// Close tears everything down.
func (d *Demo) Close() error {
	if d.Env == nil {
		return nil
	}
	return d.Env.Close()
}

// Report sends traffic through every way into every sample Service and writes the table.
// It returns an error if any row is not as the Service asks (Sample.Problem).
func (d *Demo) Report(ctx context.Context) error {
	e := d.Env
	// Give the instances a moment to program the last changes.
	time.Sleep(time.Second)
	var rows []Row
	var problems []string
	for _, s := range Samples() {
		svc, err := e.Client.CoreV1().Services(s.NS).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		owner := Owner(func(args ...string) (string, error) { return e.TP.Exec(e.TP.Node, append([]string{"nft"}, args...)...) }, svc.Spec.ClusterIP)
		for _, w := range d.ways(s, svc) {
			answered, sources := probe(e, w.fromNS, w.proto, w.addr, w.port)
			r := Row{
				Service: s.NS + "/" + s.Name, Instance: owner, WayIn: w.name, From: w.from,
				Target: JoinHostPort(w.addr, w.port), Answered: answered, Sources: sources,
			}
			rows = append(rows, r)
			if p := s.Problem(r, netns.ClientIPv4); p != "" {
				problems = append(problems, p)
			}
		}
	}
	if err := WriteTable(d.opts.Out, rows); err != nil {
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

// way is one way into a Service: from which namespace, over which protocol, to where.
type way struct {
	name, from, fromNS, proto, addr string
	port                            int
}

// ways are the ways into svc the report tries.
func (d *Demo) ways(s Sample, svc *corev1.Service) []way {
	e := d.Env
	ways := []way{
		{"ClusterIP", "pod2", e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80},
		{"ClusterIP (UDP)", "pod2", e.TP.Pod2, "udp", svc.Spec.ClusterIP, 53},
	}
	if len(svc.Spec.ClusterIPs) > 1 {
		ways = append(ways, way{"ClusterIP (IPv6)", "pod2", e.TP.Pod2, "tcp", svc.Spec.ClusterIPs[1], 80})
	}
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		ways = append(ways, way{"NodePort", "client", e.TP.Client, "tcp", netns.NodeIPv4, int(svc.Spec.Ports[0].NodePort)})
	}
	if s.LBIP != "" {
		ways = append(ways, way{"LoadBalancer IP", "client", e.TP.Client, "tcp", s.LBIP, 80})
	}
	return ways
}

// probe dials ten times and summarises who answered and which sources they saw.
func probe(e *env.Env, ns, proto, addr string, port int) (answered, sources string) {
	var t Tally
	for range 10 {
		r, err := e.TP.DialWith(ns, proto, addr, port, netns.DialOptions{Timeout: 1500 * time.Millisecond})
		if err == nil {
			t.Answer(r.Server, r.Source)
			continue
		}
		cell := "(" + err.Error() + ")"
		switch {
		case netns.IsRefused(err):
			cell = Refused
		case netns.IsTimeout(err):
			cell = NoAnswer
		}
		if t.Fail(cell) {
			break
		}
	}
	return t.Cells()
}
