package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/e2e/demo"
)

// demoWay is one way into a demo Service and how to try it once: try returns the pod
// that answered and the source address it saw.
type demoWay struct {
	name, from, target string
	try                func(ctx context.Context) (server, source string, err error)
}

// Report waits until the DaemonSet has programmed the demo's Services, sends traffic
// through every way into each, writes `make demo`'s table and the supervisor's status to
// out, and returns the rows. The error lists every row that is not as its Service asks
// (demo.Sample.Problem).
func (d *Demo) Report(ctx context.Context, out io.Writer) ([]demo.Row, error) {
	if err := d.waitProgrammed(ctx); err != nil {
		return nil, err
	}
	var rows []demo.Row
	var problems []string
	for _, s := range demo.Samples() {
		svc, err := d.c.Client.CoreV1().Services(s.NS).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		owner := demo.Owner(func(args ...string) (string, error) { return d.c.Nodes[0].Run(ctx, "nft", args...) }, svc.Spec.ClusterIP)
		for _, w := range d.ways(s, svc) {
			answered, sources := tryTen(ctx, w.try)
			r := demo.Row{Service: s.NS + "/" + s.Name, Instance: owner, WayIn: w.name, From: w.from,
				Target: w.target, Answered: answered, Sources: sources}
			rows = append(rows, r)
			if p := s.Problem(r, ExtIP); p != "" {
				problems = append(problems, p)
			}
		}
	}
	if err := demo.WriteTable(out, rows); err != nil {
		return rows, err
	}
	fmt.Fprintf(out, "\nINSTANCE is read from the node's kernel (whose table holds the cluster IP). Sources: %s = the client pod itself,\n"+
		"%s = the outside client (kept by externalTrafficPolicy Local), others = the node (masqueraded).\n"+
		"The demo's pods run on %s, where the outside's routes lead.\n\n", d.clientPod, ExtIP, d.c.Nodes[0].Name)
	status, err := d.c.Kubectl(ctx, "", "exec", "-n", "kube-system", "daemonset/shardproxy", "-c", "shardproxy", "--",
		"/usr/local/bin/shardproxy", "status", "--address", "127.0.0.1:10256")
	if err != nil {
		return rows, err
	}
	fmt.Fprint(out, status)
	if len(problems) > 0 {
		return rows, fmt.Errorf("the demo saw problems:\n  %s", strings.Join(problems, "\n  "))
	}
	return rows, nil
}

// ways are the ways into svc the report tries, those of `make demo`: TCP and UDP to the
// cluster IP from a pod, TCP to the IPv6 one of a dual-stack Service, the NodePort and
// the load-balancer IP from outside.
func (d *Demo) ways(s demo.Sample, svc *corev1.Service) []demoWay {
	ip := svc.Spec.ClusterIP
	ways := []demoWay{
		{"ClusterIP", "pod", demo.JoinHostPort(ip, 80), d.fromPod("http", ip, 80)},
		{"ClusterIP (UDP)", "pod", demo.JoinHostPort(ip, 53), d.fromPod("udp", ip, 53)},
	}
	if len(svc.Spec.ClusterIPs) > 1 {
		ip6 := svc.Spec.ClusterIPs[1]
		ways = append(ways, demoWay{"ClusterIP (IPv6)", "pod", demo.JoinHostPort(ip6, 80), d.fromPod("http", ip6, 80)})
	}
	if svc.Spec.Type != corev1.ServiceTypeClusterIP {
		ways = append(ways, demoWay{"NodePort", "outside", demo.JoinHostPort(d.c.Nodes[0].IP, int(svc.Spec.Ports[0].NodePort)), d.fromOutside(d.c.Nodes[0].IP, int(svc.Spec.Ports[0].NodePort))})
	}
	if s.LBIP != "" {
		ways = append(ways, demoWay{"LoadBalancer IP", "outside", demo.JoinHostPort(s.LBIP, 80), d.fromOutside(s.LBIP, 80)})
	}
	return ways
}

