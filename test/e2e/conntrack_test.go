package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestUDPEndpointReplaced: a client keeps sending datagrams from one source port, so its
// conntrack flow never expires; when the Service's endpoint is replaced, the supervisor's
// conntrack cleanup deletes the stale flow and the datagrams reach the new endpoint. The
// old endpoint keeps running, so a flow left behind would keep answering from it.
func TestUDPEndpointReplaced(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns = "conntrack"
	servers(t, e, 8104, "udp")
	ports := []env.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: 8104}}
	svc, err := e.CreateService(ctx, ns, "dns", ports, []env.Backend{env.Pod1v4},
		env.WithProxyName("team-a"), env.WithType(corev1.ServiceTypeNodePort))
	if err != nil {
		t.Fatal(err)
	}
	before, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paths := []struct {
		name, from, addr string
		port, srcPort    int
	}{
		{"ClusterIP from a pod", e.TP.Pod2, svc.Spec.ClusterIP, 53, 40053},
		{"NodePort from outside", e.TP.Client, netns.NodeIPv4, int(svc.Spec.Ports[0].NodePort), 40054},
	}
	// Each path: the same source port every time, a datagram every 100ms.
	type sample struct {
		path   int
		server string
	}
	samples := make(chan sample, 1024)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for i, p := range paths {
				r, err := e.TP.DialWith(p.from, "udp", p.addr, p.port, netns.DialOptions{SourcePort: p.srcPort, Timeout: 500 * time.Millisecond})
				server := r.Server
				if err != nil {
					server = "error"
				}
				select {
				case samples <- sample{i, server}:
				default:
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); <-done }()

	waitFor := func(want string, timeout time.Duration) {
		t.Helper()
		got := map[int]string{}
		deadline := time.After(timeout)
		streak := map[int]int{}
		for {
			select {
			case s := <-samples:
				got[s.path] = s.server
				if s.server == want {
					streak[s.path]++
				} else {
					streak[s.path] = 0
				}
				if streak[0] >= 5 && streak[1] >= 5 {
					return
				}
			case <-deadline:
				t.Fatalf("datagrams never settled on %s: last answers %v", want, got)
			}
		}
	}
	waitFor("pod1", 20*time.Second)
	replaced := time.Now()
	if err := e.SetEndpoints(ctx, ns, "dns", ports, []env.Backend{env.Remotev4}); err != nil {
		t.Fatal(err)
	}
	waitFor("remote", 10*time.Second)
	t.Logf("after the endpoint changed, both flows reached the new endpoint within %v", time.Since(replaced).Round(10*time.Millisecond))

	after, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deleted := after.Value("shardproxy_conntrack_deleted_entries_total", "proxy_instance", "team-a") -
		before.Value("shardproxy_conntrack_deleted_entries_total", "proxy_instance", "team-a")
	if deleted < 2 {
		t.Errorf("shardproxy_conntrack_deleted_entries_total{proxy_instance=team-a} grew by %v, want at least the 2 stale flows", deleted)
	}
	fmt.Printf("e2e: UDP endpoint replaced: stale flows deleted=%v, traffic on the new endpoint within %v\n",
		deleted, time.Since(replaced).Round(10*time.Millisecond))
}

