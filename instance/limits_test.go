package instance

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// endpointsOn returns n ready endpoints 10.244.<subnet>.1.. on node-b.
func endpointsOn(subnet string, n int) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, n)
	for i := range out {
		out[i] = ep("10.244."+subnet+"."+strconv.Itoa(i+1), "node-b")
	}
	return out
}

// sliceOf returns an IPv4 EndpointSlice of Service ns/svc with the given ports and
// endpoints.
func sliceOf(svc, name string, ports []discoveryv1.EndpointPort, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := epSlice(name, discoveryv1.AddressTypeIPv4, ports, eps...)
	s.Labels[discoveryv1.LabelServiceName] = svc
	return s
}

// fullSyncAdds is what a full sync of an instance (both families, NodePorts on two
// IPv4 addresses and one IPv6 one, mode) writes for svc and its slices into each
// family's table beyond what it writes with no Service at all: set and map elements,
// rules and sets. It also returns the node port address counts the instance gives the
// estimate. (Small shapes: the fake's cost grows with the square of its elements.)
func fullSyncAdds(t *testing.T, svc *corev1.Service, slices []*discoveryv1.EndpointSlice, mode tables.LBMode) (elements, rules, sets map[tables.Family]int, npAddrs map[tables.Family]int) {
	t.Helper()
	fakes := map[tables.Family]*knftables.Fake{
		tables.IPv4: knftables.NewFake(knftables.IPv4Family, "shardproxy-test"),
		tables.IPv6: knftables.NewFake(knftables.IPv6Family, "shardproxy-test"),
	}
	p, err := New(Options{
		Name: "test",
		Tables: tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14,
			NodePortIPs: ips("192.168.0.1", "192.168.0.2", "127.0.0.1", "fd00::1")},
		Families:           []tables.Family{tables.IPv4, tables.IPv6},
		NFT:                func(f tables.Family, _ string) (knftables.Interface, error) { return fakes[f], nil },
		Node:               thisNode(),
		MaxServiceElements: -1, // measure it, never refuse it
		MaxInstanceCost:    -1,
		LoadBalancing:      LoadBalancing{Mode: mode},
	})
	if err != nil {
		t.Fatal(err)
	}
	held := func() (elements, rules, sets map[tables.Family]int) {
		elements, rules, sets = map[tables.Family]int{}, map[tables.Family]int{}, map[tables.Family]int{}
		for f, fake := range fakes {
			sets[f] = len(fake.Table.Sets)
			for _, set := range fake.Table.Sets {
				elements[f] += len(set.Elements)
			}
			for _, m := range fake.Table.Maps {
				elements[f] += len(m.Elements)
			}
			for _, ch := range fake.Table.Chains {
				rules[f] += len(ch.Rules)
			}
		}
		return elements, rules, sets
	}
	ctx := context.Background()
	if _, err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	baseElements, baseRules, baseSets := held()
	p.UpdateService(svc)
	for _, sl := range slices {
		p.UpdateEndpointSlice(sl)
	}
	res, err := p.Sync(ctx, true)
	if err != nil || !res.Full {
		t.Fatalf("full sync: full=%v, %v", res.Full, err)
	}
	if m := p.Applied()[webName]; m != nil && m.Refused != "" {
		t.Fatalf("the Service was refused: %s", m.Refused)
	}
	elements, rules, sets = held()
	for f := range fakes {
		elements[f] -= baseElements[f]
		rules[f] -= baseRules[f]
		sets[f] -= baseSets[f]
	}
	return elements, rules, sets, p.nodePortAddrs()
}

