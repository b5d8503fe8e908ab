package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
)

// TestConsistentHashEveryAddress: a team-a LoadBalancer Service asks for consistentHash
// with the annotation (team-a allows it). The client reaches one endpoint, the same
// through the load-balancer IP and the NodePort, because both pick through the cluster
// IP's table (issue 14), and team-a's table holds that table's 256 slots once.
func TestConsistentHashEveryAddress(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns, lbIP = "balance", "192.168.200.20"
	servers(t, e, 8110, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8110}}
	annotate := func(s *corev1.Service) {
		s.Annotations = map[string]string{instance.LoadBalancingAnnotation: "consistentHash"}
	}
	svc, err := e.CreateService(ctx, ns, "hashed", ports, []env.Backend{env.Pod1v4, env.Remotev4},
		env.WithProxyName("team-a"), env.WithType(corev1.ServiceTypeLoadBalancer), annotate)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.DeleteService(context.Background(), ns, "hashed"); err != nil {
			t.Errorf("deleting the Service: %v", err)
		}
	})
	if _, err := e.SetLoadBalancerIngress(ctx, ns, "hashed", lbIP); err != nil {
		t.Fatal(err)
	}
	nodePort := int(svc.Spec.Ports[0].NodePort)
	first := firstAnswer(t, e, lbIP, 80)
	for i := range 10 {
		addr, port := lbIP, 80
		if i%2 == 1 {
			addr, port = netns.NodeIPv4, nodePort
		}
		r, err := e.TP.Dial(e.TP.Client, "tcp", addr, port)
		if err != nil {
			t.Fatalf("client -> %s:%d: %v", addr, port, err)
		}
		if r.Server != first {
			t.Fatalf("client -> %s:%d reached %s, after %s: consistentHash must keep the client on one endpoint through every address", addr, port, r.Server, first)
		}
	}
	table, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", "shardproxy-team-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range []string{lbIP + " . tcp . 80", netns.NodeIPv4 + " . tcp . " + strconv.Itoa(nodePort)} {
		if !strings.Contains(table, entry+" : goto pick-ch-cip-256") {
			t.Errorf("team-a's table does not send %s through the cluster IP's table", entry)
		}
	}
	if n := strings.Count(table, " . "+svc.Spec.ClusterIP+" . tcp . 80 : "); n != 256 {
		t.Errorf("the cluster IP has %d slots in team-a's table, want 256", n)
	}
	if strings.Contains(table, " . "+lbIP+" . tcp . 80 : ") {
		t.Errorf("the load-balancer IP has slots of its own in team-a's table")
	}
	t.Logf("the client reaches %s through %s:80 and %s:%d", first, lbIP, netns.NodeIPv4, nodePort)
}

// firstAnswer dials addr:port from the client until a server answers (the Service is
// being programmed) and returns its name.
func firstAnswer(t *testing.T, e *env.Env, addr string, port int) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := e.TP.Dial(e.TP.Client, "tcp", addr, port)
		if err == nil {
			return r.Server
		}
		if time.Now().After(deadline) {
			t.Fatalf("client -> %s:%d: %v", addr, port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
