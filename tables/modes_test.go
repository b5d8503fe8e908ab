package tables

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables/tracer"
)

// modePod and modeRemote are the endpoints of modePort: one on this node, one not.
var modePod, modeRemote = ep("10.244.1.2", 8080), ep("10.244.2.2", 8080)

// modePort is a NodePort Service port in mode m with modePod and modeRemote.
func modePort(m LBMode) *ServicePort {
	return sp("web", 80, withEndpoints([]Endpoint{modePod, modeRemote}, []Endpoint{modePod}), func(p *ServicePort) {
		p.LoadBalancing = m
		p.NodePort = 30080
	})
}

// TestGoldenModes pins the rule shapes of each load-balancing mode (tables/README.md,
// "Load-balancing modes").
func TestGoldenModes(t *testing.T) {
	clusterIP := `
		set cluster-ips 172.30.0.10
		set external-masq 192.168.100.1 . tcp . 30080
		set hairpin 10.244.1.2 . 10.244.1.2
		set hairpin 10.244.2.2 . 10.244.2.2
		map endpoints-tcp 172.30.0.10 . 80 . 0 : 10.244.1.2 . 8080
		map endpoints-tcp 172.30.0.10 . 80 . 1 : 10.244.2.2 . 8080`
	common := clusterIP + `
		map endpoints-tcp 192.168.100.1 . 30080 . 0 : 10.244.1.2 . 8080
		map endpoints-tcp 192.168.100.1 . 30080 . 1 : 10.244.2.2 . 8080`
	rrPort := modePort(LBRoundRobin)
	bucket := strconv.Itoa(bucketOf(entry{rrPort.ClusterIP, TCP, 80}))
	cases := []struct {
		name string
		port *ServicePort
		want string
	}{
		{
			name: "roundRobin: one counter per Service port in its bucket chain, shared by its entries through the cluster IP's, picking shared pick-at chains",
			port: rrPort,
			want: clusterIP + `
				map service-ips 172.30.0.10 . tcp . 80 : goto rr-bucket-B
				map service-ips 192.168.100.1 . tcp . 30080 : goto pick-rr-cip-B
				map cluster-ip-of 192.168.100.1 . tcp . 30080 : 172.30.0.10
				map cluster-port-of 192.168.100.1 . tcp . 30080 : 80
				chain rr-bucket-B
				chain rr-bucket-B ip daddr 172.30.0.10 tcp dport 80 numgen inc mod 2 vmap @round-robin-picks
				chain pick-rr-cip-B
				chain pick-rr-cip-B meta l4proto tcp ip daddr set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-ip-of tcp dport set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-port-of goto rr-bucket-B
				chain pick-rr-cip-B meta l4proto udp ip daddr set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-ip-of udp dport set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-port-of goto rr-bucket-B
				chain pick-rr-cip-B meta l4proto sctp ip daddr set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-ip-of sctp dport set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-port-of goto rr-bucket-B
				map round-robin-picks 0 : goto pick-at-0
				map round-robin-picks 1 : goto pick-at-1
				chain pick-at-0
				chain pick-at-0 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 1 offset 0 map @endpoints-tcp
				chain pick-at-0 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 1 offset 0 map @endpoints-udp
				chain pick-at-0 meta l4proto sctp dnat ip to ip daddr . sctp dport . numgen random mod 1 offset 0 map @endpoints-sctp
				chain pick-at-1
				chain pick-at-1 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 1 offset 1 map @endpoints-tcp
				chain pick-at-1 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 1 offset 1 map @endpoints-udp
				chain pick-at-1 meta l4proto sctp dnat ip to ip daddr . sctp dport . numgen random mod 1 offset 1 map @endpoints-sctp`,
		},
		{
			name: "sourceHash: shared pick chains over a hash of the client address",
			port: modePort(LBSourceHash),
			want: common + `
				map service-ips 172.30.0.10 . tcp . 80 : goto pick-sh-2
				map service-ips 192.168.100.1 . tcp . 30080 : goto pick-sh-2
				chain pick-sh-2
				chain pick-sh-2 meta l4proto tcp dnat ip to ip daddr . tcp dport . jhash ip saddr mod 2 seed 0x1f2e3d4c map @endpoints-tcp
				chain pick-sh-2 meta l4proto udp dnat ip to ip daddr . udp dport . jhash ip saddr mod 2 seed 0x1f2e3d4c map @endpoints-udp
				chain pick-sh-2 meta l4proto sctp dnat ip to ip daddr . sctp dport . jhash ip saddr mod 2 seed 0x1f2e3d4c map @endpoints-sctp`,
		},
		{
			name: "consistentHash with one endpoint: a table of one slot",
			port: sp("one", 80, withEndpoints([]Endpoint{modeRemote}, nil), func(p *ServicePort) { p.LoadBalancing = LBConsistentHash }),
			want: `
				set cluster-ips 172.30.0.10
				set hairpin 10.244.2.2 . 10.244.2.2
				map endpoints-tcp 172.30.0.10 . 80 . 0 : 10.244.2.2 . 8080
				map service-ips 172.30.0.10 . tcp . 80 : goto pick-ch-1
				chain pick-ch-1
				chain pick-ch-1 meta l4proto tcp dnat ip to ip daddr . tcp dport . jhash ip saddr mod 1 seed 0x1f2e3d4c map @endpoints-tcp
				chain pick-ch-1 meta l4proto udp dnat ip to ip daddr . udp dport . jhash ip saddr mod 1 seed 0x1f2e3d4c map @endpoints-udp
				chain pick-ch-1 meta l4proto sctp dnat ip to ip daddr . sctp dport . jhash ip saddr mod 1 seed 0x1f2e3d4c map @endpoints-sctp`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, fake := newFake(t, testConfig(IPv4))
			fullSync(t, s, services(tc.port))
			want := golden(strings.ReplaceAll(tc.want, "-B", "-"+bucket))
			if diff := cmp.Diff(want, contentDump(fake)); diff != "" {
				t.Errorf("content (-want +got):\n%s", diff)
			}
		})
	}

}