// TestTCPSynBeforeRules: a client's SYN reaches a Service's external IP before any proxy
// has rules for it, so conntrack records the connection untranslated and unanswered for
// two minutes; every later SYN with that tuple (a retransmission, or a new socket on the
// same client port) follows that entry past the NAT chains and is turned away
// (kubernetes/kubernetes#48719, which upstream kube-proxy leaves to time out). Once
// team-a programs the Service, the supervisor deletes the entry and a SYN from the same
// client port connects.
func TestTCPSynBeforeRules(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns, srcPort = "conntrack", 40105
	servers(t, e, 8105, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8105}}
	// Labeled for a proxy no instance runs: its addresses are allocated, no rule has them.
	// Its cluster IP never gets an entry: the supervisor's node table drops the SYN before
	// conntrack confirms it. Its external IP (team-a admits any) is outside every
	// ServiceCIDR, so the SYN leaves by the default route and its entry stays.
	const externalIP = "192.168.201.105"
	svc, err := e.CreateService(ctx, ns, "early", ports, []env.Backend{env.Pod1v4}, env.WithProxyName("nobody"), env.WithExternalIPs(externalIP))
	if err != nil {
		t.Fatal(err)
	}
	// The supervisor writes its node table once its caches are filled, alongside the
	// instances' first syncs: the environment may be up a moment before.
	testutil.Eventually(t, 10*time.Second, "the node table", func() bool {
		out, err := e.TP.Exec(e.TP.Node, "nft", "list", "set", "ip", "shardproxy_node", "service-cidrs")
		return err == nil && strings.Contains(out, "10.96.0.0/16")
	})
	if _, err := e.TP.DialWith(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, netns.DialOptions{SourcePort: srcPort, Timeout: 500 * time.Millisecond}); err == nil {
		t.Fatalf("connected to the unserved cluster IP %s", svc.Spec.ClusterIP)
	}
	if out, _ := e.TP.Exec(e.TP.Node, "conntrack", "-L", "-p", "tcp", "--orig-dst", svc.Spec.ClusterIP); strings.Contains(out, "SYN_SENT") {
		t.Errorf("a SYN to the unserved cluster IP left an entry (the node table should drop it unconfirmed):\n%s", out)
	}
	dial := func() (netns.Reply, error) {
		return e.TP.DialWith(e.TP.Pod2, "tcp", externalIP, 80, netns.DialOptions{SourcePort: srcPort, Timeout: 500 * time.Millisecond})
	}
	stale := func() bool {
		out, err := e.TP.Exec(e.TP.Node, "conntrack", "-L", "-p", "tcp", "--orig-dst", externalIP, "--orig-port-src", fmt.Sprint(srcPort), "--state", "SYN_SENT")
		// Untranslated: the reply comes from the cluster IP itself.
		return err == nil && strings.Contains(out, "src="+externalIP+" dst="+netns.Pod2IPv4)
	}
	// The very first packets out of a fresh pod namespace may not make it to the node in
	// time, so try a few SYNs until one has left its entry.
	var firstErr error
	for attempt := 0; attempt < 5 && !stale(); attempt++ {
		r, err := dial()
		if err == nil {
			t.Fatalf("connected to %s:80 before any proxy served it (answered by %s)", externalIP, r.Server)
		}
		firstErr = err
	}
	if !stale() {
		all, _ := e.TP.Exec(e.TP.Node, "conntrack", "-L", "-p", "tcp", "--orig-dst", externalIP)
		t.Fatalf("no untranslated SYN_SENT entry for %s:%d -> %s:80 after 5 SYNs (last: %v); the test proves nothing. Entries to the cluster IP:\n%s",
			netns.Pod2IPv4, srcPort, externalIP, firstErr, all)
	}
	before, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := e.Relabel(ctx, ns, "early", "team-a"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "team-a to program "+externalIP, func() bool {
		out, err := e.TP.Exec(e.TP.Node, "nft", "list", "map", "ip", "shardproxy-team-a", "service-ips")
		return err == nil && strings.Contains(out, externalIP+" . tcp . 80")
	})
	// The cleanup follows the sync that programmed the Service.
	testutil.Eventually(t, 10*time.Second, "the untranslated entry to go", func() bool { return !stale() })
	r, err := dial()
	if err != nil {
		t.Fatalf("SYN from the same client port after team-a programmed %s: %v", externalIP, err)
	}
	if r.Server != "pod1" {
		t.Errorf("answered by %s, want pod1", r.Server)
	}
	after, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deleted := after.Value("shardproxy_conntrack_deleted_entries_total", "proxy_instance", "team-a") -
		before.Value("shardproxy_conntrack_deleted_entries_total", "proxy_instance", "team-a")
	if deleted < 1 {
		t.Errorf("shardproxy_conntrack_deleted_entries_total{proxy_instance=team-a} grew by %v, want at least the stale entry", deleted)
	}
	fmt.Printf("e2e: TCP SYN before the rules: untranslated entry deleted (%v), same client port connected to %s\n", deleted, r.Server)
}
