package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Addresses a cloud load balancer and an operator would hand out; the client routes
// everything through the node, so they reach the node like real ones.
const (
	lbIPAllowed  = "192.168.200.10"
	lbIPDenied   = "192.168.200.11"
	lbIPLocal    = "192.168.200.12"
	externalIP   = "192.168.201.10"
	otherNetwork = "192.168.55.0/24"
)

// TestServiceFeatures sends real traffic at every way into a Service and checks who
// answers and which source address they saw. Services belong to team-b (interface-prefix
// local detection) and the default instance (cluster-CIDR detection) so both masquerade
// modes carry external traffic.
func TestServiceFeatures(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns = "features"
	servers(t, e, 8100, "tcp", "udp")
	ports := []env.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8100},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: 8100},
	}
	both := []env.Backend{env.Pod1v4, env.Remotev4}
	teamB := env.WithProxyName("team-b")
	create := func(name string, backends []env.Backend, edits ...env.ServiceSpec) *corev1.Service {
		t.Helper()
		svc, err := e.CreateService(ctx, ns, name, ports, backends, edits...)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	nodePort := func(svc *corev1.Service, proto corev1.Protocol) int {
		for _, p := range svc.Spec.Ports {
			if p.Protocol == proto {
				return int(p.NodePort)
			}
		}
		t.Fatalf("%s has no %s node port", svc.Name, proto)
		return 0
	}

	for _, tc := range []struct {
		name string
		inst env.ServiceSpec
	}{{"team-b", teamB}, {"default", func(*corev1.Service) {}}} {
		t.Run("ClusterIP and NodePort/"+tc.name, func(t *testing.T) {
			svc := create("np-"+tc.name, both, tc.inst, env.WithType(corev1.ServiceTypeNodePort))
			ip := svc.Spec.ClusterIP
			for _, proto := range []string{"tcp", "udp"} {
				port := 80
				np := nodePort(svc, corev1.ProtocolTCP)
				if proto == "udp" {
					port, np = 53, nodePort(svc, corev1.ProtocolUDP)
				}
				seen := reach(t, e, e.TP.Pod2, proto, ip, port, "pod1", "remote")
				if seen["pod1"] != netns.Pod2IPv4 {
					t.Errorf("%s pod to ClusterIP: pod1 saw %s, want the pod's own address %s", proto, seen["pod1"], netns.Pod2IPv4)
				}
				reach(t, e, e.TP.Node, proto, ip, port, "pod1", "remote")
				seen = reach(t, e, e.TP.Client, proto, netns.NodeIPv4, np, "pod1", "remote")
				for server, src := range seen {
					if src == netns.ClientIPv4 {
						t.Errorf("%s NodePort with Cluster policy: %s saw the client address; external traffic must be masqueraded", proto, server)
					}
				}
				t.Logf("%s: ClusterIP %s:%d from pod and host, NodePort %s:%d from outside (sources %v)", proto, ip, port, netns.NodeIPv4, np, seen)
			}
			fails(t, e, e.TP.Pod2, "tcp", ip, 81, "undefined port refused", refused)
			fails(t, e, e.TP.Node, "tcp", "127.0.0.1", nodePort(svc, corev1.ProtocolTCP), "no NodePort on the node's localhost", refused)
		})
	}

	t.Run("LoadBalancer IP and source ranges", func(t *testing.T) {
		create("lb-allowed", both, teamB, env.WithType(corev1.ServiceTypeLoadBalancer), env.WithSourceRanges(netns.ClientIPv4+"/32"))
		if _, err := e.SetLoadBalancerIngress(ctx, ns, "lb-allowed", lbIPAllowed); err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Client, "tcp", lbIPAllowed, 80, "pod1", "remote")
		reach(t, e, e.TP.Client, "udp", lbIPAllowed, 53, "pod1", "remote")

		// Reachable first, then a range that excludes the client: the firewall drops.
		create("lb-denied", both, teamB, env.WithType(corev1.ServiceTypeLoadBalancer))
		if _, err := e.SetLoadBalancerIngress(ctx, ns, "lb-denied", lbIPDenied); err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Client, "tcp", lbIPDenied, 80, "pod1", "remote")
		if _, err := e.UpdateService(ctx, ns, "lb-denied", env.WithSourceRanges(otherNetwork)); err != nil {
			t.Fatal(err)
		}
		fails(t, e, e.TP.Client, "tcp", lbIPDenied, 80, "dropped by loadBalancerSourceRanges", timedOut)
		t.Logf("LB %s admits the client, LB %s (ranges %s) drops it", lbIPAllowed, lbIPDenied, otherNetwork)
	})

	t.Run("external IP", func(t *testing.T) {
		svc := create("external", both, env.WithExternalIPs(externalIP))
		reach(t, e, e.TP.Client, "tcp", externalIP, 80, "pod1", "remote")
		reach(t, e, e.TP.Client, "udp", externalIP, 53, "pod1", "remote")
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1", "remote")
	})

	t.Run("ClientIP affinity sticks", func(t *testing.T) {
		svc := create("sticky", both, teamB, env.WithClientIPAffinity())
		first, err := e.TP.Dial(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80)
		for i := 0; err != nil && i < 100; i++ {
			first, err = e.TP.Dial(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80)
		}
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 30; i++ {
			r, err := e.TP.Dial(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80)
			if err != nil {
				t.Fatal(err)
			}
			if r.Server != first.Server {
				t.Fatalf("connection %d went to %s, the first to %s: affinity did not stick", i, r.Server, first.Server)
			}
		}
		t.Logf("31 connections from pod2 all went to %s", first.Server)
	})

	t.Run("hairpin is masqueraded", func(t *testing.T) {
		for name, inst := range map[string]env.ServiceSpec{"team-b": teamB, "default": func(*corev1.Service) {}} {
			svc := create("hairpin-"+name, []env.Backend{env.Pod1v4}, inst)
			seen := reach(t, e, e.TP.Pod1, "tcp", svc.Spec.ClusterIP, 80, "pod1")
			if seen["pod1"] == netns.Pod1IPv4 {
				t.Errorf("pod1 reaching itself through %s saw its own address: hairpin traffic must be masqueraded", svc.Spec.ClusterIP)
			}
			t.Logf("pod1 -> %s -> pod1 seen from %s", svc.Spec.ClusterIP, seen["pod1"])
		}
	})

	t.Run("Local policy keeps the client IP and drops without local endpoints", func(t *testing.T) {
		svc := create("local", both, teamB, env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalLocal())
		if _, err := e.SetLoadBalancerIngress(ctx, ns, "local", lbIPLocal); err != nil {
			t.Fatal(err)
		}
		np := nodePort(svc, corev1.ProtocolTCP)
		for _, addr := range []struct {
			ip   string
			port int
		}{{netns.NodeIPv4, np}, {lbIPLocal, 80}} {
			seen := reach(t, e, e.TP.Client, "tcp", addr.ip, addr.port, "pod1")
			if seen["pod1"] != netns.ClientIPv4 {
				t.Errorf("Local policy via %s:%d: pod1 saw %s, want the client %s", addr.ip, addr.port, seen["pod1"], netns.ClientIPv4)
			}
		}
		// Internal traffic still uses every endpoint.
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1", "remote")

		// Only a remote endpoint left: external traffic is dropped, a pod going to the LB
		// IP is short-circuited to the cluster endpoints.
		if err := e.SetEndpoints(ctx, ns, "local", ports, []env.Backend{env.Remotev4}); err != nil {
			t.Fatal(err)
		}
		fails(t, e, e.TP.Client, "tcp", netns.NodeIPv4, np, "NodePort dropped without local endpoints", timedOut)
		fails(t, e, e.TP.Client, "tcp", lbIPLocal, 80, "LB IP dropped without local endpoints", timedOut)
		reach(t, e, e.TP.Pod2, "tcp", lbIPLocal, 80, "remote")
		t.Logf("Local: client IP %s kept; with no local endpoint NodePort and LB drop, pod->LB IP short-circuits to remote", netns.ClientIPv4)
	})

	t.Run("no endpoints is refused everywhere", func(t *testing.T) {
		svc := create("empty", nil, teamB, env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalIPs("192.168.201.11"))
		if _, err := e.SetLoadBalancerIngress(ctx, ns, "empty", "192.168.200.13"); err != nil {
			t.Fatal(err)
		}
		fails(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "ClusterIP refused", refused)
		fails(t, e, e.TP.Pod2, "udp", svc.Spec.ClusterIP, 53, "UDP ClusterIP refused", refused)
		fails(t, e, e.TP.Node, "tcp", svc.Spec.ClusterIP, 80, "ClusterIP from the host refused", refused)
		fails(t, e, e.TP.Client, "tcp", netns.NodeIPv4, nodePort(svc, corev1.ProtocolTCP), "NodePort refused", refused)
		fails(t, e, e.TP.Client, "tcp", "192.168.200.13", 80, "LB IP refused", refused)
		fails(t, e, e.TP.Client, "tcp", "192.168.201.11", 80, "external IP refused", refused)
		// Endpoints arrive: served.
		if err := e.SetEndpoints(ctx, ns, "empty", ports, []env.Backend{env.Pod1v4}); err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1")
		reach(t, e, e.TP.Pod2, "udp", svc.Spec.ClusterIP, 53, "pod1")
	})
}

