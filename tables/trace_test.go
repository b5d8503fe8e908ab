package tables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

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
				{"source range holding the node IP admits the node", fromHost(lb("16"), 80),
					[]string{dnat(epPod1, true), dnat(epRemote, true)}},
				{"source range drops a client outside it", fromOutside(lb("17"), 80), []string{"drop"}},
				{"source range without the node IP drops the node", fromHost(lb("17"), 80), []string{"drop"}},
				{"source range drops pods outside it", fromPod(pod2, lb("17"), 80), []string{"drop"}},
				{"source ranges do not apply to the cluster IP", fromPod(pod2, cip("17"), 80),
					[]string{dnat(epPod1, false), dnat(epRemote, false)}},

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