// TestGoldenConsistentHashSharedTable: the cluster IP entry holds the port's table in
// ch-slots, and the NodePort shares it through pick-ch-cip-256.
func TestGoldenConsistentHashSharedTable(t *testing.T) {
	s, fake := newFake(t, testConfig(IPv4))
	fullSync(t, s, services(modePort(LBConsistentHash)))
	table := consistentTable([]Endpoint{modePod, modeRemote})
	var want []string
	for slot, e := range table {
		want = append(want, fmt.Sprintf("%d . 172.30.0.10 . tcp . 80 : %s . 8080", slot, []Endpoint{modePod, modeRemote}[e].IP))
	}
	if diff := cmp.Diff(golden(strings.Join(want, "\n")), golden(dumpElements(fake, mapConsistentSlots))); diff != "" {
		t.Errorf("ch-slots (-want +got):\n%s", diff)
	}
	if got := dumpElements(fake, "endpoints-tcp"); got != "" {
		t.Errorf("endpoints-tcp holds %q; want nothing (the table is in ch-slots)", got)
	}
	if diff := cmp.Diff(golden(`
		map cluster-ip-of 192.168.100.1 . tcp . 30080 : 172.30.0.10
		map cluster-port-of 192.168.100.1 . tcp . 30080 : 80
		map service-ips 172.30.0.10 . tcp . 80 : goto pick-ch-256
		map service-ips 192.168.100.1 . tcp . 30080 : goto pick-ch-cip-256`),
		golden(mapLines(fake, "cluster-ip-of", "cluster-port-of", "service-ips"))); diff != "" {
		t.Errorf("dispatch (-want +got):\n%s", diff)
	}
	dispatch := make([]string, rotations)
	for k := range dispatch {
		dispatch[k] = fmt.Sprintf("%d : goto ch-rotation-%d", k, k)
	}
	want = []string{"jhash ip saddr & 255.255.255.0 mod 128 seed 0x1f2e3d4c vmap { " + strings.Join(dispatch, " , ") + " }"}
	if diff := cmp.Diff(want, chainRules(fake, "pick-ch-256")); diff != "" {
		t.Errorf("pick-ch-256 rules (-want +got):\n%s", diff)
	}
	want = nil
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		want = append(want, "meta l4proto "+proto+" ip daddr set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-ip-of "+
			proto+" dport set ct original ip daddr . meta l4proto . ct original proto-dst map @cluster-port-of goto pick-ch-256")
	}
	if diff := cmp.Diff(want, chainRules(fake, "pick-ch-cip-256")); diff != "" {
		t.Errorf("pick-ch-cip-256 rules (-want +got):\n%s", diff)
	}
}