// TestIPv6 runs the main paths over IPv6 through the ip6 tables.
func TestIPv6(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns = "ipv6"
	servers(t, e, 8101, "tcp", "udp")
	ports := []env.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8101},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: 8101},
	}
	for _, inst := range []string{"team-a", "team-b"} {
		t.Run(inst, func(t *testing.T) {
			svc, err := e.CreateService(ctx, ns, "dual-"+inst, ports,
				[]env.Backend{env.Pod1v4, env.Remotev4, env.Pod1v6, env.Remotev6},
				env.WithProxyName(inst), env.WithDualStack(), env.WithType(corev1.ServiceTypeNodePort))
			if err != nil {
				t.Fatal(err)
			}
			if len(svc.Spec.ClusterIPs) != 2 {
				t.Fatalf("want two cluster IPs, got %v", svc.Spec.ClusterIPs)
			}
			v6 := svc.Spec.ClusterIPs[1]
			var np, npUDP int
			for _, p := range svc.Spec.Ports {
				if p.Protocol == corev1.ProtocolTCP {
					np = int(p.NodePort)
				} else {
					npUDP = int(p.NodePort)
				}
			}
			seen := reach(t, e, e.TP.Pod2, "tcp", v6, 80, "pod1", "remote")
			if seen["pod1"] != netns.Pod2IPv6 {
				t.Errorf("pod1 saw %s, want pod2's address %s", seen["pod1"], netns.Pod2IPv6)
			}
			reach(t, e, e.TP.Pod2, "udp", v6, 53, "pod1", "remote")
			reach(t, e, e.TP.Node, "tcp", v6, 80, "pod1", "remote")
			reach(t, e, e.TP.Client, "tcp", netns.NodeIPv6, np, "pod1", "remote")
			reach(t, e, e.TP.Client, "udp", netns.NodeIPv6, npUDP, "pod1", "remote")
			reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIPs[0], 80, "pod1", "remote")
			fails(t, e, e.TP.Pod2, "tcp", v6, 81, "undefined port refused", refused)

			if err := e.SetEndpoints(ctx, ns, "dual-"+inst, ports, []env.Backend{env.Pod1v4}); err != nil {
				t.Fatal(err)
			}
			fails(t, e, e.TP.Pod2, "tcp", v6, 80, "no IPv6 endpoints refused", refused)
			reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIPs[0], 80, "pod1")
			t.Logf("%s: [%s]:80 from pod and host, [%s]:%d from outside, TCP and UDP", inst, v6, netns.NodeIPv6, np)
		})
	}
}
