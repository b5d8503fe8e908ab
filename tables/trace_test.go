package tables

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables/tracer"
)

// featureServices is one Service per feature, IPv4 and IPv6 alike.
func featureServices(fam Family) map[ServiceName][]*ServicePort {
	v4 := fam == IPv4
	pick := func(a, b string) netip.Addr {
		if v4 {
			return addr(a)
		}
		return addr(b)
	}
	pod1 := Endpoint{IP: pick("10.244.1.2", "fd00:10:244:1::2"), Port: 8080}
	remote := Endpoint{IP: pick("10.244.2.2", "fd00:10:244:2::2"), Port: 8080}
	ip := func(last string) netip.Addr { return pick("172.30.0."+last, "fd00:30::"+last) }
	ext := func(last string) netip.Addr { return pick("192.168.200."+last, "fd00:200::"+last) }
	lb := func(last string) netip.Addr { return pick("192.168.201."+last, "fd00:201::"+last) }
	mk := func(name, cip string, mods ...func(*ServicePort)) *ServicePort {
		p := sp(name, 80, mods...)
		p.ClusterIP = ip(cip)
		return p
	}
	both := withEndpoints([]Endpoint{pod1, remote}, []Endpoint{pod1})
	return services(
		mk("cluster", "10", both, func(p *ServicePort) {
			p.NodePort = 30080
			p.ExternalIPs = []netip.Addr{ext("10")}
		}),
		mk("local-ext", "11", both, func(p *ServicePort) {
			p.NodePort = 30081
			p.ExternalLocal = true
			p.LoadBalancerIPs = []netip.Addr{lb("11")}
		}),
		mk("local-none", "12", withEndpoints([]Endpoint{remote}, nil), func(p *ServicePort) {
			p.NodePort = 30082
			p.ExternalLocal = true
			p.LoadBalancerIPs = []netip.Addr{lb("12")}
		}),
		mk("no-endpoints", "13", func(p *ServicePort) {
			p.NodePort = 30083
			p.ExternalIPs = []netip.Addr{ext("13")}
			p.LoadBalancerIPs = []netip.Addr{lb("13")}
		}),
		mk("itp-local-none", "14", withEndpoints([]Endpoint{remote}, nil), func(p *ServicePort) { p.InternalLocal = true }),
		mk("itp-local", "15", both, func(p *ServicePort) { p.InternalLocal = true }),
		mk("fw-allow", "16", both, func(p *ServicePort) {
			p.LoadBalancerIPs = []netip.Addr{lb("16")}
			p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.100.0/24"), netip.MustParsePrefix("fd00:100::/64")}
		}),
		mk("fw-deny", "17", both, func(p *ServicePort) {
			p.LoadBalancerIPs = []netip.Addr{lb("17")}
			p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/64")}
		}),
		mk("udp", "18", both, func(p *ServicePort) { p.Protocol = UDP; p.Name.Port = "dns" }),
		mk("sctp", "19", both, func(p *ServicePort) { p.Protocol = SCTP; p.Name.Port = "sig" }),
		mk("affinity", "20", both, func(p *ServicePort) { p.AffinityTimeout = 10800 * time.Second }),
		mk("one-endpoint", "21", withEndpoints([]Endpoint{remote}, nil)),
	)
}