// TestGoldenConsistentHashManyEndpoints: over more than 256 endpoints consistentHash takes
// jhash of the whole address over endpoints-<proto>.
func TestGoldenConsistentHashManyEndpoints(t *testing.T) {
	var eps []Endpoint
	for i := range 300 {
		eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", 1+i/200, 2+i%200), 8080))
	}
	s, fake := newFake(t, testConfig(IPv4))
	fullSync(t, s, services(sp("big", 80, withEndpoints(eps, nil), func(p *ServicePort) {
		p.LoadBalancing = LBConsistentHash
		p.NodePort = 30080
	})))
	if got := strings.Count(dumpElements(fake, "endpoints-tcp"), "\n") + 1; got != 512 {
		t.Errorf("endpoints-tcp holds %d elements; want the 512 slots of the cluster IP's table", got)
	}
	if got := chainRules(fake, "pick-ch-512"); len(got) != 3 || !strings.Contains(got[0], "jhash ip saddr mod 512 seed 0x1f2e3d4c map @endpoints-tcp") {
		t.Errorf("pick-ch-512 rules: %q", got)
	}
	if got := chainRules(fake, "pick-ch-cip-512"); len(got) != 3 || !strings.HasSuffix(got[0], "goto pick-ch-512") {
		t.Errorf("pick-ch-cip-512 rules: %q", got)
	}
}

// TestGoldenAffinityBeforeMode: ClientIP affinity comes first, then the mode places new
// clients.
func TestGoldenAffinityBeforeMode(t *testing.T) {
	for _, m := range []LBMode{LBRoundRobin, LBSourceHash, LBConsistentHash} {
		t.Run("ClientIP affinity first, then "+string(m)+" for new clients", func(t *testing.T) {
			p := modePort(m)
			p.AffinityTimeout = 300 * time.Second
			s, fake := newFake(t, testConfig(IPv4))
			fullSync(t, s, services(p))
			bucket := affinityBucketChain(bucketOf(entry{p.ClusterIP, TCP, 80}))
			var rules []string
			for _, r := range chainRules(fake, bucket) {
				rule, ok := strings.CutPrefix(r, "ip daddr 172.30.0.10 tcp dport 80 ")
				if !ok {
					t.Errorf("bucket rule %q does not start with the port's match", r)
				}
				rules = append(rules, rule)
			}
			// Two rules for remembered clients, then one per endpoint for new ones.
			if len(rules) != 4 {
				t.Fatalf("affinity chain rules: %q", rules)
			}
			wantStarts := map[LBMode][2]string{
				LBRoundRobin:     {pickExpr(m, "ip", 2) + " 0 meta", "meta"},
				LBSourceHash:     {pickExpr(m, "ip", 2) + " 0 meta", pickExpr(m, "ip", 2) + " 1 meta"},
				LBConsistentHash: {pickExpr(m, "ip", ConsistentTableSlots) + " { ", pickExpr(m, "ip", ConsistentTableSlots) + " { "},
			}[m]
			for i, want := range wantStarts {
				if !strings.HasPrefix(rules[2+i], want) {
					t.Errorf("new clients' rule %d is %q; want it to start with %q", i, rules[2+i], want)
				}
			}
			if m == LBConsistentHash {
				if n := strings.Count(rules[2], ",") + strings.Count(rules[3], ",") + 2; n != ConsistentTableSlots {
					t.Errorf("the new clients' rules hold %d slots, want %d", n, ConsistentTableSlots)
				}
			}
			// Internal and external traffic have the same endpoints (Cluster policies):
			// the bucket serves both, the NodePort through pick-aff-cip-<b>.
			via := pickViaAffinityChain(bucketOf(entry{p.ClusterIP, TCP, 80}))
			for name := range fake.Table.Chains {
				if strings.HasPrefix(name, roundRobinPrefix) || strings.HasPrefix(name, pickPrefix) && name != via ||
					strings.HasPrefix(name, affinityPrefix) && name != bucket {
					t.Errorf("affinity port got chain %s besides its bucket and %s", name, via)
				}
			}
		})
	}
}