// tryTen tries a way ten times (giving up after two failures without an answer) and
// returns the row's ANSWERED BY and SOURCE cells.
func tryTen(ctx context.Context, try func(context.Context) (string, string, error)) (answered, sources string) {
	var t demo.Tally
	for range 10 {
		server, source, err := try(ctx)
		if err == nil {
			t.Answer(server, source)
			continue
		}
		if t.Fail(failureCell(err.Error())) {
			break
		}
	}
	return t.Cells()
}

// failureCell names a failed try as the demo's table does.
func failureCell(msg string) string {
	switch {
	case strings.Contains(msg, "connection refused"):
		return demo.Refused
	case strings.Contains(strings.ToLower(msg), "timeout") || strings.Contains(msg, "deadline exceeded"):
		return demo.NoAnswer
	}
	return "(" + msg + ")"
}

// fromOutside tries addr:port from the outside namespace: GET /hostname, then GET
// /clientip, each on a connection of its own.
func (d *Demo) fromOutside(addr string, port int) func(context.Context) (string, string, error) {
	base := "http://" + demo.JoinHostPort(addr, port)
	return func(ctx context.Context) (string, string, error) {
		server, err := d.c.Get(ctx, d.c.ExtNS, base+"/hostname")
		if err != nil {
			return "", "", err
		}
		source, err := d.c.Get(ctx, d.c.ExtNS, base+"/clientip")
		return server, hostOf(source), err
	}
}

// fromPod tries addr:port from the client pod, whose agnhost dials (its /dial, as
// upstream's e2e tests do) and asks the endpoint for its name, then for the source it saw.
func (d *Demo) fromPod(proto, addr string, port int) func(context.Context) (string, string, error) {
	return func(ctx context.Context) (string, string, error) {
		server, err := d.podDial(ctx, proto, addr, port, "hostname")
		if err != nil {
			return "", "", err
		}
		source, err := d.podDial(ctx, proto, addr, port, "clientip")
		return server, hostOf(source), err
	}
}

// podDial has the client pod send request once to addr:port over proto and returns the
// answer. agnhost waits up to 5 s for one.
func (d *Demo) podDial(ctx context.Context, proto, addr string, port int, request string) (string, error) {
	q := url.Values{"host": {addr}, "port": {strconv.Itoa(port)}, "protocol": {proto}, "request": {request}, "tries": {"1"}}
	u := fmt.Sprintf("http://%s/dial?%s", demo.JoinHostPort(d.clientPod, demo.TargetPort), q.Encode())
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.c.Dialer(d.c.Nodes[0].NS), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("asking the client pod: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	var result struct{ Responses, Errors []string }
	if err := json.Unmarshal(body, &result); err != nil {
		return "", fmt.Errorf("the client pod answered %s: %q", resp.Status, body)
	}
	if len(result.Responses) == 1 {
		return strings.TrimSpace(result.Responses[0]), nil
	}
	return "", fmt.Errorf("%s", strings.Join(result.Errors, "; "))
}

// hostOf is the address of host:port.
func hostOf(hostPort string) string {
	if host, _, err := net.SplitHostPort(strings.TrimSpace(hostPort)); err == nil {
		return host
	}
	return hostPort
}

// waitProgrammed waits until every demo Service a local instance serves answers through
// its cluster IP from the node (refuses, if it has no endpoints), and the load-balancer
// IP from outside: the Deployments are available before the instances have synced.
func (d *Demo) waitProgrammed(ctx context.Context) error {
	for _, s := range demo.Samples() {
		if s.Label == demo.OtherProxy {
			continue
		}
		svc, err := d.c.Client.CoreV1().Services(s.NS).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		checks := map[string]string{d.c.Nodes[0].NS: "http://" + svc.Spec.ClusterIP + "/hostname"}
		if s.LBIP != "" {
			checks[d.c.ExtNS] = "http://" + s.LBIP + "/hostname"
		}
		for ns, u := range checks {
			err := poll(ctx, time.Minute, fmt.Sprintf("%s/%s programmed (%s)", s.NS, s.Name, u), func() (bool, error) {
				_, err := d.c.Get(ctx, ns, u)
				if len(s.Backends) == 0 {
					return err != nil && failureCell(err.Error()) == demo.Refused, nil
				}
				return err == nil, nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}
