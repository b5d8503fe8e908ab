package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
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
	deleted := after.Value("shardproxy_conntrack_deleted_entries_total", "instance", "team-a") -
		before.Value("shardproxy_conntrack_deleted_entries_total", "instance", "team-a")
	if deleted < 2 {
		t.Errorf("shardproxy_conntrack_deleted_entries_total{instance=team-a} grew by %v, want at least the 2 stale flows", deleted)
	}
	fmt.Printf("e2e: UDP endpoint replaced: stale flows deleted=%v, traffic on the new endpoint within %v\n",
		deleted, time.Since(replaced).Round(10*time.Millisecond))
}