// TestRoundRobinBindsEndpointMapsOnce: roundRobin's per-port rules must not bind the
// endpoint maps, since the kernel walks every element of a map for each rule that binds
// it: at 10,000 Services that made full syncs take minutes and soft-locked the CPU
// (issue 14). The rules that look the maps up are the shared pick-at chains', as many
// as the largest endpoint count, however many Service ports there are. Nor may they hold
// anonymous sets: each is a set of the table, and the kernel finds a set by name by
// walking the table's sets (a 20,000-set table soft-locked it too).
func TestRoundRobinBindsEndpointMapsOnce(t *testing.T) {
	binding := func(ports int) (rules, bindings int) {
		var svcs []*ServicePort
		for i := range ports {
			eps := []Endpoint{ep("10.244.1.2", 8080), ep("10.244.2.2", 8080), ep("10.244.3.2", 8080)}
			svcs = append(svcs, sp(fmt.Sprintf("web%d", i), 80, withEndpoints(eps, eps[:1]), func(p *ServicePort) {
				p.LoadBalancing = LBRoundRobin
				p.ClusterIP = netip.AddrFrom4([4]byte{172, 30, 1, byte(i)})
				p.NodePort = 30000 + uint16(i)
				p.ExternalLocal = true
			}))
		}
		s, fake := newFake(t, testConfig(IPv4))
		fullSync(t, s, services(svcs...))
		return countMapRules(fake)
	}
	rules1, bind1 := binding(1)
	rules20, bind20 := binding(20)
	if rules20 <= rules1 {
		t.Fatalf("20 ports wrote %d dynamic rules, 1 port %d: the per-port chains are missing", rules20, rules1)
	}
	if bind1 != bind20 || bind1 == 0 {
		t.Errorf("rules binding an endpoint map: %d with 1 port, %d with 20; want the same, nonzero", bind1, bind20)
	}
}

// countMapRules counts the rules of the dynamic chains in fake, and those among them
// that use a named endpoint map or an anonymous set.
func countMapRules(fake *knftables.Fake) (rules, bindings int) {
	for name, ch := range fake.Table.Chains {
		if !isDynamicChain(name) {
			continue
		}
		for _, r := range ch.Rules {
			rules++
			if strings.Contains(r.Rule, "@"+mapEndpoints) || strings.Contains(r.Rule, "@"+mapClusterEndpoints) ||
				strings.Contains(r.Rule, "{") {
				bindings++
			}
		}
	}
	return rules, bindings
}

// modePackets are new connections to every entry of every feature Service, from
// several local pods, outside clients and the node.
func modePackets(fam Family, svcs map[ServiceName][]*ServicePort) []tracer.Packet {
	v4 := fam == IPv4
	a := func(f4, f6 string, i int) netip.Addr {
		if v4 {
			return netip.MustParseAddr(fmt.Sprintf(f4, i))
		}
		return netip.MustParseAddr(fmt.Sprintf(f6, i))
	}
	node := nodeIP4
	if !v4 {
		node = nodeIP6
	}
	var out []tracer.Packet
	for _, ports := range svcs {
		for _, p := range ports {
			type dst struct {
				addr netip.Addr
				port uint16
			}
			dsts := []dst{{p.ClusterIP, p.Port}}
			for _, x := range append(slices.Clone(p.ExternalIPs), p.LoadBalancerIPs...) {
				dsts = append(dsts, dst{x, p.Port})
			}
			if p.NodePort != 0 {
				dsts = append(dsts, dst{node, p.NodePort})
			}
			proto := string(p.Protocol)
			for _, d := range dsts {
				for i := 2; i < 34; i++ {
					out = append(out,
						tracer.Packet{Origin: tracer.FromOutside, Src: a("192.168.100.%d", "fd00:100::%x", i), IIF: "eth0", Proto: proto, Dst: d.addr, Port: d.port},
						tracer.Packet{Origin: tracer.FromPod, Src: a("10.244.1.%d", "fd00:10:244:1::%x", i+1), IIF: "vpod1", Proto: proto, Dst: d.addr, Port: d.port})
				}
				out = append(out, tracer.Packet{Origin: tracer.FromHost, Src: node, Proto: proto, Dst: d.addr, Port: d.port})
			}
		}
	}
	return out
}