// TestCostEstimate: for every shape of Service, the estimate that decides whether a
// Service is refused counts at least the elements, rules and sets a full sync actually
// writes for it into the larger family's table: it is a bound, not a guess that a shape
// it forgot could pass under. (Before issue 36 it counted elements only: a
// ClientIP-affinity port's rules and sets, what the kernel pays most for, passed
// uncounted.)
func TestCostEstimate(t *testing.T) {
	http := []discoveryv1.EndpointPort{slicePort("http", 8080)}
	twoPorts := []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("https", 8443)}
	addPort := func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	}
	ten := []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("2", 10)...)}
	// Two of them on this node: a Local policy gives entries endpoints of their own.
	tenTwoLocal := []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, twoPorts,
		append(endpointsOn("2", 8), ep("10.244.1.1", thisNodeName), ep("10.244.1.2", thisNodeName))...)}
	// More endpoints than a consistent-hash table of ConsistentTableSlots holds, two on
	// this node.
	many := []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, http,
		append(endpointsOn("2", 250), append(endpointsOn("3", 8), ep("10.244.1.1", thisNodeName), ep("10.244.1.2", thisNodeName))...)...)}
	lb := func(s *corev1.Service) {
		ofType(corev1.ServiceTypeLoadBalancer)(s)
		s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}, {IP: "2001:db8::2"}, {Hostname: "lb.example"}}
		s.Spec.HealthCheckNodePort = 30999
	}
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	internalLocal := func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}
	affinity := func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }
	sourceRanges := func(s *corev1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "2001:db8::/32"}
	}
	modes := []tables.LBMode{tables.LBRandom, tables.LBRoundRobin, tables.LBSourceHash, tables.LBConsistentHash}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		// empty: the Service gets no rules.
		empty bool
		// affinity: the port's rules, one pair per endpoint, and its sets, one per
		// endpoint, are there (and counted).
		affinity bool
	}{
		{name: "cluster IP without endpoints", svc: service()},
		{name: "each endpoint of each port", svc: service(addPort), slices: []*discoveryv1.EndpointSlice{
			epSlice("web-1", discoveryv1.AddressTypeIPv4, twoPorts, endpointsOn("1", 10)...)}},
		{name: "every slice counts", svc: service(), slices: []*discoveryv1.EndpointSlice{
			epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...),
			epSlice("web-2", discoveryv1.AddressTypeIPv4, http, endpointsOn("2", 5)...)}},
		{name: "external IPs, load-balancer IPs and NodePort addresses", svc: service(lb), slices: ten},
		{name: "load balancer without endpoints", svc: service(lb)},
		{name: "NodePort without node port", svc: service(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }), slices: ten},
		{name: "load-balancer status of a ClusterIP Service", svc: service(func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
		}), slices: ten},
		{name: "Local external policy with local endpoints", svc: service(lb, addPort, local), slices: tenTwoLocal},
		{name: "Local external policy without local endpoints", svc: service(lb, local), slices: ten},
		{name: "Local external policy, every endpoint local", svc: service(lb, local), slices: []*discoveryv1.EndpointSlice{
			epSlice("web-1", discoveryv1.AddressTypeIPv4, http, ep("10.244.1.1", thisNodeName), ep("10.244.1.2", thisNodeName))}},
		{name: "Local internal policy", svc: service(lb, addPort, internalLocal), slices: tenTwoLocal},
		{name: "both policies Local", svc: service(lb, addPort, local, internalLocal), slices: tenTwoLocal},
		{name: "loadBalancerSourceRanges", svc: service(lb, addPort, sourceRanges), slices: tenTwoLocal},
		{name: "many loadBalancerSourceRanges", svc: service(lb, func(s *corev1.Service) {
			for i := range 40 {
				s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, "10."+strconv.Itoa(i)+".0.0/16")
			}
		}), slices: ten},
		{name: "loadBalancerSourceRanges with Local policy", svc: service(lb, addPort, local, sourceRanges), slices: tenTwoLocal},
		{name: "ClientIP affinity", svc: service(addPort, affinity), slices: tenTwoLocal, affinity: true},
		{name: "ClientIP affinity on a load balancer", svc: service(lb, addPort, affinity), slices: tenTwoLocal, affinity: true},
		{name: "ClientIP affinity with Local policy", svc: service(lb, addPort, local, affinity), slices: tenTwoLocal, affinity: true},
		{name: "more endpoints than a consistent-hash table", svc: service(ofType(corev1.ServiceTypeNodePort)), slices: many},
		{name: "more endpoints than a consistent-hash table, Local policy", svc: service(ofType(corev1.ServiceTypeNodePort), local), slices: many},
		{name: "one endpoint", svc: service(lb), slices: []*discoveryv1.EndpointSlice{
			epSlice("web-1", discoveryv1.AddressTypeIPv4, http, ep("10.244.1.1", thisNodeName))}},
		{name: "dual-stack: the larger family", svc: service(dualStack, lb), slices: []*discoveryv1.EndpointSlice{
			epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...),
			epSlice("web-2", discoveryv1.AddressTypeIPv6, http, ep("fd00:10:244:1::1", ""), ep("fd00:10:244:1::2", "")),
			epSlice("web-3", discoveryv1.AddressTypeFQDN, http, endpointsOn("3", 50)...)}},
		{name: "legacy clusterIP field only", svc: service(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }), slices: ten},
		{name: "headless", svc: service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
			slices: ten, empty: true},
		{name: "ExternalName", svc: service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
			s.Spec.ExternalIPs = []string{"192.0.2.1"}
		}), slices: ten, empty: true},
	} {
		for _, mode := range modes {
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				elements, rules, sets, np := fullSyncAdds(t, tc.svc, tc.slices, mode)
				actual := max(elements[tables.IPv4], elements[tables.IPv6])
				est := costEstimate(tc.svc, tc.slices, np, mode)
				t.Logf("estimate %+v, written: elements %v, rules %v, sets %v", est, elements, rules, sets)
				if tc.empty != (actual == 0) {
					t.Fatalf("the full sync wrote %d elements; want none: %v", actual, tc.empty)
				}
				if est.elements+est.ranges < actual {
					t.Errorf("estimate of %d elements (%d of them source ranges) is under the %d a full sync writes (by family: %v)",
						est.elements+est.ranges, est.ranges, actual, elements)
				}
				if r := max(rules[tables.IPv4], rules[tables.IPv6]); est.rules < r {
					t.Errorf("estimate of %d rules is under the %d a full sync writes (by family: %v)", est.rules, r, rules)
				}
				if n := max(sets[tables.IPv4], sets[tables.IPv6]); est.sets < n {
					t.Errorf("estimate of %d sets is under the %d a full sync writes (by family: %v)", est.sets, n, sets)
				}
				if tc.affinity {
					endpoints := 0
					for _, sl := range tc.slices {
						endpoints += len(sl.Endpoints) * len(sl.Ports)
					}
					if rules[tables.IPv4] < 2*endpoints || sets[tables.IPv4] < endpoints {
						t.Errorf("ClientIP affinity wrote %d rules and %d sets, want its 2 rules and a set per endpoint and port (%d)",
							rules[tables.IPv4], sets[tables.IPv4], endpoints)
					}
				}
			})
		}
	}
}

