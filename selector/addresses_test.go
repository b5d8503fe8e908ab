package selector

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// lastService is a Sink that keeps the last version of each Service it was given.
type lastService struct {
	mu   sync.Mutex
	svcs map[types.NamespacedName]*corev1.Service
}

func (s *lastService) UpdateService(svc *corev1.Service) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.svcs[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = svc
	ch := make(chan struct{})
	close(ch)
	return ch
}

func (s *lastService) DeleteService(name types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.svcs, name)
}

func (s *lastService) UpdateEndpointSlice(*discoveryv1.EndpointSlice) {}
func (s *lastService) DeleteEndpointSlice(*discoveryv1.EndpointSlice) {}

// addresses returns the user addresses the sink programs for a Service: externalIPs,
// then load-balancer IPs.
func (s *lastService) addresses(ns, name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	svc := s.svcs[types.NamespacedName{Namespace: ns, Name: name}]
	if svc == nil {
		return nil
	}
	out := slices.Clone(svc.Spec.ExternalIPs)
	for _, in := range svc.Status.LoadBalancer.Ingress {
		out = append(out, "lb:"+in.IP)
	}
	return out
}

// precedenceFixture is a Dispatcher whose instances all admit every address, so that
// only the address precedence decides, but for "narrow", which admits none.
type precedenceFixture struct {
	d        *Dispatcher
	sinks    map[string]*lastService
	mu       sync.Mutex
	problems []string
}

