package selector

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// countingSink counts the Service updates it is given.
type countingSink struct {
	lastService
	updates atomic.Int64
}

func (s *countingSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	s.updates.Add(1)
	return s.lastService.UpdateService(svc)
}

var allPrefixes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

func noSlices(string, string) []*discoveryv1.EndpointSlice { return nil }

// sharedAddressDispatcher is a Dispatcher with one instance admitting every address, as
// a tenant whose own range holds the shared address.
func sharedAddressDispatcher(t testing.TB) (*Dispatcher, *countingSink) {
	t.Helper()
	r, err := NewRouter([]Spec{{Name: "team-a", ProxyNames: []string{"team-a"},
		ExternalIPCIDRs: allPrefixes, LoadBalancerCIDRs: allPrefixes}})
	if err != nil {
		t.Fatal(err)
	}
	sink := &countingSink{lastService: lastService{svcs: map[types.NamespacedName]*corev1.Service{}}}
	return NewDispatcher(r, map[string]Sink{"team-a": sink}, noSlices, Events{}), sink
}

// TestSharedAddressCostIsLinear: N Services of one tenant listing one externalIP (each
// on its own port, or all on one) are legal, and a change to one of them must cost what
// it changes, not a re-dispatch of all N under the node-wide lock (issue 36: one update
// of one of 1,500 made 1,500 UpdateService calls; creating 1,500 took minutes). Growth,
// not time: creating 4N makes at most ~4× the instance updates of N, and one update
// makes as many updates and allocations at 4N as at N.
func TestSharedAddressCostIsLinear(t *testing.T) {
	const n = 100
	for _, tc := range []struct {
		name string
		port func(i int) int32
	}{
		{"each on its own port", func(i int) int32 { return int32(1000 + i) }},
		{"all on one port", func(int) int32 { return 80 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type cost struct {
				create, update int64
				allocs         float64
			}
			measure := func(count int) cost {
				d, sink := sharedAddressDispatcher(t)
				d.MarkListed()
				svc := func(i int, rv int, extra ...string) *corev1.Service {
					s := svcAt("a", fmt.Sprintf("s%d", i), "team-a", i, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), append([]string{"192.0.2.100"}, extra...)...)
					s.Spec.Ports[0].Port = tc.port(i)
					s.ResourceVersion = strconv.Itoa(rv)
					return s
				}
				for i := range count {
					d.ServiceChanged(svc(i, i+1))
				}
				created := sink.updates.Load()
				// One Service of the middle adds and drops a second address: a change of
				// its claims, each time.
				mid, rv := count/2, count+1
				flip := func() {
					rv++
					if rv%2 == 0 {
						d.ServiceChanged(svc(mid, rv, "192.0.2.101"))
					} else {
						d.ServiceChanged(svc(mid, rv))
					}
				}
				before := sink.updates.Load()
				flip()
				updated := sink.updates.Load() - before
				return cost{create: created, update: updated, allocs: testing.AllocsPerRun(20, flip)}
			}
			small, large := measure(n), measure(4*n)
			t.Logf("N=%d: %d updates to create, %d for one change, %.0f allocs; 4N: %d, %d, %.0f",
				n, small.create, small.update, small.allocs, large.create, large.update, large.allocs)
			if float64(large.create) > 4.4*float64(small.create) {
				t.Errorf("creating 4N Services made %d instance updates, N made %d: super-linear", large.create, small.create)
			}
			if large.update > 2 || small.update > 2 {
				t.Errorf("one change of one Service made %d (N) and %d (4N) instance updates, want at most 2 (itself, and a Service it displaced)", small.update, large.update)
			}
			if large.allocs > 1.5*small.allocs+10 {
				t.Errorf("one change allocates %.0f at 4N, %.0f at N: its cost grows with the Services sharing the address", large.allocs, small.allocs)
			}
		})
	}
}

// TestHolderKeepsAddress: the Service serving an address keeps it until it lets it go.
// A long-existing Service edited to add that address is refused, however old, and gets
// it only once the holder lets go (issue 36: an older Service took an externalIP another
// tenant was serving, and its traffic with it).
func TestHolderKeepsAddress(t *testing.T) {
	f := newPrecedenceFixture(t)
	f.d.MarkListed()
	at := func(s *corev1.Service, rv int) *corev1.Service {
		s.ResourceVersion = strconv.Itoa(rv)
		return s
	}
	attacker := func(rv int, addrs ...string) *corev1.Service {
		return at(svcAt("a", "old", "team-a", 1, "10.96.0.1", addrs...), rv)
	}
	victim := func(rv int, addrs ...string) *corev1.Service {
		return at(svcAt("b", "web", "team-b", 100, "10.96.0.2", addrs...), rv)
	}
	type step struct {
		svc            *corev1.Service
		attack, victim []string
	}
	for i, st := range []step{
		{svc: attacker(10), attack: nil, victim: nil},
		{svc: victim(20, "192.0.2.7"), attack: nil, victim: []string{"192.0.2.7"}},
		{svc: attacker(30, "192.0.2.7"), attack: nil, victim: []string{"192.0.2.7"}},
		// An unrelated update of the holder keeps its place.
		{svc: func() *corev1.Service { s := victim(40, "192.0.2.7"); s.Labels["tier"] = "web"; return s }(), attack: nil, victim: []string{"192.0.2.7"}},
		{svc: victim(50), attack: []string{"192.0.2.7"}, victim: nil},
		{svc: victim(60, "192.0.2.7"), attack: []string{"192.0.2.7"}, victim: nil},
	} {
		f.d.ServiceChanged(st.svc)
		if got := f.sinks["team-a"].addresses("a", "old"); !slices.Equal(got, st.attack) {
			t.Errorf("step %d: a/old is programmed with %v, want %v", i, got, st.attack)
		}
		if got := f.sinks["team-b"].addresses("b", "web"); !slices.Equal(got, st.victim) {
			t.Errorf("step %d: b/web is programmed with %v, want %v", i, got, st.victim)
		}
	}
	if want := "a/old: externalIP 192.0.2.7 refused: b/web claimed it first"; !slices.Contains(f.problems, want) {
		t.Errorf("no event %q; got %q", want, f.problems)
	}
}