// TestServiceOverLimitRefused checks a Service bringing more cost units than
// MaxServiceElements is refused (not programmed, its model says why, one log line, its
// model not even built) while every other Service of the instance is programmed, in full
// and partial syncs, and that it is programmed again once it fits.
func TestServiceOverLimitRefused(t *testing.T) {
	big := types.NamespacedName{Namespace: "ns", Name: "big"}
	const bigIP = "172.30.0.50"
	bigSvc := func(edits ...func(*corev1.Service)) *corev1.Service {
		svc := namedAt(big.Name, bigIP)
		for _, e := range edits {
			e(svc)
		}
		return svc
	}
	http := []discoveryv1.EndpointPort{slicePort("http", 8080)}
	twoPorts := []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("other", 9090)}

	p, nft := newTestProxy(t, nil, func(o *Options) { o.MaxServiceElements = 50 })
	var mu sync.Mutex
	var refusals []string
	p.logger = funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(args, "Refused a Service") {
			refusals = append(refusals, args)
		}
	}, funcr.Options{})
	var built []string
	p.tracker.build = func(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo) *ServiceModel {
		mu.Lock()
		built = append(built, svc.Name)
		mu.Unlock()
		return Build(svc, slices, node)
	}
	ctx := context.Background()

	for _, step := range []struct {
		name        string
		do          func()
		full        bool
		wantRefused bool
		// wantLogs is how many refusals the step logs.
		wantLogs int
		// wantIPs are programmed, wantGone not.
		wantIPs, wantGone []string
	}{
		{
			name: "full sync: the Service over the limit is refused, the other programmed",
			do: func() {
				p.UpdateService(service())
				p.UpdateEndpointSlice(v4Slice("web-1", endpointsOn("1", 5)...))
				p.UpdateService(bigSvc())
				// The cluster IP and 15 hairpins, 2 ports dispatched to 15 endpoints
				// each: 1 + 15 + 2 + 2 × 15 = 48 elements, and each port's 3 pick
				// rules: 48 + 4 × 6 = 72 units
				p.UpdateEndpointSlice(sliceOf(big.Name, "big-1", twoPorts, endpointsOn("2", 15)))
			},
			full: true, wantRefused: true, wantLogs: 1,
			wantIPs: []string{clusterIP4, "10.244.1.5 . 8080"}, wantGone: []string{bigIP, "10.244.2."},
		},
		{
			name:        "partial sync: another Service's change is programmed",
			do:          func() { p.UpdateEndpointSlice(v4Slice("web-1", endpointsOn("1", 6)...)) },
			wantRefused: true,
			wantIPs:     []string{clusterIP4, "10.244.1.6 . 8080"}, wantGone: []string{bigIP},
		},
		{
			name: "shrunk under the limit: programmed",
			// 1 + 15 + 1 + 1 × 15 = 32 elements, 3 rules: 44 units
			do:      func() { p.UpdateEndpointSlice(sliceOf(big.Name, "big-1", http, endpointsOn("2", 15))) },
			wantIPs: []string{clusterIP4, bigIP, "10.244.2.15 . 8080"},
		},
		{
			name: "grown over it in a partial sync: its rules are removed",
			// 1 + 20 + 1 + 1 × 20 = 42 elements, 3 rules: 54 units
			do: func() {
				p.UpdateEndpointSlice(sliceOf(big.Name, "big-2", http, endpointsOn("3", 5)))
			},
			wantRefused: true, wantLogs: 1,
			wantIPs: []string{clusterIP4}, wantGone: []string{bigIP, "10.244.2.", "10.244.3."},
		},
		{
			name: "NodePort addresses count",
			do: func() {
				p.DeleteEndpointSlice(sliceOf(big.Name, "big-2", nil, nil))
				p.UpdateService(bigSvc(ofType(corev1.ServiceTypeNodePort)))
				// 44 before; with a node address, one more entry: its dispatch
				// element, its policy mark, and 15 endpoints: 61 after.
				if err := p.Reconfigure(func(c *tables.Config) { c.NodePortIPs = ips("192.168.0.1", "127.0.0.1") }); err != nil {
					t.Fatal(err)
				}
			},
			full: true, wantRefused: true, wantLogs: 1,
			wantIPs: []string{clusterIP4}, wantGone: []string{bigIP},
		},
	} {
		mu.Lock()
		refusals, built = nil, nil
		mu.Unlock()
		step.do()
		res, err := p.Sync(ctx, false)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if res.Full != step.full {
			t.Errorf("%s: full = %v, want %v", step.name, res.Full, step.full)
		}
		m := p.Applied()[big]
		if m == nil {
			t.Fatalf("%s: no model applied for %s", step.name, big)
		}
		if refused := m.Refused != ""; refused != step.wantRefused {
			t.Errorf("%s: refused = %q, want refused %v", step.name, m.Refused, step.wantRefused)
		}
		if step.wantRefused && (len(m.Ports) != 0 || !strings.Contains(m.Refused, "over the limit of 50 per Service")) {
			t.Errorf("%s: refused model %+v, want no ports and the limit in Refused", step.name, m)
		}
		if w := p.Applied()[webName]; w == nil || w.Refused != "" || len(w.Ports[tables.IPv4]) != 1 {
			t.Errorf("%s: ns/web applied as %+v, want it programmed", step.name, w)
		}
		mu.Lock()
		if len(refusals) != step.wantLogs || step.wantLogs > 0 && !strings.Contains(refusals[0], `"big"`) {
			t.Errorf("%s: refusal logs %q, want %d naming %s", step.name, refusals, step.wantLogs, big)
		}
		if step.wantRefused && strings.Contains(strings.Join(built, " "), big.Name) {
			t.Errorf("%s: the refused Service's model was built", step.name)
		}
		mu.Unlock()
		dump := nft.dump()
		for _, ip := range step.wantIPs {
			if !strings.Contains(dump, ip) {
				t.Errorf("%s: %s not programmed:\n%s", step.name, ip, dump)
			}
		}
		for _, ip := range step.wantGone {
			if strings.Contains(dump, ip) {
				t.Errorf("%s: %s programmed:\n%s", step.name, ip, dump)
			}
		}
	}
}