// TestModesMatchRandom: every mode treats traffic policies, topology, terminating
// fallback, firewalls, masquerading and missing endpoints exactly as random does; only
// the choice among the endpoints differs. Round robin may reach the same endpoints
// as random; a hash mode reaches exactly one of them per client, the same one every
// time, and all of them over the clients.
func TestModesMatchRandom(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		for _, m := range []LBMode{LBRoundRobin, LBSourceHash, LBConsistentHash} {
			t.Run(fam.String()+" "+string(m), func(t *testing.T) {
				random := featureServices(fam)
				s, fake := newFake(t, testConfig(fam))
				fullSync(t, s, random)
				ref := newTracer(t, fake)

				moded := featureServices(fam)
				for _, ports := range moded {
					for _, p := range ports {
						p.LoadBalancing = m
					}
				}
				s2, fake2 := newFake(t, testConfig(fam))
				fullSync(t, s2, moded)
				tr := newTracer(t, fake2)

				// Per destination: the outcomes over every source, for the hash modes.
				type dest struct {
					origin tracer.Origin
					proto  string
					dst    netip.Addr
					port   uint16
				}
				union := map[dest]map[string]bool{}
				all := map[dest]map[string]bool{}
				for _, p := range modePackets(fam, random) {
					want, got := outcomes(t, ref, p), outcomes(t, tr, p)
					if m == LBRoundRobin {
						if !slices.Equal(want, got) {
							t.Errorf("%+v: %s gives %q, random %q", p, m, got, want)
						}
						continue
					}
					// Random's only choice is the endpoint: a hash mode makes it.
					if len(got) != 1 {
						t.Errorf("%+v: %s gives %q; want exactly one of random's %q", p, m, got, want)
					}
					if again := outcomes(t, tr, p); !slices.Equal(again, got) {
						t.Errorf("%+v: %s gives %q, then %q", p, m, got, again)
					}
					for _, o := range got {
						if !slices.Contains(want, o) {
							t.Errorf("%+v: %s gives %q, which random never does (%q)", p, m, o, want)
						}
					}
					d := dest{p.Origin, p.Proto, p.Dst, p.Port}
					if union[d] == nil {
						union[d], all[d] = map[string]bool{}, map[string]bool{}
					}
					for _, o := range got {
						union[d][o] = true
					}
					for _, o := range want {
						all[d][o] = true
					}
				}
				for d, seen := range union {
					if d.origin == tracer.FromHost {
						continue // one source only
					}
					if len(seen) != len(all[d]) {
						t.Errorf("%+v: %d clients reach %v under %s; random reaches %v", d, 32, seen, m, all[d])
					}
				}
			})
		}
	}
}

// mapLines is the elements of the maps names, each as "map <name> <key> : <value>".
func mapLines(fake *knftables.Fake, names ...string) string {
	var lines []string
	for _, name := range names {
		for _, l := range strings.Split(dumpElements(fake, name), "\n") {
			if l != "" {
				lines = append(lines, "map "+name+" "+l)
			}
		}
	}
	return strings.Join(lines, "\n")
}

