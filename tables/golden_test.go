package tables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// contentDump renders what Services put into the table: every element, every set, map
// and chain outside the fixed skeleton (so an empty one left behind shows), and the
// rules of those chains. Lines are sorted, so order never matters.
func contentDump(fake *knftables.Fake) string {
	var lines []string
	fixed := skeletonNames()
	for name := range fake.Table.Sets {
		if !fixed["set "+name] {
			lines = append(lines, "set "+name)
		}
	}
	for name := range fake.Table.Maps {
		if !fixed["map "+name] {
			lines = append(lines, "map "+name)
		}
	}
	for name := range fake.Table.Chains {
		if !fixed["chain "+name] {
			lines = append(lines, "chain "+name)
		}
	}
	for name, st := range fake.Table.Sets {
		for _, e := range st.Elements {
			lines = append(lines, "set "+name+" "+strings.Join(e.Key, " . "))
		}
	}
	for name, m := range fake.Table.Maps {
		for _, e := range m.Elements {
			lines = append(lines, "map "+name+" "+strings.Join(e.Key, " . ")+" : "+strings.Join(e.Value, " . "))
		}
	}
	for name, ch := range fake.Table.Chains {
		if fixed["chain "+name] {
			continue
		}
		for _, r := range ch.Rules {
			lines = append(lines, "chain "+name+" "+r.Rule)
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// skeletonNames are the sets, maps and chains of every table ("set NAME", ...).
func skeletonNames() map[string]bool {
	cfg := testConfig(IPv4)
	sk := newCompiler(&cfg).skeleton(Priorities{})
	sets, maps, chains := sk.Sets, sk.Maps, sk.Chains
	out := map[string]bool{}
	for _, st := range sets {
		out["set "+st.Name] = true
	}
	for _, m := range maps {
		out["map "+m.Name] = true
	}
	for _, ch := range chains {
		out["chain "+ch.Name] = true
	}
	return out
}

func golden(lines string) string {
	var out []string
	for _, l := range strings.Split(lines, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func TestGoldenServices(t *testing.T) {
	pod := ep("10.244.1.2", 8080)
	remote := ep("10.244.2.2", 8080)
	cases := []struct {
		name string
		port *ServicePort
		want string
	}{
		{
			name: "cluster IP with two endpoints",
			port: sp("web", 80, withEndpoints([]Endpoint{pod, remote}, []Endpoint{pod})),
			want: `
				set cluster-ips 172.30.0.10
				set hairpin 10.244.1.2 . 10.244.1.2
				set hairpin 10.244.2.2 . 10.244.2.2
				map service-ips 172.30.0.10 . tcp . 80 : goto pick-2
				map endpoints-tcp 172.30.0.10 . 80 . 0 : 10.244.1.2 . 8080
				map endpoints-tcp 172.30.0.10 . 80 . 1 : 10.244.2.2 . 8080
				chain pick-2
				chain pick-2 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 2 map @endpoints-tcp
				chain pick-2 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 2 map @endpoints-udp
				chain pick-2 meta l4proto sctp dnat ip to ip daddr . sctp dport . numgen random mod 2 map @endpoints-sctp`,
		},
		{
			name: "no endpoints rejects on every way in",
			port: sp("empty", 53, func(p *ServicePort) {
				p.Protocol = UDP
				p.NodePort = 30053
				p.ExternalIPs = []netip.Addr{addr("192.168.200.1")}
			}),
			want: `
				set cluster-ips 172.30.0.10
				set external-masq 192.168.100.1 . udp . 30053
				set external-masq 192.168.200.1 . udp . 53
				map no-endpoint-services 172.30.0.10 . udp . 53 : goto reject-chain
				map no-endpoint-services 192.168.100.1 . udp . 30053 : goto reject-chain
				map no-endpoint-services 192.168.200.1 . udp . 53 : goto reject-chain`,
		},
		{
			name: "Local external policy without local endpoints: drop outside, short-circuit inside",
			port: sp("local", 443, withEndpoints([]Endpoint{remote}, nil), func(p *ServicePort) {
				p.ExternalLocal = true
				p.LoadBalancerIPs = []netip.Addr{addr("192.168.201.1")}
				p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.100.0/24"), netip.MustParsePrefix("192.168.100.128/25")}
			}),
			want: `
				set cluster-ips 172.30.0.10
				set hairpin 10.244.2.2 . 10.244.2.2
				set external-local 192.168.201.1 . tcp . 443
				set firewall-ips 192.168.201.1 . tcp . 443
				set firewall-allow 192.168.201.1 . tcp . 443 . 192.168.100.0/24
				set firewall-allow-local 192.168.201.1 . tcp . 443
				map service-ips 172.30.0.10 . tcp . 443 : goto pick-1
				map endpoints-tcp 172.30.0.10 . 443 . 0 : 10.244.2.2 . 8080
				map short-circuit-ips 192.168.201.1 . tcp . 443 : goto pick-cluster-1
				map cluster-endpoints-tcp 192.168.201.1 . 443 . 0 : 10.244.2.2 . 8080
				map no-endpoint-services 192.168.201.1 . tcp . 443 : drop
				chain pick-1
				chain pick-1 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 1 map @endpoints-tcp
				chain pick-1 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 1 map @endpoints-udp
				chain pick-1 meta l4proto sctp dnat ip to ip daddr . sctp dport . numgen random mod 1 map @endpoints-sctp
				chain pick-cluster-1
				chain pick-cluster-1 meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 1 map @cluster-endpoints-tcp
				chain pick-cluster-1 meta l4proto udp dnat ip to ip daddr . udp dport . numgen random mod 1 map @cluster-endpoints-udp
				chain pick-cluster-1 meta l4proto sctp dnat ip to ip daddr . sctp dport . numgen random mod 1 map @cluster-endpoints-sctp`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, fake := newFake(t, testConfig(IPv4))
			fullSync(t, s, services(tc.port))
			if diff := cmp.Diff(golden(tc.want), contentDump(fake)); diff != "" {
				t.Errorf("content (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGoldenAffinity(t *testing.T) {
	p := sp("sticky", 80, withEndpoints([]Endpoint{ep("10.244.1.2", 8080)}, nil), func(p *ServicePort) {
		p.AffinityTimeout = 300 * time.Second
	})
	s, fake := newFake(t, testConfig(IPv4))
	fullSync(t, s, services(p))
	spn := p.Name
	spn.Protocol = TCP
	id := portID(spn, p.AffinityTimeout)
	epid := endpointID(p.ClusterEndpoints[0])
	// The port's rules go to its bucket, each matching its cluster IP and port first.
	bucket := strconv.Itoa(bucketOf(entry{p.ClusterIP, TCP, 80}))
	want := golden(strings.NewReplacer("ID", id, "EP", epid, "-B", "-"+bucket).Replace(`
		set cluster-ips 172.30.0.10
		set hairpin 10.244.1.2 . 10.244.1.2
		map service-ips 172.30.0.10 . tcp . 80 : goto aff-bucket-B
		set aff-ID-EP
		chain aff-bucket-B
		chain aff-bucket-B ip daddr 172.30.0.10 tcp dport 80 ip saddr @aff-ID-EP meta l4proto tcp update @aff-ID-EP { ip saddr } dnat ip to 10.244.1.2:8080
		chain aff-bucket-B ip daddr 172.30.0.10 tcp dport 80 meta l4proto tcp update @aff-ID-EP { ip saddr } dnat ip to 10.244.1.2:8080`))
	if diff := cmp.Diff(want, contentDump(fake)); diff != "" {
		t.Errorf("content (-want +got):\n%s", diff)
	}
	set := fake.Table.Sets["aff-"+id+"-"+epid]
	if set == nil || *set.Timeout != 300*time.Second {
		t.Errorf("affinity set missing or with the wrong timeout: %+v", set)
	}
}

// TestAffinityNamesLength: the per-Service names carry IDs of at least 128 bits, so no
// user can collide theirs with another Service's on purpose, and still fit the kernel's
// limit on chain and set names (NFT_NAME_MAXLEN and NFT_SET_MAXNAMELEN are 256 with the
// NUL). TestKernelAcceptsRules loads them into a real kernel.
func TestAffinityNamesLength(t *testing.T) {
	const kernelMaxName = 255
	if bits := idChars * 5; bits < 128 {
		t.Errorf("IDs of %d base32 characters hold %d bits, want at least 128", idChars, bits)
	}
	// The longest inputs a Service can give (IDs are hashes: their length does not
	// depend on them, but the test should not either).
	long := strings.Repeat("n", 63)
	p := sp("sticky", 80, withEndpoints([]Endpoint{ep("10.244.255.255", 65535)}, nil), func(p *ServicePort) {
		p.AffinityTimeout = 10800 * time.Second
		p.Name.Namespace, p.Name.Name, p.Name.Port = long, long, strings.Repeat("p", 15)
	})
	s, fake := newFake(t, testConfig(IPv4))
	fullSync(t, s, services(p))
	var names []string
	for name := range fake.Table.Chains {
		names = append(names, name)
	}
	for name := range fake.Table.Sets {
		names = append(names, name)
	}
	spn := p.Name
	spn.Protocol = p.Protocol
	id := portID(spn, p.AffinityTimeout)
	affinity := 0
	for _, name := range names {
		if len(name) > kernelMaxName {
			t.Errorf("%q has %d characters, more than the kernel's %d", name, len(name), kernelMaxName)
		}
		if strings.HasPrefix(name, affinityPrefix) && !strings.HasPrefix(name, affinityBucketPrefix) {
			affinity++
			if len(id) != idChars || !strings.Contains(name, id) {
				t.Errorf("%q does not carry the %d-character port ID", name, idChars)
			}
		}
	}
	if affinity == 0 {
		t.Fatalf("no affinity chains or sets among %v", names)
	}
	if got := len(affinityPrefix + id + "-" + endpointID(p.ClusterEndpoints[0])); got != 57 {
		t.Errorf("the longest affinity name has %d characters; names.go says 57", got)
	}
}

// TestGoldenSkeleton pins the fixed part of an instance's table: base chains, hooks,
// priorities (slot 0), sets, maps and rules. tables/README.md documents it. An
// instance whose Services may be consistentHash (Config.ConsistentHash) has the
// rotation chains and their map of slots too; others do not.
func TestGoldenSkeleton(t *testing.T) {
	rotation := "add map ip shardproxy-test ch-slots { typeof @nh,120,8 . ip daddr . meta l4proto . th dport : ip daddr . th dport ; comment \"consistentHash slot . entry -> endpoint\" ; }\n"
	for k := range rotations {
		rotation += fmt.Sprintf("add chain ip shardproxy-test ch-rotation-%d\n", k) +
			fmt.Sprintf("add rule ip shardproxy-test ch-rotation-%d dnat ip to @nh,120,8 ^ 0x%x . ip daddr . meta l4proto . th dport map @ch-slots\n", k, 2*k)
	}
	for _, tc := range []struct {
		name           string
		consistentHash bool
		want           string
	}{
		{"without consistentHash", false, skeletonIPv4},
		{"with consistentHash", true, skeletonIPv4 + rotation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(IPv4)
			cfg.ConsistentHash = tc.consistentHash
			s, fake := newFake(t, cfg)
			fullSync(t, s, nil)
			if diff := cmp.Diff(golden(tc.want), golden(fake.Dump())); diff != "" {
				t.Errorf("skeleton (-want +got):\n%s", diff)
			}
		})
	}
}

const skeletonIPv4 = `
add table ip shardproxy-test { comment "shardproxy instance test" ; }
add chain ip shardproxy-test filter-forward { type filter hook forward priority -35 ; }
add chain ip shardproxy-test filter-input { type filter hook input priority -35 ; }
add chain ip shardproxy-test filter-output { type filter hook output priority -35 ; }
add chain ip shardproxy-test firewall-check
add chain ip shardproxy-test firewall-output { type filter hook output priority -132 ; }
add chain ip shardproxy-test firewall-prerouting { type filter hook prerouting priority -132 ; }
add chain ip shardproxy-test nat-output { type nat hook output priority -67 ; }
add chain ip shardproxy-test nat-postrouting { type nat hook postrouting priority 101 ; }
add chain ip shardproxy-test nat-prerouting { type nat hook prerouting priority -67 ; }
add chain ip shardproxy-test reject-chain
add chain ip shardproxy-test services
add set ip shardproxy-test cluster-ips { type ipv4_addr ; comment "cluster IPs of this instance's Services" ; }
add set ip shardproxy-test external-local { type ipv4_addr . inet_proto . inet_service ; comment "external entries of Local-policy Services" ; }
add set ip shardproxy-test external-masq { type ipv4_addr . inet_proto . inet_service ; comment "external entries of Cluster-policy Services" ; }
add set ip shardproxy-test firewall-allow { type ipv4_addr . inet_proto . inet_service . ipv4_addr ; flags interval ; comment "LB entry . allowed source range" ; }
add set ip shardproxy-test firewall-allow-local { type ipv4_addr . inet_proto . inet_service ; comment "LB entries whose source ranges hold a node IP" ; }
add set ip shardproxy-test firewall-ips { type ipv4_addr . inet_proto . inet_service ; comment "LB entries with loadBalancerSourceRanges" ; }
add set ip shardproxy-test hairpin { type ipv4_addr . ipv4_addr ; comment "endpoint . endpoint, for hairpin masquerade" ; }
add map ip shardproxy-test cluster-endpoints-sctp { typeof ip daddr . sctp dport . numgen random mod 1 : ip daddr . sctp dport ; comment "address . port . index -> cluster-policy endpoint" ; }
add map ip shardproxy-test cluster-endpoints-tcp { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; comment "address . port . index -> cluster-policy endpoint" ; }
add map ip shardproxy-test cluster-endpoints-udp { typeof ip daddr . udp dport . numgen random mod 1 : ip daddr . udp dport ; comment "address . port . index -> cluster-policy endpoint" ; }
add map ip shardproxy-test cluster-ip-of { type ipv4_addr . inet_proto . inet_service : ipv4_addr ; comment "consistentHash entry -> its Service port's cluster IP" ; }
add map ip shardproxy-test cluster-port-of { type ipv4_addr . inet_proto . inet_service : inet_service ; comment "consistentHash entry -> its Service port's port" ; }
add map ip shardproxy-test endpoints-sctp { typeof ip daddr . sctp dport . numgen random mod 1 : ip daddr . sctp dport ; comment "address . port . index -> endpoint" ; }
add map ip shardproxy-test endpoints-tcp { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; comment "address . port . index -> endpoint" ; }
add map ip shardproxy-test endpoints-udp { typeof ip daddr . udp dport . numgen random mod 1 : ip daddr . udp dport ; comment "address . port . index -> endpoint" ; }
add map ip shardproxy-test no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "entry without endpoints -> reject or drop" ; }
add map ip shardproxy-test round-robin-cluster-picks { typeof numgen inc mod 1 : verdict ; comment "round-robin index -> pick-cluster-at chain" ; }
add map ip shardproxy-test round-robin-picks { typeof numgen inc mod 1 : verdict ; comment "round-robin index -> pick-at chain" ; }
add map ip shardproxy-test service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "entry -> pick chain" ; }
add map ip shardproxy-test short-circuit-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "Local-policy entry, from pods and node -> pick chain" ; }
add rule ip shardproxy-test filter-forward ct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip shardproxy-test filter-forward ct state new ip daddr @cluster-ips reject
add rule ip shardproxy-test filter-input ct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip shardproxy-test filter-output ct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip shardproxy-test filter-output ct state new ip daddr @cluster-ips reject
add rule ip shardproxy-test firewall-check ip daddr . meta l4proto . th dport . ip saddr @firewall-allow return
add rule ip shardproxy-test firewall-check fib saddr type local ip daddr . meta l4proto . th dport @firewall-allow-local return
add rule ip shardproxy-test firewall-check drop
add rule ip shardproxy-test firewall-output ct state new ip daddr . meta l4proto . th dport @firewall-ips jump firewall-check
add rule ip shardproxy-test firewall-prerouting ct state new ip daddr . meta l4proto . th dport @firewall-ips jump firewall-check
add rule ip shardproxy-test nat-output jump services
add rule ip shardproxy-test nat-postrouting meta mark & 0x00004000 != 0 meta mark set meta mark xor 0x00004000 masquerade fully-random
add rule ip shardproxy-test nat-postrouting ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random
add rule ip shardproxy-test nat-prerouting jump services
add rule ip shardproxy-test reject-chain reject
add rule ip shardproxy-test services ip daddr @cluster-ips ip saddr != { 10.244.0.0/16 } meta mark set meta mark or 0x00004000
add rule ip shardproxy-test services ip daddr . meta l4proto . th dport @external-masq meta mark set meta mark or 0x00004000
add rule ip shardproxy-test services fib saddr type local ip daddr . meta l4proto . th dport @external-local meta mark set meta mark or 0x00004000
add rule ip shardproxy-test services ip saddr { 10.244.0.0/16 } ip daddr . meta l4proto . th dport vmap @short-circuit-ips
add rule ip shardproxy-test services fib saddr type local ip daddr . meta l4proto . th dport vmap @short-circuit-ips
add rule ip shardproxy-test services ip daddr . meta l4proto . th dport vmap @service-ips
`
