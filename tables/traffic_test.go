package tables

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/netns"
)

// trafficNode loads instances into the node namespace of a fresh topology.
type trafficNode struct {
	tp  *netns.Topology
	fam Family
}

func (n *trafficNode) a(v4, v6 string) netip.Addr {
	if n.fam == IPv6 {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

func (n *trafficNode) load(t *testing.T, instance string, slot int, svcs map[ServiceName][]*ServicePort) *Syncer {
	t.Helper()
	cfg := Config{
		Family: n.fam, TablePrefix: "shardproxy", Instance: instance, Slot: slot, MasqueradeBit: 14,
		Local:       LocalTraffic{Mode: LocalClusterCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix(netns.ClusterPodCIDRv4), netip.MustParsePrefix(netns.ClusterPodCIDRv6)}},
		NodePortIPs: []netip.Addr{netip.MustParseAddr(netns.NodeIPv4), netip.MustParseAddr(netns.NodeIPv6)},
		NodeIPs:     []netip.Addr{netip.MustParseAddr(netns.NodeIPv4), netip.MustParseAddr(netns.NodeIPv6)},
		// Every mode goes through these nodes.
		ConsistentHash: true,
	}
	s := kernelSyncer(t, n.tp.Node, cfg)
	if _, err := s.Full(context.Background(), svcs); err != nil {
		t.Fatalf("loading instance %s: %v", instance, err)
	}
	return s
}

// reach dials until every wanted server answered (random choice), failing on anything else.
func reach(t *testing.T, tp *netns.Topology, from, proto string, dst netip.Addr, port int, want map[string]string) {
	t.Helper()
	seen := map[string]bool{}
	for i := 0; i < 60 && len(seen) < len(want); i++ {
		r, err := tp.Dial(from, proto, dst.String(), port)
		if err != nil {
			t.Fatalf("%s %s -> %s:%d: %v", from, proto, dst, port, err)
		}
		wantSrc, ok := want[r.Server]
		if !ok {
			t.Fatalf("%s -> %s:%d answered by unexpected %q", from, dst, port, r.Server)
		}
		if wantSrc != "" && r.Source != wantSrc {
			t.Errorf("%s -> %s:%d: %s saw source %s, want %s", from, dst, port, r.Server, r.Source, wantSrc)
		}
		seen[r.Server] = true
	}
	if len(seen) < len(want) {
		t.Errorf("%s %s -> %s:%d reached only %v of %v", from, proto, dst, port, seen, want)
	}
}

// sameServer dials several times from one client and wants every answer from the same
// one of servers (a hash mode), whichever it is.
func sameServer(t *testing.T, tp *netns.Topology, from, proto string, dst netip.Addr, port int, servers ...string) {
	t.Helper()
	first := ""
	for i := 0; i < 8; i++ {
		r, err := tp.Dial(from, proto, dst.String(), port)
		if err != nil {
			t.Fatalf("%s %s -> %s:%d: %v", from, proto, dst, port, err)
		}
		if !slices.Contains(servers, r.Server) {
			t.Fatalf("%s -> %s:%d answered by unexpected %q", from, dst, port, r.Server)
		}
		if first == "" {
			first = r.Server
		} else if r.Server != first {
			t.Fatalf("%s -> %s:%d: connection %d reached %s after %s", from, dst, port, i, r.Server, first)
		}
	}
}

func refused(t *testing.T, tp *netns.Topology, from, proto string, dst netip.Addr, port int) {
	t.Helper()
	r, err := tp.Dial(from, proto, dst.String(), port)
	if !netns.IsRefused(err) {
		t.Errorf("%s %s -> %s:%d: want refused, got reply %+v, err %v", from, proto, dst, port, r, err)
	}
}

// TestTrafficThroughRealKernel sends real TCP and UDP through the generated rules:
// client, pods, a node and a second node each in their own network namespace.
func TestTrafficThroughRealKernel(t *testing.T) {
	requireRoot(t)
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			tp := netns.New(t)
			n := &trafficNode{tp: tp, fam: fam}
			for _, proto := range []string{"tcp", "udp"} {
				tp.StartServer(tp.Pod1, "pod1", proto, 8080)
				tp.StartServer(tp.Remote, "remote", proto, 8080)
			}
			pod1 := Endpoint{IP: n.a(netns.Pod1IPv4, netns.Pod1IPv6), Port: 8080}
			remote := Endpoint{IP: n.a(netns.RemoteIPv4, netns.RemoteIPv6), Port: 8080}
			cip := func(last string) netip.Addr { return n.a("172.31.0."+last, "fd00:31::"+last) }
			mk := func(name, last string, proto Protocol, eps []Endpoint, local []Endpoint, nodePort uint16) *ServicePort {
				return &ServicePort{
					Name:     ServicePortName{Namespace: "ns", Name: name, Port: string(proto)},
					Protocol: proto, Port: 80, NodePort: nodePort, ClusterIP: cip(last),
					ClusterEndpoints: eps, LocalEndpoints: local, HasEndpoints: len(eps) > 0,
				}
			}
			teamA := services(
				mk("web", "10", TCP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 30080),
				mk("web", "10", UDP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 30080),
				mk("empty", "11", TCP, nil, nil, 30081),
				mk("empty", "11", UDP, nil, nil, 30081),
			)
			sticky := mk("sticky", "12", TCP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 0)
			sticky.AffinityTimeout = 600e9
			local := mk("local", "13", TCP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 30083)
			local.ExternalLocal = true
			local.LoadBalancerIPs = []netip.Addr{n.a("192.168.201.13", "fd00:201::13")}
			local.SourceRanges = []netip.Prefix{netip.MustParsePrefix(netns.ClientCIDRv4), netip.MustParsePrefix(netns.ClientCIDRv6)}
			denied := mk("denied", "14", TCP, []Endpoint{pod1}, []Endpoint{pod1}, 0)
			denied.LoadBalancerIPs = []netip.Addr{n.a("192.168.201.14", "fd00:201::14")}
			denied.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/64")}
			// narrowed's source ranges shrink to exclude the client mid-test.
			narrowed := mk("narrowed", "15", UDP, []Endpoint{pod1}, []Endpoint{pod1}, 0)
			narrowed.LoadBalancerIPs = []netip.Addr{n.a("192.168.201.15", "fd00:201::15")}
			narrowed.SourceRanges = []netip.Prefix{netip.MustParsePrefix(netns.ClientCIDRv4), netip.MustParsePrefix(netns.ClientCIDRv6)}
			// hashed and hashedLocal are consistentHash: their NodePort and LB entries pick
			// through the cluster IP's table, rewriting the destination first.
			hashed := mk("hashed", "16", TCP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 30086)
			hashedUDP := mk("hashed", "16", UDP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 30086)
			hashedLocal := mk("hashed-local", "17", TCP, []Endpoint{pod1, remote}, []Endpoint{pod1}, 30087)
			hashedLocal.ExternalLocal = true
			hashedLocal.LoadBalancerIPs = []netip.Addr{n.a("192.168.201.17", "fd00:201::17")}
			for _, p := range []*ServicePort{hashed, hashedUDP, hashedLocal} {
				p.LoadBalancing = LBConsistentHash
			}
			teamA[ServiceName{Namespace: "ns", Name: "hashed"}] = []*ServicePort{hashed, hashedUDP}
			for _, p := range []*ServicePort{sticky, local, denied, narrowed, hashedLocal} {
				teamA[ServiceName{Namespace: "ns", Name: p.Name.Name}] = []*ServicePort{p}
			}
			teamB := services(mk("other", "20", TCP, []Endpoint{remote}, nil, 30090))
			syncerA := n.load(t, "team-a", 0, teamA)
			n.load(t, "team-b", 1, teamB)

			nodeIP := n.a(netns.NodeIPv4, netns.NodeIPv6)
			pod2 := n.a(netns.Pod2IPv4, netns.Pod2IPv6).String()
			// Masquerading picks the address of the interface the packet leaves on.
			masqToPod1 := n.a(netns.PodGatewayIPv4, netns.PodGatewayIPv6).String()
			masqToRemote := n.a(netns.NodeClusterIPv4, netns.NodeClusterIPv6).String()

			for _, proto := range []string{"tcp", "udp"} {
				t.Run(proto+" cluster IP from a pod reaches both endpoints with the pod's IP", func(t *testing.T) {
					reach(t, tp, tp.Pod2, proto, cip("10"), 80, map[string]string{"pod1": pod2, "remote": pod2})
				})
				t.Run(proto+" NodePort from outside reaches both endpoints, masqueraded", func(t *testing.T) {
					reach(t, tp, tp.Client, proto, nodeIP, 30080, map[string]string{"pod1": masqToPod1, "remote": masqToRemote})
				})
				t.Run(proto+" Service without endpoints refuses", func(t *testing.T) {
					refused(t, tp, tp.Pod2, proto, cip("11"), 80)
					refused(t, tp, tp.Client, proto, nodeIP, 30081)
				})
			}
			for _, proto := range []string{"tcp", "udp"} {
				t.Run(proto+" consistentHash NodePort from outside: one endpoint, through the cluster IP's table", func(t *testing.T) {
					sameServer(t, tp, tp.Client, proto, nodeIP, 30086, "pod1", "remote")
				})
			}
			t.Run("consistentHash Local-policy LB IP from a local pod short-circuits to all endpoints", func(t *testing.T) {
				sameServer(t, tp, tp.Pod2, "tcp", hashedLocal.LoadBalancerIPs[0], 80, "pod1", "remote")
			})
			t.Run("undefined port of a cluster IP refuses", func(t *testing.T) {
				refused(t, tp, tp.Pod2, "tcp", cip("10"), 81)
			})
			t.Run("hairpin: a pod reaching itself is masqueraded", func(t *testing.T) {
				for i := 0; i < 40; i++ {
					r, err := tp.Dial(tp.Pod1, "tcp", cip("10").String(), 80)
					if err != nil {
						t.Fatal(err)
					}
					if r.Server == "pod1" {
						if r.Source != masqToPod1 {
							t.Errorf("hairpin connection seen from %s, want masqueraded to %s", r.Source, masqToPod1)
						}
						return
					}
				}
				t.Error("pod1 never reached itself")
			})
			t.Run("ClientIP affinity sticks to one endpoint", func(t *testing.T) {
				first := ""
				for i := 0; i < 20; i++ {
					r, err := tp.Dial(tp.Pod2, "tcp", cip("12").String(), 80)
					if err != nil {
						t.Fatal(err)
					}
					if first == "" {
						first = r.Server
					} else if r.Server != first {
						t.Fatalf("connection %d went to %s after %s: affinity broken", i, r.Server, first)
					}
				}
			})
			t.Run("Local policy: LB IP from outside keeps the client IP and stays local", func(t *testing.T) {
				client := n.a(netns.ClientIPv4, netns.ClientIPv6).String()
				for i := 0; i < 10; i++ {
					r, err := tp.Dial(tp.Client, "tcp", n.a("192.168.201.13", "fd00:201::13").String(), 80)
					if err != nil {
						t.Fatal(err)
					}
					if r.Server != "pod1" || r.Source != client {
						t.Fatalf("got %+v, want pod1 seeing %s", r, client)
					}
				}
				reach(t, tp, tp.Client, "tcp", nodeIP, 30083, map[string]string{"pod1": n.a(netns.ClientIPv4, netns.ClientIPv6).String()})
			})
			t.Run("LoadBalancerSourceRanges drops sources outside the ranges", func(t *testing.T) {
				_, err := tp.Dial(tp.Client, "tcp", n.a("192.168.201.14", "fd00:201::14").String(), 80)
				if !netns.IsTimeout(err) {
					t.Errorf("want the connection dropped (timeout), got %v", err)
				}
			})
			t.Run("second instance serves its own Service", func(t *testing.T) {
				reach(t, tp, tp.Pod2, "tcp", cip("20"), 80, map[string]string{"remote": pod2})
				reach(t, tp, tp.Client, "tcp", nodeIP, 30090, map[string]string{"remote": masqToRemote})
			})
			t.Run("narrowing source ranges keeps established connections and drops new ones", func(t *testing.T) {
				lbIP := narrowed.LoadBalancerIPs[0].String()
				const srcPort = 40115 // one UDP flow: every request shares its conntrack entry
				if r, err := tp.DialFrom(tp.Client, "udp", lbIP, 80, srcPort); err != nil || r.Server != "pod1" {
					t.Fatalf("before narrowing: got %+v, %v; want pod1", r, err)
				}
				p := *narrowed
				p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/64")}
				if _, err := syncerA.Partial(context.Background(), map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "narrowed"}: {&p}}); err != nil {
					t.Fatal(err)
				}
				if r, err := tp.DialFrom(tp.Client, "udp", lbIP, 80, srcPort); err != nil || r.Server != "pod1" {
					t.Errorf("established flow after narrowing: got %+v, %v; want pod1 still answering", r, err)
				}
				if _, err := tp.Dial(tp.Client, "udp", lbIP, 80); !netns.IsTimeout(err) {
					t.Errorf("new flow after narrowing: want it dropped (timeout), got %v", err)
				}
			})
			t.Run("each instance's table holds only its own Services", func(t *testing.T) {
				fam := string(familyName(fam))
				a := nftIn(t, tp.Node, "list", "table", fam, "shardproxy-team-a")
				b := nftIn(t, tp.Node, "list", "table", fam, "shardproxy-team-b")
				if strings.Contains(a, cip("20").String()+" ") || !strings.Contains(a, cip("10").String()) {
					t.Errorf("team-a's table is wrong:\n%s", a)
				}
				if strings.Contains(b, cip("10").String()+" ") || !strings.Contains(b, cip("20").String()) {
					t.Errorf("team-b's table is wrong:\n%s", b)
				}
				if !strings.Contains(a, "type nat hook prerouting priority -67;") || !strings.Contains(b, "type nat hook prerouting priority -66;") {
					t.Errorf("instances must hook DNAT at their slots' priorities:\n%s\n%s", a, b)
				}
			})
		})
	}
}