// TestRoundRobinBuckets: roundRobin ports write their rules into at most
// bucketCount shared chains, not a chain each (the kernel walks every chain on each
// commit), and a partial sync keeps each bucket exactly as a full sync of the same
// Services writes it: a port's rule changes with its endpoint count, leaves with the
// port, and an emptied bucket goes away with its pick-rr-cip chain.
func TestRoundRobinBuckets(t *testing.T) {
	rrNodePort := func(name string, cip netip.Addr, nodePort uint16, eps []Endpoint) *ServicePort {
		return sp(name, 80, withEndpoints(eps, nil), func(p *ServicePort) {
			p.LoadBalancing, p.ClusterIP, p.NodePort = LBRoundRobin, cip, nodePort
		})
	}
	eps := []Endpoint{ep("10.244.1.2", 8080), ep("10.244.2.2", 8080), ep("10.244.3.2", 8080)}

	t.Run("chains do not grow with the ports", func(t *testing.T) {
		var ports []*ServicePort
		for i := range 1000 {
			ports = append(ports, rrNodePort(fmt.Sprintf("web%d", i), netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)}), 30000+uint16(i), eps))
		}
		s, fake := newFake(t, testConfig(IPv4))
		fullSync(t, s, services(ports...))
		buckets, rules := 0, 0
		for name, ch := range fake.Table.Chains {
			switch {
			case strings.HasPrefix(name, roundRobinBucketPrefix):
				buckets++
				rules += len(ch.Rules)
			case strings.HasPrefix(name, roundRobinPrefix):
				t.Errorf("chain %s: want no round-robin chain of a port's own", name)
			}
		}
		if buckets > bucketCount || buckets < bucketCount*3/4 {
			t.Errorf("%d bucket chains for 1,000 ports; want at most %d, and most of them used", buckets, bucketCount)
		}
		if rules != len(ports) {
			t.Errorf("the bucket chains hold %d rules; want one per port, %d", rules, len(ports))
		}
		if got := dumpElements(fake, "endpoints-tcp"); strings.Count(got, "\n")+1 != 3*len(ports) {
			t.Errorf("endpoints-tcp holds %d elements; want the cluster IPs' only, %d", strings.Count(got, "\n")+1, 3*len(ports))
		}
	})

	t.Run("partial syncs keep each bucket as a full sync writes it", func(t *testing.T) {
		a := rrNodePort("a", netip.MustParseAddr("172.30.0.1"), 30001, eps)
		bucket := bucketOf(entry{a.ClusterIP, TCP, 80})
		cip := a.ClusterIP.Next()
		for bucketOf(entry{cip, TCP, 80}) != bucket {
			cip = cip.Next()
		}
		b := rrNodePort("b", cip, 30002, eps)
		for bucketOf(entry{cip, TCP, 80}) == bucket {
			cip = cip.Next()
		}
		c := rrNodePort("c", cip, 30003, eps)
		bucketChain, viaChain := roundRobinBucketChain(bucket), pickViaRoundRobinChain(bucket)
		rule := func(p *ServicePort, n int) string {
			return fmt.Sprintf("ip daddr %s tcp dport 80 numgen inc mod %d vmap @round-robin-picks", p.ClusterIP, n)
		}
		a2 := rrNodePort("a", a.ClusterIP, 30001, eps[:2])
		steps := []struct {
			name   string
			change map[ServiceName][]*ServicePort
			now    []*ServicePort
			rules  []string // of bucketChain, sorted; nil: the chain and viaChain are gone
		}{
			{"a loses an endpoint", services(a2), []*ServicePort{a2, b, c}, sorted(rule(a2, 2), rule(b, 3))},
			{"b goes", map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "b"}: nil}, []*ServicePort{a2, c}, []string{rule(a2, 2)}},
			{"b comes back", services(b), []*ServicePort{a2, b, c}, sorted(rule(a2, 2), rule(b, 3))},
			{"a and b go", map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "a"}: nil, {Namespace: "ns", Name: "b"}: nil}, []*ServicePort{c}, nil},
		}
		s, fake := newFake(t, testConfig(IPv4))
		fullSync(t, s, services(a, b, c))
		if got, want := sorted(chainRules(fake, bucketChain)...), sorted(rule(a, 3), rule(b, 3)); !slices.Equal(got, want) {
			t.Fatalf("%s after the full sync: %q; want %q", bucketChain, got, want)
		}
		for _, st := range steps {
			if _, err := s.Partial(context.Background(), st.change); err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			_, exists := fake.Table.Chains[bucketChain]
			_, viaExists := fake.Table.Chains[viaChain]
			switch {
			case st.rules == nil && (exists || viaExists):
				t.Errorf("%s: %s (%v) or %s (%v) is left; want both gone", st.name, bucketChain, exists, viaChain, viaExists)
			case st.rules != nil && !slices.Equal(sorted(chainRules(fake, bucketChain)...), st.rules):
				t.Errorf("%s: %s holds %q; want %q", st.name, bucketChain, chainRules(fake, bucketChain), st.rules)
			}
			full, fullFake := newFake(t, testConfig(IPv4))
			fullSync(t, full, services(st.now...))
			if diff := cmp.Diff(contentDump(fullFake), contentDump(fake)); diff != "" {
				t.Errorf("%s: the partial sync's table differs from a full sync's (-full +partial):\n%s", st.name, diff)
			}
		}
	})
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}