// TestInstanceCostLimit checks MaxInstanceCost: Services arriving together are admitted
// oldest first whatever their names, one that would take the instance over its limit is
// refused (not programmed, its model says why) while the others are programmed, a
// Service already programmed keeps its place against an older one arriving later, also
// across a full sync, and a refused Service is programmed once room frees, without a
// change of its own.
func TestInstanceCostLimit(t *testing.T) {
	// Each Service: 1 port, 10 endpoints: 1 + 10 + 1 + 10 = 22 elements and 3 rules,
	// 34 units; the limit admits two of them, not three.
	p, nft := newTestProxy(t, nil, func(o *Options) { o.MaxInstanceCost = 70 })
	t0 := metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	add := func(name, ip, subnet string, created metav1.Time) {
		svc := namedAt(name, ip)
		svc.CreationTimestamp, svc.UID = created, types.UID("uid-"+name)
		p.UpdateService(svc)
		p.UpdateEndpointSlice(sliceOf(name, name+"-1", []discoveryv1.EndpointPort{slicePort("http", 8080)}, endpointsOn(subnet, 10)))
	}
	ctx := context.Background()
	sync := func(step string, full bool, programmed, refused []string) {
		t.Helper()
		if _, err := p.Sync(ctx, full); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		applied, dump := p.Applied(), nft.dump()
		for _, n := range programmed {
			if m := applied[types.NamespacedName{Namespace: "ns", Name: n}]; m == nil || m.Refused != "" {
				t.Errorf("%s: %s applied as %+v, want it programmed", step, n, m)
			}
		}
		for _, n := range refused {
			m := applied[types.NamespacedName{Namespace: "ns", Name: n}]
			if m == nil || !strings.Contains(m.Refused, "limit of 70 (maxInstanceCost)") || len(m.Ports) != 0 {
				t.Errorf("%s: %s applied as %+v, want it refused for the instance's limit", step, n, m)
			}
		}
		for ip, n := range map[string]string{"172.30.0.61": "c-middle", "172.30.0.62": "a-young", "172.30.0.63": "z-old", "172.30.0.64": "b-oldest"} {
			if want := slices.Contains(programmed, n); strings.Contains(dump, ip) != want {
				t.Errorf("%s: %s (%s) in the table: %v, want %v", step, ip, n, !want, want)
			}
		}
	}
	add("a-young", "172.30.0.62", "2", metav1.NewTime(t0.Add(2*time.Hour)))
	add("z-old", "172.30.0.63", "3", t0)
	add("c-middle", "172.30.0.61", "1", metav1.NewTime(t0.Add(time.Hour)))
	sync("arriving together: the two oldest", true, []string{"z-old", "c-middle"}, []string{"a-young"})
	// An older Service arriving later waits behind the programmed ones.
	add("b-oldest", "172.30.0.64", "4", metav1.NewTime(t0.Add(-time.Hour)))
	sync("an older one arriving later", false, []string{"z-old", "c-middle"}, []string{"a-young", "b-oldest"})
	sync("and across a full sync", true, []string{"z-old", "c-middle"}, []string{"a-young", "b-oldest"})
	// Room frees: the sync that deletes one queues another, which weighs the refused
	// again (oldest first).
	p.DeleteService(types.NamespacedName{Namespace: "ns", Name: "c-middle"})
	sync("one deleted", false, []string{"z-old"}, []string{"a-young", "b-oldest"})
	select {
	case <-p.trigger:
	default:
		t.Fatal("freeing room queued no sync")
	}
	sync("the oldest refused one takes the room", false, []string{"z-old", "b-oldest"}, []string{"a-young"})
}