func TestTraceFeatures(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			v4 := fam == IPv4
			pick := func(a, b string) netip.Addr {
				if v4 {
					return addr(a)
				}
				return addr(b)
			}
			s, fake := newFake(t, testConfig(fam))
			fullSync(t, s, featureServices(fam))
			tr := newTracer(t, fake)

			node := pick("192.168.100.1", "fd00:100::1")
			client := pick("192.168.100.2", "fd00:100::2")
			pod1 := pick("10.244.1.2", "fd00:10:244:1::2")
			pod2 := pick("10.244.1.3", "fd00:10:244:1::3")
			epPod1 := netip.AddrPortFrom(pod1, 8080).String()
			epRemote := netip.AddrPortFrom(pick("10.244.2.2", "fd00:10:244:2::2"), 8080).String()
			cip := func(last string) netip.Addr { return pick("172.30.0."+last, "fd00:30::"+last) }
			ext := func(last string) netip.Addr { return pick("192.168.200."+last, "fd00:200::"+last) }
			lb := func(last string) netip.Addr { return pick("192.168.201."+last, "fd00:201::"+last) }
			fromPod := func(src netip.Addr, dst netip.Addr, port uint16) tracer.Packet {
				return tracer.Packet{Origin: tracer.FromPod, Src: src, IIF: "vpod1", Proto: "tcp", Dst: dst, Port: port}
			}
			fromOutside := func(dst netip.Addr, port uint16) tracer.Packet {
				return tracer.Packet{Origin: tracer.FromOutside, Src: client, IIF: "eth0", Proto: "tcp", Dst: dst, Port: port}
			}
			fromHost := func(dst netip.Addr, port uint16) tracer.Packet {
				return tracer.Packet{Origin: tracer.FromHost, Src: node, Proto: "tcp", Dst: dst, Port: port}
			}
			dnat := func(ep string, masq bool) string {
				if masq {
					return "accept dnat " + ep + " masq"
				}
				return "accept dnat " + ep
			}
			loopback := pick("127.0.0.1", "::1")
			node2 := pick(node2IP4.String(), node2IP6.String())
			// established turns p into a later packet of a connection that conntrack
			// translated to ep (none when ep is "") when it was new.
			established := func(p tracer.Packet, ep string, masq bool) tracer.Packet {
				p.State = tracer.CtEstablished
				p.Conn = tracer.Conn{Masquerade: masq}
				if ep != "" {
					p.Conn.DNAT = netip.MustParseAddrPort(ep)
				}
				return p
			}
			fromHostAt := func(src, dst netip.Addr, port uint16) tracer.Packet {
				p := fromHost(dst, port)
				p.Src = src
				return p
			}

			cases := []struct {
				name string
				pkt  tracer.Packet
				want []string
			}{
				{"pod to cluster IP reaches every endpoint unmasqueraded", fromPod(pod2, cip("10"), 80),
					[]string{dnat(epPod1, false), dnat(epRemote, false)}},
				{"pod reaching itself through its Service is masqueraded (hairpin)", fromPod(pod1, cip("10"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, false)}},
				{"host to cluster IP is masqueraded (not from a pod)", fromHost(cip("10"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"off-cluster traffic to cluster IP is masqueraded", fromOutside(cip("10"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"undefined port of a cluster IP is rejected", fromPod(pod2, cip("10"), 81), []string{"reject"}},
				{"undefined port of a cluster IP is rejected from the host", fromHost(cip("10"), 81), []string{"reject"}},
				{"NodePort from outside is masqueraded with Cluster policy", fromOutside(node, 30080),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"NodePort from the host", fromHost(node, 30080),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"NodePort on loopback is not served", fromHost(loopback, 30080), []string{"accept"}},
				{"NodePort on another port of the node is not touched", fromOutside(node, 30999), []string{"accept"}},
				{"external IP from outside is masqueraded with Cluster policy", fromOutside(ext("10"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"pod to external IP with Cluster policy is masqueraded", fromPod(pod2, ext("10"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"external IP on another port is not touched", fromOutside(ext("10"), 443), []string{"accept"}},

				{"Local policy: outside to LB IP keeps client IP and uses local endpoints", fromOutside(lb("11"), 80),
					[]string{dnat(epPod1, false)}},
				{"Local policy: NodePort from outside uses local endpoints only", fromOutside(node, 30081),
					[]string{dnat(epPod1, false)}},
				{"Local policy: pod to LB IP is short-circuited to all endpoints", fromPod(pod2, lb("11"), 80),
					[]string{dnat(epPod1, false), dnat(epRemote, false)}},
				{"Local policy: host to LB IP is masqueraded and uses all endpoints", fromHost(lb("11"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"Local policy without local endpoints drops external traffic", fromOutside(lb("12"), 80), []string{"drop"}},
				{"Local policy without local endpoints drops NodePort traffic", fromOutside(node, 30082), []string{"drop"}},
				{"Local policy without local endpoints still serves pods via the LB IP", fromPod(pod2, lb("12"), 80),
					[]string{dnat(epRemote, false)}},
				{"Local policy without local endpoints still serves the host via NodePort", fromHost(node, 30082),
					[]string{dnat(epRemote, true)}},

				{"no endpoints: cluster IP rejects", fromPod(pod2, cip("13"), 80), []string{"reject"}},
				{"no endpoints: cluster IP rejects the host", fromHost(cip("13"), 80), []string{"reject"}},
				{"no endpoints: NodePort rejects", fromOutside(node, 30083), []string{"reject"}},
				{"no endpoints: external IP rejects", fromOutside(ext("13"), 80), []string{"reject"}},
				{"no endpoints: LB IP rejects", fromOutside(lb("13"), 80), []string{"reject"}},

				{"internal Local policy without local endpoints drops", fromPod(pod2, cip("14"), 80), []string{"drop"}},
				{"internal Local policy uses local endpoints only", fromPod(pod2, cip("15"), 80), []string{dnat(epPod1, false)}},

				{"source range admits a client inside it", fromOutside(lb("16"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"source range holding the node IP admits the node from that IP", fromHost(lb("16"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				// node2 is outside the range: only firewall-allow-local admits it (see
				// TestFirewallAllowLocalNeedsNodeIPs for the same packet without node IPs).
				{"source range holding a node IP admits the node's other addresses", fromHostAt(node2, lb("16"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"source range drops a client outside it", fromOutside(lb("17"), 80), []string{"drop"}},
				{"source range without the node IP drops the node", fromHost(lb("17"), 80), []string{"drop"}},
				{"source range drops pods outside it", fromPod(pod2, lb("17"), 80), []string{"drop"}},
				{"source ranges do not apply to the cluster IP", fromPod(pod2, cip("17"), 80),
					[]string{dnat(epPod1, false), dnat(epRemote, false)}},
				{"established connection from a now-disallowed source is not dropped",
					established(fromOutside(lb("17"), 80), epRemote, true), []string{dnat(epRemote, true)}},
				{"established connection of the node from a now-disallowed source is not dropped",
					established(fromHost(lb("17"), 80), epPod1, true), []string{dnat(epPod1, true)}},
				{"established connection from an allowed source keeps its translation",
					established(fromOutside(lb("16"), 80), epPod1, true), []string{dnat(epPod1, true)}},

				{"established untranslated flow to an undefined port of a cluster IP is not rejected",
					established(fromPod(pod2, cip("10"), 81), "", false), []string{"accept"}},
				{"established untranslated flow to an undefined port of a cluster IP from the host is not rejected",
					established(fromHost(cip("10"), 81), "", false), []string{"accept"}},
				{"established connection to a Service that lost its endpoints is not rejected",
					established(fromPod(pod2, cip("13"), 80), epRemote, false), []string{dnat(epRemote, false)}},

				{"UDP port", tracer.Packet{Origin: tracer.FromPod, Src: pod2, IIF: "vpod2", Proto: "udp", Dst: cip("18"), Port: 80},
					[]string{dnat(epPod1, false), dnat(epRemote, false)}},
				{"UDP rule does not catch TCP", fromPod(pod2, cip("18"), 80), []string{"reject"}},
				{"SCTP port", tracer.Packet{Origin: tracer.FromPod, Src: pod2, IIF: "vpod2", Proto: "sctp", Dst: cip("19"), Port: 80},
					[]string{dnat(epPod1, false), dnat(epRemote, false)}},
				{"single endpoint", fromPod(pod2, cip("21"), 80), []string{dnat(epRemote, false)}},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					got := outcomes(t, tr, tc.pkt)
					want := slices.Clone(tc.want)
					slices.Sort(want)
					if !slices.Equal(got, want) {
						t.Errorf("packet %+v\n got: %q\nwant: %q", tc.pkt, got, want)
					}
				})
			}

			t.Run("ClientIP affinity remembers the client and sticks to its endpoint", func(t *testing.T) {
				res, err := tr.Trace(fromPod(pod2, cip("20"), 80))
				if err != nil {
					t.Fatal(err)
				}
				if len(res) != 2 {
					t.Fatalf("want 2 possible endpoints before affinity, got %v", res)
				}
				var update string
				for _, o := range res {
					if len(o.Updates) != 1 || !strings.Contains(o.Updates[0], "{ "+pod2.String()+" }") {
						t.Fatalf("want the client remembered in one affinity set, got %q", o.Updates)
					}
					if o.DNAT == epPod1 {
						update = o.Updates[0]
					}
				}
				// Apply the update the kernel would make; then the client must stick.
				setName := strings.TrimPrefix(strings.Fields(update)[0], "@")
				set := fake.Table.Sets[setName]
				if set == nil || set.Timeout == nil || *set.Timeout != 10800*time.Second {
					t.Fatalf("affinity set %q missing or without the Service's timeout", setName)
				}
				set.Elements = append(set.Elements, &knftElement{Key: []string{pod2.String()}})
				t.Cleanup(func() { set.Elements = nil })
				got := outcomes(t, tr, fromPod(pod2, cip("20"), 80))
				if !slices.Equal(got, []string{dnat(epPod1, false)}) {
					t.Errorf("after affinity: got %q, want only %s", got, epPod1)
				}
				if other := outcomes(t, tr, fromHost(cip("20"), 80)); len(other) != 2 {
					t.Errorf("another client must not be pinned: %q", other)
				}
			})
		})
	}
}

// TestFirewallAllowLocalNeedsNodeIPs checks what admits the node's own connections to an
// LB IP whose source ranges hold a node IP: firewall-allow-local (fed by Config.NodeIPs)
// admits every local source, also one outside the ranges (another node address, or the
// LB IP itself where it is assigned to the node); without node IPs only a source inside
// the ranges passes.
func TestFirewallAllowLocalNeedsNodeIPs(t *testing.T) {
	lbIP := addr("192.168.201.16")
	port := sp("fw", 80, withEndpoints([]Endpoint{ep("10.244.1.2", 8080)}, nil), func(p *ServicePort) {
		p.LoadBalancerIPs = []netip.Addr{lbIP}
		p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.100.0/24")}
	})
	admitted := []string{"accept dnat 10.244.1.2:8080 masq"}
	cases := []struct {
		name    string
		nodeIPs []netip.Addr
		src     netip.Addr
		want    []string
	}{
		{"node address outside the range is admitted", []netip.Addr{nodeIP4}, node2IP4, admitted},
		{"the LB IP as source is admitted", []netip.Addr{nodeIP4}, lbIP, admitted},
		{"node address inside the range is admitted", []netip.Addr{nodeIP4}, nodeIP4, admitted},
		{"without node IPs a node address outside the range is dropped", nil, node2IP4, []string{"drop"}},
		{"without node IPs the LB IP as source is dropped", nil, lbIP, []string{"drop"}},
		{"without node IPs a node address inside the range is still admitted", nil, nodeIP4, admitted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(IPv4)
			cfg.NodeIPs = tc.nodeIPs
			s, fake := newFake(t, cfg)
			fullSync(t, s, services(port))
			tr := newTracerEnv(t, tracer.Env{LocalIPs: []netip.Addr{nodeIP4, node2IP4, lbIP}}, fake)
			pkt := tracer.Packet{Origin: tracer.FromHost, Src: tc.src, Proto: "tcp", Dst: lbIP, Port: 80}
			if got := outcomes(t, tr, pkt); !slices.Equal(got, tc.want) {
				t.Errorf("packet %+v\n got: %q\nwant: %q", pkt, got, tc.want)
			}
		})
	}
}

// TestTraceLocalDetection runs each detect-local mode, masqueradeAll and a non-default
// masquerade mark through the tracer: which sources to a cluster IP are masqueraded,
// which pods are short-circuited to all endpoints of a Local-policy LB IP, and the
// services and nat-postrouting rules that do it (IPv4).
func TestTraceLocalDetection(t *testing.T) {
	const mark14 = "meta mark set meta mark or 0x00004000"
	dispatch := []string{
		"ip daddr . meta l4proto . th dport @external-masq " + mark14,
		"fib saddr type local ip daddr . meta l4proto . th dport @external-local " + mark14,
	}
	tail := []string{
		"fib saddr type local ip daddr . meta l4proto . th dport vmap @short-circuit-ips",
		"ip daddr . meta l4proto . th dport vmap @service-ips",
	}
	// rules builds the expected services chain: the cluster-IP masquerade rule (if any),
	// the external ones, the detect-local short circuit (if any), then the dispatch.
	rules := func(clusterMasq, shortCircuit string) []string {
		var out []string
		if clusterMasq != "" {
			out = append(out, clusterMasq)
		}
		out = append(out, dispatch...)
		if shortCircuit != "" {
			out = append(out, shortCircuit+" ip daddr . meta l4proto . th dport vmap @short-circuit-ips")
		}
		return append(out, tail...)
	}
	postrouting14 := "meta mark & 0x00004000 != 0 meta mark set meta mark xor 0x00004000 masquerade fully-random"

	// Sources: a local pod on its veth (vpod2) and through a bridge (cbr0), a pod of
	// another node (10.244.2.5, in the cluster CIDR but not this node's), and a client
	// outside the cluster.
	const podVeth, podBridge, remotePod, outside = "pod via veth", "pod via bridge", "pod of another node", "off-cluster client"
	cases := []struct {
		name string
		cfg  func(c *Config, fam Family)
		// masq says, per source, whether its traffic to a cluster IP is masqueraded.
		masq map[string]bool
		// short says, per source, whether it is short-circuited to every endpoint of a
		// Local-policy LB IP (else it gets the local endpoints only).
		short map[string]bool
		// services and postrouting are the chains' rules, IPv4.
		services    []string
		postrouting string
	}{
		{
			name:        "ClusterCIDR",
			cfg:         func(c *Config, fam Family) {},
			masq:        map[string]bool{podVeth: false, podBridge: false, remotePod: false, outside: true},
			short:       map[string]bool{podVeth: true, podBridge: true, remotePod: true, outside: false},
			services:    rules("ip daddr @cluster-ips ip saddr != { 10.244.0.0/16 } "+mark14, "ip saddr { 10.244.0.0/16 }"),
			postrouting: postrouting14,
		},
		{
			name: "NodeCIDR",
			cfg: func(c *Config, fam Family) {
				c.Local = LocalTraffic{Mode: LocalNodeCIDR, CIDRs: []netip.Prefix{
					netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}}
			},
			masq:        map[string]bool{podVeth: false, podBridge: false, remotePod: true, outside: true},
			short:       map[string]bool{podVeth: true, podBridge: true, remotePod: false, outside: false},
			services:    rules("ip daddr @cluster-ips ip saddr != { 10.244.1.0/24 } "+mark14, "ip saddr { 10.244.1.0/24 }"),
			postrouting: postrouting14,
		},
		{
			name:        "BridgeInterface",
			cfg:         func(c *Config, fam Family) { c.Local = LocalTraffic{Mode: LocalBridgeInterface, Interface: "cbr0"} },
			masq:        map[string]bool{podVeth: true, podBridge: false, remotePod: true, outside: true},
			short:       map[string]bool{podVeth: false, podBridge: true, remotePod: false, outside: false},
			services:    rules(`ip daddr @cluster-ips iifname != "cbr0" `+mark14, `iifname "cbr0"`),
			postrouting: postrouting14,
		},
		{
			name:        "InterfaceNamePrefix",
			cfg:         func(c *Config, fam Family) { c.Local = LocalTraffic{Mode: LocalInterfaceNamePrefix, Interface: "vpod"} },
			masq:        map[string]bool{podVeth: false, podBridge: true, remotePod: true, outside: true},
			short:       map[string]bool{podVeth: true, podBridge: false, remotePod: false, outside: false},
			services:    rules(`ip daddr @cluster-ips iifname != "vpod*" `+mark14, `iifname "vpod*"`),
			postrouting: postrouting14,
		},
		{
			name:        "no local detection",
			cfg:         func(c *Config, fam Family) { c.Local = LocalTraffic{} },
			masq:        map[string]bool{podVeth: false, podBridge: false, remotePod: false, outside: false},
			short:       map[string]bool{podVeth: false, podBridge: false, remotePod: false, outside: false},
			services:    rules("", ""),
			postrouting: postrouting14,
		},
		{
			name:        "masqueradeAll",
			cfg:         func(c *Config, fam Family) { c.MasqueradeAll = true },
			masq:        map[string]bool{podVeth: true, podBridge: true, remotePod: true, outside: true},
			short:       map[string]bool{podVeth: true, podBridge: true, remotePod: true, outside: false},
			services:    rules("ip daddr @cluster-ips "+mark14, "ip saddr { 10.244.0.0/16 }"),
			postrouting: postrouting14,
		},
		{
			name:  "masquerade mark bit 5",
			cfg:   func(c *Config, fam Family) { c.MasqueradeBit = 5 },
			masq:  map[string]bool{podVeth: false, podBridge: false, remotePod: false, outside: true},
			short: map[string]bool{podVeth: true, podBridge: true, remotePod: true, outside: false},
			services: func() []string {
				r := rules("ip daddr @cluster-ips ip saddr != { 10.244.0.0/16 } "+mark14, "ip saddr { 10.244.0.0/16 }")
				for i := range r {
					r[i] = strings.ReplaceAll(r[i], "0x00004000", "0x00000020")
				}
				return r
			}(),
			postrouting: "meta mark & 0x00000020 != 0 meta mark set meta mark xor 0x00000020 masquerade fully-random",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, fam := range []Family{IPv4, IPv6} {
				t.Run(fam.String(), func(t *testing.T) {
					pick := func(a, b string) netip.Addr {
						if fam == IPv4 {
							return addr(a)
						}
						return addr(b)
					}
					cfg := testConfig(fam)
					tc.cfg(&cfg, fam)
					pod1 := Endpoint{IP: pick("10.244.1.2", "fd00:10:244:1::2"), Port: 8080}
					remote := Endpoint{IP: pick("10.244.2.2", "fd00:10:244:2::2"), Port: 8080}
					cip, lbIP := pick("172.30.0.10", "fd00:30::10"), pick("192.168.201.11", "fd00:201::11")
					s, fake := newFake(t, cfg)
					fullSync(t, s, services(
						sp("cluster", 80, withEndpoints([]Endpoint{pod1, remote}, []Endpoint{pod1}), func(p *ServicePort) { p.ClusterIP = cip }),
						sp("local", 80, withEndpoints([]Endpoint{pod1, remote}, []Endpoint{pod1}), func(p *ServicePort) {
							p.ClusterIP = pick("172.30.0.11", "fd00:30::11")
							p.ExternalLocal = true
							p.LoadBalancerIPs = []netip.Addr{lbIP}
						}),
					))
					if fam == IPv4 {
						if diff := cmp.Diff(tc.services, chainRules(fake, chainServices)); diff != "" {
							t.Errorf("services chain (-want +got):\n%s", diff)
						}
						wantPost := []string{tc.postrouting, "ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random"}
						if diff := cmp.Diff(wantPost, chainRules(fake, chainNATPostrouting)); diff != "" {
							t.Errorf("nat-postrouting chain (-want +got):\n%s", diff)
						}
					}
					tr := newTracer(t, fake)
					sources := map[string]tracer.Packet{
						podVeth:   {Origin: tracer.FromPod, Src: pick("10.244.1.3", "fd00:10:244:1::3"), IIF: "vpod2"},
						podBridge: {Origin: tracer.FromPod, Src: pick("10.244.1.3", "fd00:10:244:1::3"), IIF: "cbr0"},
						remotePod: {Origin: tracer.FromOutside, Src: pick("10.244.2.5", "fd00:10:244:2::5"), IIF: "cluster0"},
						outside:   {Origin: tracer.FromOutside, Src: pick("192.168.100.2", "fd00:100::2"), IIF: "ext0"},
					}
					for _, src := range slices.Sorted(maps.Keys(sources)) {
						p := sources[src]
						p.Proto, p.Dst, p.Port = "tcp", cip, 80
						want := []string{"accept dnat " + pod1.String(), "accept dnat " + remote.String()}
						if tc.masq[src] {
							want = []string{want[0] + " masq", want[1] + " masq"}
						}
						if got := outcomes(t, tr, p); !slices.Equal(got, want) {
							t.Errorf("%s to the cluster IP: got %q, want %q", src, got, want)
						}
						// Local policy keeps the client's IP: no masquerade either way.
						p.Dst = lbIP
						want = []string{"accept dnat " + pod1.String()}
						if tc.short[src] {
							want = append(want, "accept dnat "+remote.String())
						}
						if got := outcomes(t, tr, p); !slices.Equal(got, want) {
							t.Errorf("%s to the Local-policy LB IP: got %q, want %q", src, got, want)
						}
					}
				})
			}
		})
	}
}

// chainRules returns the rules of a chain, in order.
func chainRules(fake *knftables.Fake, name string) []string {
	var out []string
	if ch := fake.Table.Chains[name]; ch != nil {
		for _, r := range ch.Rules {
			out = append(out, r.Rule)
		}
	}
	return out
}