// TestNodesAgreeWhicheverStartedFirst: a node running through a capture attempt and a
// node started after it decide the same holder. The late node sees both claims at once
// in its initial list, where the older Service would win; the running nodes' Holdings,
// seeded before its list, make it rank them as they do.
func TestNodesAgreeWhicheverStartedFirst(t *testing.T) {
	attacker := svcAt("a", "old", "team-a", 1, "10.96.0.1")
	attacker.ResourceVersion = "10"
	victim := svcAt("b", "web", "team-b", 100, "10.96.0.2", "lb:192.0.2.7")
	victim.ResourceVersion = "20"
	edited := svcAt("a", "old", "team-a", 1, "10.96.0.1", "192.0.2.7")
	edited.ResourceVersion = "30"

	running := newPrecedenceFixture(t)
	running.d.MarkListed()
	for _, s := range []*corev1.Service{attacker, victim, edited} {
		running.d.ServiceChanged(s)
	}
	holdings := running.d.Holdings()
	if len(holdings) != 1 || holdings[0].UID != victim.UID {
		t.Fatalf("running node's holdings %+v, want 192.0.2.7 TCP/80 held by %s", holdings, victim.UID)
	}
	// Holdings is cached between changes: a change shows at once. The attacker gives
	// the address up (no longer contested), then asks again (contested, victim holds).
	running.d.ServiceChanged(attacker)
	if got := running.d.Holdings(); len(got) != 0 {
		t.Errorf("holdings after the attacker let go: %+v, want none", got)
	}
	running.d.ServiceChanged(edited)
	if got := running.d.Holdings(); len(got) != 1 || got[0].UID != victim.UID {
		t.Errorf("holdings after the attacker asked again: %+v", got)
	}

	for _, tc := range []struct {
		name       string
		seed       bool
		wantVictim []string
	}{
		{"seeded by the running node", true, []string{"lb:192.0.2.7"}},
		// Why the seed is needed: alone, the late node ranks by creation time.
		{"alone", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			late := newPrecedenceFixture(t)
			if tc.seed {
				late.d.SeedHoldings(holdings)
			}
			late.d.ServiceChanged(edited)
			late.d.ServiceChanged(victim)
			late.d.MarkListed()
			if got := late.sinks["team-b"].addresses("b", "web"); !slices.Equal(got, tc.wantVictim) {
				t.Errorf("late node programs b/web with %v, want %v", got, tc.wantVictim)
			}
			if tc.seed {
				for _, inst := range []string{"team-a", "team-b"} {
					for _, name := range []string{"a/old", "b/web"} {
						ns, nm, _ := strings.Cut(name, "/")
						if got, want := late.sinks[inst].addresses(ns, nm), running.sinks[inst].addresses(ns, nm); !slices.Equal(got, want) {
							t.Errorf("%s programs %s with %v on the late node, %v on the running one", inst, name, got, want)
						}
					}
				}
			}
		})
	}
}

// BenchmarkSharedAddress: N Services of one tenant sharing one externalIP, each on its
// own port (issue 36's measure): creating them all, and one change of one of them.
func BenchmarkSharedAddress(b *testing.B) {
	for _, n := range []int{1000, 1500} {
		svc := func(i, rv int, extra ...string) *corev1.Service {
			s := svcAt("a", fmt.Sprintf("s%d", i), "team-a", i, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), append([]string{"192.0.2.100"}, extra...)...)
			s.Spec.Ports[0].Port = int32(1000 + i)
			s.ResourceVersion = strconv.Itoa(rv)
			return s
		}
		b.Run(fmt.Sprintf("create/%d", n), func(b *testing.B) {
			for b.Loop() {
				d, _ := sharedAddressDispatcher(b)
				d.MarkListed()
				for i := range n {
					d.ServiceChanged(svc(i, i+1))
				}
			}
		})
		b.Run(fmt.Sprintf("change-one/%d", n), func(b *testing.B) {
			d, sink := sharedAddressDispatcher(b)
			d.MarkListed()
			for i := range n {
				d.ServiceChanged(svc(i, i+1))
			}
			rv := n + 1
			start := sink.updates.Load()
			for b.Loop() {
				rv++
				if rv%2 == 0 {
					d.ServiceChanged(svc(n/2, rv, "192.0.2.101"))
				} else {
					d.ServiceChanged(svc(n/2, rv))
				}
			}
			b.ReportMetric(float64(sink.updates.Load()-start)/float64(b.N), "updates/op")
		})
	}
}