// TestAffinityCostGrowth: the cost units of a ClientIP-affinity Service grow with its
// sets and rules, by at least the ratio of their count, so a P-port × E-endpoint one
// is refused before the kernel's quadratic set lookups make it stall every other
// instance: the 120 × 120 one (14,414 sets, 28,840 rules, 27 s of nft -f here)
// is over the default limit, 30 × 30 is under it. Before issue 36 the estimate counted
// its elements only (~14,500 for 120 × 120) and grew no faster than without affinity.
func TestAffinityCostGrowth(t *testing.T) {
	affinitySvc := func(ports, endpoints int, affinity bool) (*corev1.Service, []*discoveryv1.EndpointSlice) {
		svc := service(func(s *corev1.Service) {
			s.Spec.Ports = nil
			for i := range ports {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "p" + strconv.Itoa(i), Port: int32(i + 1), Protocol: corev1.ProtocolTCP})
			}
			if affinity {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			}
		})
		var sp []discoveryv1.EndpointPort
		for i := range ports {
			sp = append(sp, slicePort("p"+strconv.Itoa(i), int32(i+1)))
		}
		eps := make([]discoveryv1.Endpoint, endpoints)
		for i := range eps {
			eps[i] = ep("10.250."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250+1), "node-b")
		}
		return svc, []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, sp, eps...)}
	}
	units := func(ports, endpoints int, affinity bool) int {
		svc, sl := affinitySvc(ports, endpoints, affinity)
		return costEstimate(svc, sl, nil, tables.LBRandom).units()
	}
	// Twice the ports and twice the endpoints: four times the sets and rules (less the
	// per-Service parts that do not grow).
	if small, big := units(30, 30, true), units(60, 60, true); 10*big < 39*small {
		t.Errorf("affinity 60×60 costs %d units, 30×30 %d: want at least 3.9× (its sets and rules)", big, small)
	}
	if plain, aff := units(120, 120, false), units(120, 120, true); aff < 100*plain {
		t.Errorf("affinity 120×120 costs %d units, without affinity %d: want its 14,400 sets (200 units each) counted", aff, plain)
	}
	if u := units(120, 120, true); u <= DefaultMaxServiceElements {
		t.Errorf("affinity 120×120 costs %d units, under the default limit of %d", u, DefaultMaxServiceElements)
	}
	if u := units(30, 30, true); u > DefaultMaxServiceElements {
		t.Errorf("affinity 30×30 costs %d units, over the default limit of %d", u, DefaultMaxServiceElements)
	}
}