func newPrecedenceFixture(t *testing.T) *precedenceFixture {
	t.Helper()
	all := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	r, err := NewRouter([]Spec{
		{Name: "default", Default: true, ExternalIPCIDRs: all, LoadBalancerCIDRs: all},
		{Name: "team-a", ProxyNames: []string{"team-a"}, ExternalIPCIDRs: all, LoadBalancerCIDRs: all},
		{Name: "team-b", ProxyNames: []string{"team-b"}, ExternalIPCIDRs: all, LoadBalancerCIDRs: all},
		{Name: "narrow", ProxyNames: []string{"narrow"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &precedenceFixture{sinks: map[string]*lastService{}}
	sinks := map[string]Sink{}
	for _, n := range []string{"default", "team-a", "team-b", "narrow"} {
		f.sinks[n] = &lastService{svcs: map[types.NamespacedName]*corev1.Service{}}
		sinks[n] = f.sinks[n]
	}
	f.d = NewDispatcher(r, sinks, func(string, string) []*discoveryv1.EndpointSlice { return nil }, Events{
		Guarded: func(svc *corev1.Service, inst string, problems []string) {
			f.mu.Lock()
			defer f.mu.Unlock()
			for _, p := range problems {
				f.problems = append(f.problems, svc.Namespace+"/"+svc.Name+": "+p)
			}
		},
	})
	return f
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// svcAt is a Service created at epoch + age minutes, with a cluster IP, port 80/TCP and
// the given externalIPs ("lb:" prefix: a load-balancer ingress IP).
func svcAt(ns, name, proxyName string, age int, clusterIP string, addrs ...string) *corev1.Service {
	svc := service(ns, name, proxyName)
	svc.UID = types.UID(ns + "-" + name)
	svc.CreationTimestamp = metav1.NewTime(epoch.Add(time.Duration(age) * time.Minute))
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = clusterIP, []string{clusterIP}
	svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	for _, a := range addrs {
		if ip, ok := strings.CutPrefix(a, "lb:"); ok {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		} else {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, a)
		}
	}
	return svc
}

func TestAddressPrecedence(t *testing.T) {
	type step struct {
		apply  func(f *precedenceFixture)
		inst   string // where to look
		ns, nm string
		want   []string
	}
	change := func(svc *corev1.Service) func(*precedenceFixture) {
		return func(f *precedenceFixture) { f.d.ServiceChanged(svc) }
	}
	del := func(svc *corev1.Service) func(*precedenceFixture) {
		return func(f *precedenceFixture) { f.d.ServiceDeleted(svc) }
	}
	reserve := func(node []string, cidrs []string) func(*precedenceFixture) {
		return func(f *precedenceFixture) {
			var ips []netip.Addr
			for _, s := range node {
				ips = append(ips, netip.MustParseAddr(s))
			}
			var ps []netip.Prefix
			for _, s := range cidrs {
				ps = append(ps, netip.MustParsePrefix(s))
			}
			f.d.SetReserved(Reserved{NodeIPs: ips, ServiceCIDRs: ps})
		}
	}
	reserveOther := func(r Reserved) func(*precedenceFixture) {
		return func(f *precedenceFixture) { f.d.SetReserved(r) }
	}
	victim := svcAt("b", "victim", "team-b", 10, "10.96.0.10")
	for _, tc := range []struct {
		name        string
		steps       []step
		wantProblem string
	}{
		{
			name: "an externalIP equal to another Service's cluster IP is refused, even from an older Service",
			steps: []step{
				{apply: change(svcAt("a", "evil", "team-a", 1, "10.96.0.20", "10.96.0.10", "192.0.2.1")), inst: "team-a", ns: "a", nm: "evil", want: []string{"10.96.0.10", "192.0.2.1"}},
				{apply: change(victim), inst: "team-a", ns: "a", nm: "evil", want: []string{"192.0.2.1"}},
				{apply: change(victim), inst: "team-b", ns: "b", nm: "victim", want: nil},
			},
			wantProblem: "a/evil: externalIP 10.96.0.10 refused: it is the cluster IP of b/victim",
		},
		{
			name: "the externalIP comes back when the cluster IP's Service is deleted",
			steps: []step{
				{apply: change(victim), inst: "team-b", ns: "b", nm: "victim", want: nil},
				{apply: change(svcAt("a", "evil", "team-a", 20, "10.96.0.20", "10.96.0.10")), inst: "team-a", ns: "a", nm: "evil", want: nil},
				{apply: del(victim), inst: "team-a", ns: "a", nm: "evil", want: []string{"10.96.0.10"}},
			},
		},
		{
			name: "the older claim keeps a shared externalIP whatever the names, within one instance",
			steps: []step{
				{apply: change(svcAt("z", "owner", "", 1, "10.96.0.1", "192.0.2.7")), inst: "default", ns: "z", nm: "owner", want: []string{"192.0.2.7"}},
				{apply: change(svcAt("a", "evil", "", 2, "10.96.0.2", "192.0.2.7")), inst: "default", ns: "a", nm: "evil", want: nil},
				{apply: change(svcAt("a", "evil", "", 2, "10.96.0.2", "192.0.2.7")), inst: "default", ns: "z", nm: "owner", want: []string{"192.0.2.7"}},
			},
			wantProblem: "a/evil: externalIP 192.0.2.7 refused: z/owner claimed it first",
		},
		{
			name: "across instances, and the loser gets the address once the winner lets go",
			steps: []step{
				{apply: change(svcAt("b", "first", "team-b", 1, "10.96.0.1", "lb:198.51.100.5")), inst: "team-b", ns: "b", nm: "first", want: []string{"lb:198.51.100.5"}},
				{apply: change(svcAt("a", "second", "team-a", 2, "10.96.0.2", "198.51.100.5")), inst: "team-a", ns: "a", nm: "second", want: nil},
				{apply: change(svcAt("b", "first", "team-b", 1, "10.96.0.1")), inst: "team-a", ns: "a", nm: "second", want: []string{"198.51.100.5"}},
			},
		},
		{
			name: "equal creation times: the UID decides, not the name",
			steps: []step{
				{apply: change(func() *corev1.Service {
					s := svcAt("a", "aaa", "", 1, "10.96.0.1", "192.0.2.9")
					s.UID = "uid-2"
					return s
				}()), inst: "default", ns: "a", nm: "aaa", want: []string{"192.0.2.9"}},
				{apply: change(func() *corev1.Service {
					s := svcAt("z", "zzz", "", 1, "10.96.0.2", "192.0.2.9")
					s.UID = "uid-1"
					return s
				}()), inst: "default", ns: "a", nm: "aaa", want: nil},
			},
		},
		{
			name: "different ports on one address do not conflict",
			steps: []step{
				{apply: change(svcAt("a", "web", "", 1, "10.96.0.1", "192.0.2.3")), inst: "default", ns: "a", nm: "web", want: []string{"192.0.2.3"}},
				{apply: change(func() *corev1.Service {
					s := svcAt("b", "dns", "", 2, "10.96.0.2", "192.0.2.3")
					s.Spec.Ports[0].Port = 53
					return s
				}()), inst: "default", ns: "b", nm: "dns", want: []string{"192.0.2.3"}},
			},
		},
		{
			name: "a Service no local instance serves claims nothing, however old",
			steps: []step{
				{apply: change(svcAt("a", "squat", "elsewhere", 1, "10.96.0.1", "192.0.2.70")), inst: "team-b", ns: "a", nm: "squat", want: nil},
				{apply: change(svcAt("b", "owner", "team-b", 2, "10.96.0.2", "lb:192.0.2.70")), inst: "team-b", ns: "b", nm: "owner", want: []string{"lb:192.0.2.70"}},
			},
		},
		{
			name: "an address its own instance's ranges refuse claims nothing, however old",
			steps: []step{
				{apply: change(svcAt("a", "squat", "narrow", 1, "10.96.0.1", "192.0.2.71")), inst: "narrow", ns: "a", nm: "squat", want: nil},
				{apply: change(svcAt("b", "owner", "team-b", 2, "10.96.0.2", "lb:192.0.2.71")), inst: "team-b", ns: "b", nm: "owner", want: []string{"lb:192.0.2.71"}},
			},
			wantProblem: `a/squat: externalIP "192.0.2.71" is outside the ranges instance "narrow" allows (tenant.externalIPCIDRs); ignored`,
		},
		{
			name: "node IPs, Service CIDRs, loopback and link-local addresses are refused",
			steps: []step{
				{apply: change(svcAt("a", "s", "", 1, "10.96.0.1", "192.0.2.50", "10.97.0.3", "127.0.0.1", "169.254.1.1", "lb:192.0.2.51")), inst: "default", ns: "a", nm: "s", want: []string{"192.0.2.50", "10.97.0.3", "lb:192.0.2.51"}},
				{apply: reserve([]string{"192.0.2.50"}, []string{"10.96.0.0/12"}), inst: "default", ns: "a", nm: "s", want: []string{"lb:192.0.2.51"}},
				{apply: reserve(nil, nil), inst: "default", ns: "a", nm: "s", want: []string{"192.0.2.50", "10.97.0.3", "lb:192.0.2.51"}},
			},
			wantProblem: "a/s: externalIP 192.0.2.50 refused: it is an address of this node",
		},
		{
			name: "another node's address is refused, and served again once that node lets go of it",
			steps: []step{
				{apply: change(svcAt("a", "s", "", 1, "10.96.0.1", "172.30.0.2", "lb:172.30.0.9")), inst: "default", ns: "a", nm: "s", want: []string{"172.30.0.2", "lb:172.30.0.9"}},
				{apply: reserveOther(Reserved{OtherNodeIPs: []NodeIP{{netip.MustParseAddr("172.30.0.2"), "node-2"}, {netip.MustParseAddr("172.30.0.9"), "node-9"}}}), inst: "default", ns: "a", nm: "s", want: nil},
				{apply: reserveOther(Reserved{OtherNodeIPs: []NodeIP{{netip.MustParseAddr("172.30.0.9"), "node-9"}}}), inst: "default", ns: "a", nm: "s", want: []string{"172.30.0.2"}},
			},
			wantProblem: "a/s: load-balancer IP 172.30.0.9 refused: it is an address of node node-9",
		},
		{
			name: "an address inside reservedCIDRs is refused",
			steps: []step{
				{apply: reserveOther(Reserved{CIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24")}}), inst: "default", ns: "a", nm: "s", want: nil},
				{apply: change(svcAt("a", "s", "", 1, "10.96.0.1", "172.30.0.7", "192.0.2.8")), inst: "default", ns: "a", nm: "s", want: []string{"192.0.2.8"}},
			},
			wantProblem: "a/s: externalIP 172.30.0.7 refused: it is inside the reserved CIDR 172.30.0.0/24 (reservedCIDRs)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newPrecedenceFixture(t)
			for i, st := range tc.steps {
				st.apply(f)
				if got := f.sinks[st.inst].addresses(st.ns, st.nm); !slices.Equal(got, st.want) {
					t.Fatalf("step %d: %s programs %s/%s with %v, want %v", i, st.inst, st.ns, st.nm, got, st.want)
				}
			}
			if tc.wantProblem != "" && !slices.Contains(f.problems, tc.wantProblem) {
				t.Errorf("no event %q; got %q", tc.wantProblem, f.problems)
			}
		})
	}
}

// TestRefusalsReportedOnce: a refused address is reported (an event and a log line by
// the supervisor) when it becomes refused, not again on every update or re-dispatch of
// the Service while it stays refused; a new refusal is reported; one that went and came
// back is reported again.
func TestRefusalsReportedOnce(t *testing.T) {
	f := newPrecedenceFixture(t)
	victim := svcAt("x", "victim", "", 1, "10.96.0.10")
	thief := func(rv string, addrs ...string) *corev1.Service {
		s := svcAt("x", "thief", "team-a", 2, "10.96.0.11", addrs...)
		s.ResourceVersion = rv
		return s
	}
	f.d.ServiceChanged(victim)
	f.d.ServiceChanged(thief("1", "10.96.0.10"))
	f.d.ServiceChanged(thief("2", "10.96.0.10"))
	f.d.SetReserved(Reserved{NodeIPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")}})
	f.d.ServiceChanged(thief("3", "10.96.0.10", "192.168.0.1"))
	f.d.ServiceChanged(thief("4"))
	f.d.ServiceChanged(thief("5", "10.96.0.10"))
	want := []string{
		"x/thief: externalIP 10.96.0.10 refused: it is the cluster IP of x/victim",
		"x/thief: externalIP 10.96.0.10 refused: it is the cluster IP of x/victim",
		"x/thief: externalIP 192.168.0.1 refused: it is an address of this node",
		"x/thief: externalIP 10.96.0.10 refused: it is the cluster IP of x/victim",
	}
	if !slices.Equal(f.problems, want) {
		t.Errorf("reported:\n%s\nwant:\n%s", strings.Join(f.problems, "\n"), strings.Join(want, "\n"))
	}
}

// TestUserAddressInPodCIDRRefused: a load-balancer or external IP inside a pod CIDR would
// take the traffic of the pod that has the address (any pod on the node, and off-node
// clients routed to it); it is refused like a node address.
func TestUserAddressInPodCIDRRefused(t *testing.T) {
	f := newPrecedenceFixture(t)
	f.d.SetReserved(Reserved{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}})
	f.d.ServiceChanged(svcAt("x", "lb", "", 1, "10.96.0.10", "lb:10.244.3.7", "192.0.2.1"))
	want := []string{"x/lb: load-balancer IP 10.244.3.7 refused: it is inside the pod CIDR 10.244.0.0/16"}
	if !slices.Equal(f.problems, want) {
		t.Errorf("reported %q, want %q", f.problems, want)
	}
	if got := f.sinks["default"].addresses("x", "lb"); !slices.Equal(got, []string{"192.0.2.1"}) {
		t.Errorf("served user addresses %q, want only 192.0.2.1", got)
	}
}

// TestArbitrationIndependentOfOrder: whatever order Services and reservation changes
// (other nodes' addresses, reservedCIDRs, this node's) arrive in, each instance ends up
// programming the same user addresses as a Dispatcher that knew the final reservations
// before any Service: an update (a partial sync) and a resync from scratch (a full sync)
// agree.
func TestArbitrationIndependentOfOrder(t *testing.T) {
	final := Reserved{
		NodeIPs:      []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		OtherNodeIPs: []NodeIP{{netip.MustParseAddr("172.30.0.2"), "node-2"}, {netip.MustParseAddr("172.30.0.3"), "node-3"}},
		CIDRs:        []netip.Prefix{netip.MustParsePrefix("198.51.100.0/28")},
	}
	intermediate := []Reserved{
		{},
		{OtherNodeIPs: []NodeIP{{netip.MustParseAddr("172.30.0.4"), "node-4"}}},
		{NodeIPs: []netip.Addr{netip.MustParseAddr("172.30.0.2")}, CIDRs: []netip.Prefix{netip.MustParsePrefix("172.30.0.0/24")}},
	}
	addrs := []string{"172.30.0.2", "lb:172.30.0.3", "172.30.0.4", "198.51.100.5", "lb:198.51.100.20", "192.0.2.1", "192.0.2.9"}
	insts := []string{"", "team-a", "team-b"}
	var svcs []*corev1.Service
	for i := range 9 {
		var mine []string
		for j, a := range addrs {
			if (i+j)%3 != 0 {
				mine = append(mine, a)
			}
		}
		svcs = append(svcs, svcAt("ns", fmt.Sprintf("s%d", i), insts[i%3], i%4, fmt.Sprintf("10.96.0.%d", i+1), mine...))
	}
	ref := newPrecedenceFixture(t)
	ref.d.SetReserved(final)
	for _, s := range svcs {
		ref.d.ServiceChanged(s)
	}
	for seed := int64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewSource(seed))
		f := newPrecedenceFixture(t)
		steps := make([]func(), 0, len(svcs)+len(intermediate)+1)
		for _, s := range svcs {
			steps = append(steps, func() { f.d.ServiceChanged(s) })
		}
		for _, r := range intermediate {
			steps = append(steps, func() { f.d.SetReserved(r) })
		}
		steps = append(steps, func() { f.d.SetReserved(final) })
		rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
		for _, step := range steps {
			step()
		}
		// The supervisor hands over its newest view last; then every verdict must be
		// the reference's, whichever Services came before or after it.
		f.d.SetReserved(final)
		for i, s := range svcs {
			inst := []string{"default", "team-a", "team-b"}[i%3]
			got, want := f.sinks[inst].addresses("ns", s.Name), ref.sinks[inst].addresses("ns", s.Name)
			if !slices.Equal(got, want) {
				t.Errorf("seed %d: %s programs ns/%s with %v, a Dispatcher that knew the reservations first with %v", seed, inst, s.Name, got, want)
			}
		}
	}
}

// TestMetadataService: the cloud metadata addresses that are not link-local are named;
// their neighbours are not.
func TestMetadataService(t *testing.T) {
	for addr, want := range map[string]string{
		"100.100.100.200": "Alibaba Cloud",
		"fd00:ec2::254":   "AWS (IPv6)",
		"fd20:ce::254":    "Google Cloud (IPv6)",
		"100.100.100.201": "",
		"fd00:ec2::255":   "",
		"fd20:ce::253":    "",
		"169.254.169.254": "", // link-local: refused as such
	} {
		if got := metadataService(netip.MustParseAddr(addr)); got != want {
			t.Errorf("metadataService(%s) = %q, want %q", addr, got, want)
		}
	}
}