// TestPartialSyncSplitOverTransactionBound: the Services of one partial sync that
// together bring more than twice MaxServiceElements cost units are split: the oldest
// are programmed in this transaction, the rest stay dirty, another sync is queued at
// once, and their waiters are answered by the sync that programs them.
func TestPartialSyncSplitOverTransactionBound(t *testing.T) {
	// Each Service: 22 elements and 3 rules, 34 units; the bound is 80: two of them.
	p, nft := newTestProxy(t, nil, func(o *Options) { o.MaxServiceElements = 40 })
	ctx := context.Background()
	if _, err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	t0 := metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	waits := map[string]<-chan struct{}{}
	for i, name := range []string{"young", "old", "middle"} {
		svc := namedAt(name, "172.30.0.7"+strconv.Itoa(i))
		svc.UID = types.UID("uid-" + name)
		svc.CreationTimestamp = map[string]metav1.Time{"old": t0, "middle": metav1.NewTime(t0.Add(time.Hour)), "young": metav1.NewTime(t0.Add(2 * time.Hour))}[name]
		waits[name] = p.UpdateService(svc)
		p.UpdateEndpointSlice(sliceOf(name, name+"-1", []discoveryv1.EndpointPort{slicePort("http", 8080)}, endpointsOn(strconv.Itoa(i+1), 10)))
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	res, err := p.Sync(ctx, false)
	if err != nil || res.Full {
		t.Fatalf("partial sync: full=%v, %v", res != nil && res.Full, err)
	}
	dump := nft.dump()
	for name, ip := range map[string]string{"old": "172.30.0.71", "middle": "172.30.0.72", "young": "172.30.0.70"} {
		if want := name != "young"; strings.Contains(dump, ip) != want || closed(waits[name]) != want {
			t.Errorf("first transaction: %s programmed %v, answered %v; want %v", name, strings.Contains(dump, ip), closed(waits[name]), want)
		}
	}
	select {
	case <-p.trigger:
	default:
		t.Fatal("the split queued no sync")
	}
	if res, err := p.Sync(ctx, false); err != nil || res.Full {
		t.Fatalf("second partial sync: %v", err)
	}
	if !strings.Contains(nft.dump(), "172.30.0.70") || !closed(waits["young"]) {
		t.Errorf("second transaction: young not programmed or not answered")
	}
}

// TestExternalPolicyReadOnce: externalTrafficPolicy Local applies only to Services
// reachable from outside (as upstream); the estimate reads it where the model does, so a
// ClusterIP Service carrying it (which the API refuses, a fake or an old object may not)
// costs what it costs without it.
func TestExternalPolicyReadOnce(t *testing.T) {
	slices := []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4,
		[]discoveryv1.EndpointPort{slicePort("http", 8080)}, append(endpointsOn("2", 4), ep("10.244.1.1", thisNodeName))...)}
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	for _, tc := range []struct {
		name    string
		edits   []func(*corev1.Service)
		applies bool
	}{
		{"ClusterIP", nil, false},
		{"ClusterIP with an externalIP", []func(*corev1.Service){func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.1"} }}, true},
		{"NodePort", []func(*corev1.Service){ofType(corev1.ServiceTypeNodePort)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			with, without := service(append(tc.edits, local)...), service(tc.edits...)
			if got := externalPolicyLocal(with); got != tc.applies {
				t.Fatalf("externalPolicyLocal = %v, want %v", got, tc.applies)
			}
			np := map[tables.Family]int{tables.IPv4: 2}
			a, b := costEstimate(with, slices, np, tables.LBRandom), costEstimate(without, slices, np, tables.LBRandom)
			if tc.applies == (a == b) {
				t.Errorf("estimate with the Local policy %+v, without %+v: want them %s", a, b, map[bool]string{true: "different", false: "equal"}[tc.applies])
			}
		})
	}
}
