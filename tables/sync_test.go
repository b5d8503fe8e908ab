package tables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// generated returns n Services with two endpoints each and a mix of features.
func generated(n int) map[ServiceName][]*ServicePort { return generatedWith(n, 2) }

// generatedWith is n generated Services of one port with endpoints endpoints each.
func generatedWith(n, endpoints int) map[ServiceName][]*ServicePort {
	out := map[ServiceName][]*ServicePort{}
	for i := 0; i < n; i++ {
		out[ServiceName{"gen", fmt.Sprintf("svc-%d", i)}] = []*ServicePort{genPort(i, endpoints)}
	}
	return out
}

func genPort(i, endpoints int) *ServicePort {
	ip := netip.AddrFrom4([4]byte{172, 30, byte(i >> 8), byte(i)})
	p := &ServicePort{
		Name:      ServicePortName{Namespace: "gen", Name: fmt.Sprintf("svc-%d", i)},
		Protocol:  []Protocol{TCP, UDP}[i%2],
		Port:      80,
		ClusterIP: ip,
	}
	if i%3 == 0 {
		p.NodePort = uint16(30000 + i%2000)
	}
	if i%5 == 0 {
		p.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 168, byte(200 + i>>8%50), byte(i)})}
		p.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.100.0/24")}
		p.ExternalLocal = i%10 == 0
	}
	if i%7 == 0 {
		p.AffinityTimeout = 10800e9
	}
	for e := 0; e < endpoints; e++ {
		ep := Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, byte(e), byte(i)}), Port: 8080}
		p.ClusterEndpoints = append(p.ClusterEndpoints, ep)
		if e == 0 {
			p.LocalEndpoints = append(p.LocalEndpoints, ep)
		}
	}
	p.HasEndpoints = endpoints > 0
	return p
}

// withGenMode gives a generated port the mode of its number: random, roundRobin and
// sourceHash in turn, with and without affinity, Local policies and firewalls.
func withGenMode(p *ServicePort) {
	var i int
	fmt.Sscanf(p.Name.Name, "svc-%d", &i)
	p.LoadBalancing = []LBMode{LBRandom, LBRoundRobin, LBSourceHash}[i%3]
}

// consistentSvc3 makes svc-3 (a NodePort Service) consistentHash, where present in
// ports. Only for the kernel: its 256 elements per entry make knftables' Fake, which
// compares each new element with every element of its map, 50 times slower.
func consistentSvc3(ports map[ServiceName][]*ServicePort) {
	for _, p := range ports[ServiceName{"gen", "svc-3"}] {
		p.LoadBalancing = LBConsistentHash
	}
}

// countingNFT counts List calls: a partial sync must never list the table.
type countingNFT struct {
	*knftables.Fake
	lists int
}

func (c *countingNFT) List(ctx context.Context, objectType string) ([]string, error) {
	c.lists++
	return c.Fake.List(ctx, objectType)
}

func TestPartialSyncCostIndependentOfClusterSize(t *testing.T) {
	ops := map[int]int{}
	for _, n := range []int{10, 1000} {
		nft := &countingNFT{Fake: knftables.NewFake(knftables.IPv4Family, "shardproxy-test")}
		s, err := NewSyncer(testConfig(IPv4), nft)
		if err != nil {
			t.Fatal(err)
		}
		all := generated(n)
		fullSync(t, s, all)
		if nft.lists == 0 {
			t.Fatal("the full sync listed nothing: the List counter is not wired")
		}
		nft.lists = 0
		name := ServiceName{"gen", "svc-4"} // plain ClusterIP, TCP
		stats, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{name: {genPort(4, 3)}})
		if err != nil {
			t.Fatal(err)
		}
		ops[n] = stats.Operations
		// Deleting a Service with affinity chains and sets, and adding it back, must not
		// list either.
		aff := ServiceName{"gen", "svc-7"}
		for _, change := range []map[ServiceName][]*ServicePort{{aff: nil}, {aff: {genPort(7, 2)}}} {
			if _, err := s.Partial(context.Background(), change); err != nil {
				t.Fatal(err)
			}
		}
		if nft.lists != 0 {
			t.Errorf("%d Services: partial syncs listed the table %d times; they must work from memory", n, nft.lists)
		}
	}
	if ops[10] != ops[1000] || ops[10] == 0 {
		t.Errorf("one changed endpoint costs %d operations among 10 Services and %d among 1000; want equal and non-zero", ops[10], ops[1000])
	}
}

// TestPartialEqualsFull applies random changes with partial syncs and checks the table
// always holds exactly what a fresh full sync of the same Services would write. It runs
// through both appliers: nft alone, and nft plus a direct applier that takes the Diffs
// needing no rule text; on knftables' Fake (one element per command) and on the real
// kernel (many elements per command, the NetlinkWriter).
func TestPartialEqualsFull(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kernel bool
		direct bool
		steps  int
	}{
		{"fake, nft", false, false, 200},
		{"fake, nft and direct", false, true, 200},
		{"kernel, nft", true, false, 40},
		{"kernel, nft and netlink", true, true, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.kernel {
				requireRoot(t)
			}
			target := newSyncTarget(t, tc.kernel, tc.direct)
			ref := newSyncTarget(t, tc.kernel, false)
			rng := rand.New(rand.NewSource(int64(len(tc.name))))
			state := generated(40)
			for _, ports := range state {
				withGenMode(ports[0])
			}
			if tc.kernel {
				consistentSvc3(state)
			}
			fullSync(t, target.s, state)
			if tc.kernel {
				tc.steps = testutil.Steps(tc.steps)
			}
			direct := 0
			for step := 0; step < tc.steps; step++ {
				changes := randomChanges(rng, state, IPv4)
				if tc.kernel {
					consistentSvc3(changes)
				}
				stats, err := target.s.Partial(context.Background(), changes)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if stats.Direct {
					direct++
				}
				ref.fresh(t)
				fullSync(t, ref.s, state)
				if diff := cmp.Diff(ref.content(t), target.content(t)); diff != "" {
					t.Fatalf("step %d (direct: %v): partial sync diverged from a full sync (-full +partial):\n%s", step, stats.Direct, diff)
				}
			}
			// With a direct applier, most steps only move elements; those with new affinity
			// or pick chains need nft.
			if tc.direct && (direct < tc.steps/4 || direct == tc.steps) {
				t.Errorf("%d of %d partial syncs went through the direct applier; want most but not all", direct, tc.steps)
			}
			if !tc.direct && direct > 0 {
				t.Errorf("%d partial syncs claim to be direct without a direct applier", direct)
			}
			if w, ok := target.direct.(*fakeNetlink); ok && w.applied > direct {
				t.Errorf("the direct applier got %d Diffs for %d direct syncs", w.applied, direct)
			}
		})
	}
}

// syncTarget is a Syncer with a way to read back what its table holds.
type syncTarget struct {
	s       *Syncer
	direct  Applier
	content func(t *testing.T) string
	// fresh empties the table, so the next full sync starts from nothing.
	fresh func(t *testing.T)
}

// newSyncTarget returns a Syncer for testConfig(IPv4) on a Fake or in a new network
// namespace, with a direct applier if asked.
func newSyncTarget(t *testing.T, kernel, direct bool) *syncTarget {
	t.Helper()
	cfg := testConfig(IPv4)
	if !kernel {
		s, fake := newFake(t, cfg)
		target := &syncTarget{s: s, content: func(*testing.T) string { return contentDump(fake) }}
		target.fresh = func(t *testing.T) {
			s2, fake2 := newFake(t, cfg)
			*target = syncTarget{s: s2, fresh: target.fresh, content: func(*testing.T) string { return contentDump(fake2) }}
		}
		if direct {
			target.direct = &fakeNetlink{fake: fake}
			s.SetDirect(target.direct)
		}
		return target
	}
	ns := newNetns(t)
	s := kernelSyncer(t, ns, cfg)
	if direct {
		s = netlinkSyncer(t, ns, cfg)
	}
	return &syncTarget{
		s:       s,
		direct:  s.direct,
		content: func(t *testing.T) string { return strings.Join(kernelContent(t, ns, IPv4, cfg.TableName()), "\n") },
		fresh: func(t *testing.T) {
			if err := DeleteTable(context.Background(), kernelNFT(t, ns, IPv4, cfg.TableName())); err != nil {
				t.Fatal(err)
			}
		},
	}
}

func TestUnusedPickChainsAreRemoved(t *testing.T) {
	s, fake := newFake(t, testConfig(IPv4))
	p := genPort(1, 3)
	fullSync(t, s, services(p))
	if fake.Table.Chains[pickChainFor(LBRandom, false, 3)] == nil {
		t.Fatal("pick-3 missing")
	}
	p2 := genPort(1, 2)
	if _, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-1"}: {p2}}); err != nil {
		t.Fatal(err)
	}
	if fake.Table.Chains[pickChainFor(LBRandom, false, 3)] != nil {
		t.Error("pick-3 survived although no Service has 3 endpoints")
	}
	if fake.Table.Chains[pickChainFor(LBRandom, false, 2)] == nil {
		t.Error("pick-2 missing")
	}
}

// TestOlderClaimKeepsContestedEntry: of two Services wanting one entry, the older claim
// serves it, whatever the names and whichever arrives first: a younger Service that got
// there first is evicted when the older one arrives.
func TestOlderClaimKeepsContestedEntry(t *testing.T) {
	young := genPort(1, 1) // gen/svc-1: first by name
	young.ExternalIPs = []netip.Addr{addr("192.168.200.1")}
	young.Claim = Claim{Created: time.Unix(2000, 0), UID: "b"}
	old := genPort(2, 1) // gen/svc-2
	old.Protocol, old.ExternalIPs = young.Protocol, young.ExternalIPs
	old.Claim = Claim{Created: time.Unix(1000, 0), UID: "a"}
	servedByOld := "map endpoints-udp 192.168.200.1 . 80 . 0 : 10.244.0.2 . 8080"

	s, fake := newFake(t, testConfig(IPv4))
	fullSync(t, s, services(young, old))
	if dump := contentDump(fake); !contains(dump, servedByOld) {
		t.Errorf("full sync: the older claim does not serve the entry:\n%s", dump)
	}

	s, fake = newFake(t, testConfig(IPv4))
	fullSync(t, s, services(young))
	if _, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-2"}: {old}}); err != nil {
		t.Fatal(err)
	}
	if dump := contentDump(fake); !contains(dump, servedByOld) {
		t.Errorf("partial sync: the older claim arriving second does not take the entry:\n%s", dump)
	}
	assertEqualsFull(t, fake, services(young, old))
}

func TestConflictingEntriesFirstServiceKeepsThem(t *testing.T) {
	a := genPort(1, 1)
	a.ExternalIPs = []netip.Addr{addr("192.168.200.1")}
	b := genPort(2, 1)
	b.Protocol = a.Protocol
	b.ExternalIPs = []netip.Addr{addr("192.168.200.1")}
	s, fake := newFake(t, testConfig(IPv4))
	stats := fullSync(t, s, services(a, b))
	if len(stats.Conflicts) != 1 {
		t.Fatalf("want one conflict reported, got %q", stats.Conflicts)
	}
	dump := contentDump(fake)
	for _, want := range []string{
		"map service-ips 192.168.200.1 . udp . 80 : goto pick-1",
		"map endpoints-udp 192.168.200.1 . 80 . 0 : 10.244.0.1 . 8080",
		"map service-ips 172.30.0.2 . udp . 80 : goto pick-1", // b's own cluster IP still works
	} {
		if !contains(dump, want) {
			t.Errorf("missing %q in\n%s", want, dump)
		}
	}

	// Once a is gone, b serves the external IP at once, not at the next full sync.
	stats, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-1"}: nil})
	if err != nil {
		t.Fatal(err)
	}
	dump = contentDump(fake)
	for _, want := range []string{
		"map service-ips 192.168.200.1 . udp . 80 : goto pick-1",
		"map endpoints-udp 192.168.200.1 . 80 . 0 : 10.244.0.2 . 8080",
	} {
		if !contains(dump, want) {
			t.Errorf("after deleting the winner: missing %q in\n%s", want, dump)
		}
	}
	if len(stats.Conflicts) != 0 {
		t.Errorf("no conflict is left, got %q", stats.Conflicts)
	}
	assertEqualsFull(t, fake, services(b))
}

// assertEqualsFull checks the table holds exactly what a fresh full sync of state writes.
func assertEqualsFull(t *testing.T, fake *knftables.Fake, state map[ServiceName][]*ServicePort) {
	t.Helper()
	ref, refFake := newFake(t, testConfig(IPv4))
	fullSync(t, ref, state)
	if diff := cmp.Diff(contentDump(refFake), contentDump(fake)); diff != "" {
		t.Errorf("partial sync diverged from a full sync (-full +partial):\n%s", diff)
	}
}

// TestConflictLoserRegainsEntries: when the Service serving a contested entry lets go of
// it in a partial sync, a Service that lost the entry serves it in the same transaction,
// and the table is what a full sync would write.
func TestConflictLoserRegainsEntries(t *testing.T) {
	shared := addr("192.168.200.1")
	// port is a TCP Service port with its own cluster IP and one endpoint, on the shared
	// external IP.
	port := func(name string, i int, mods ...func(*ServicePort)) *ServicePort {
		p := &ServicePort{
			Name:             ServicePortName{Namespace: "ns", Name: name, Port: "http"},
			Protocol:         TCP,
			Port:             80,
			ClusterIP:        netip.AddrFrom4([4]byte{172, 30, 1, byte(i)}),
			ExternalIPs:      []netip.Addr{shared},
			ClusterEndpoints: []Endpoint{{IP: netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}), Port: 8080}},
			HasEndpoints:     true,
		}
		for _, m := range mods {
			m(p)
		}
		return p
	}
	svc := func(ports ...*ServicePort) []*ServicePort { return ports }
	name := func(n string) ServiceName { return ServiceName{"ns", n} }
	noExternal := func(p *ServicePort) { p.ExternalIPs = nil }
	nodePort := func(p *ServicePort) { p.ExternalIPs, p.NodePort = nil, 30080 }
	endpoints := func(n int) func(*ServicePort) {
		return func(p *ServicePort) {
			p.ClusterEndpoints = nil
			for e := 0; e < n; e++ {
				p.ClusterEndpoints = append(p.ClusterEndpoints, Endpoint{IP: netip.AddrFrom4([4]byte{10, 244, 2, byte(e)}), Port: 8080})
			}
		}
	}
	affinity := func(p *ServicePort) { p.AffinityTimeout = 300e9 }
	served := func(i int) string {
		return fmt.Sprintf("map endpoints-tcp 192.168.200.1 . 80 . 0 : 10.244.1.%d . 8080", i)
	}

	cases := []struct {
		name    string
		initial map[ServiceName][]*ServicePort
		steps   []map[ServiceName][]*ServicePort
		// want must be in the table at the end, unwanted must not.
		want, unwanted []string
	}{
		{
			name:    "winner deleted: the loser serves the external IP",
			initial: map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2))},
			steps:   []map[ServiceName][]*ServicePort{{name("a"): nil}},
			want:    []string{served(2)},
		},
		{
			name:    "winner drops the external IP: the loser serves it",
			initial: map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2))},
			steps:   []map[ServiceName][]*ServicePort{{name("a"): svc(port("a", 1, noExternal))}},
			want:    []string{served(2), "map service-ips 172.30.1.1 . tcp . 80 : goto pick-1"},
		},
		{
			name: "two losers: the first by name takes it, then the other",
			initial: map[ServiceName][]*ServicePort{
				name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2)), name("c"): svc(port("c", 3))},
			steps:    []map[ServiceName][]*ServicePort{{name("a"): nil}, {name("b"): nil}},
			want:     []string{served(3)},
			unwanted: []string{served(2)},
		},
		{
			name:     "loser deleted before the winner: nothing is left",
			initial:  map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2))},
			steps:    []map[ServiceName][]*ServicePort{{name("b"): nil}, {name("a"): nil}},
			unwanted: []string{"192.168.200.1"},
		},
		{
			name:    "loser changed while losing: its latest ports are served",
			initial: map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2))},
			steps: []map[ServiceName][]*ServicePort{
				{name("b"): svc(port("b", 2, endpoints(2)))},
				{name("a"): nil},
			},
			want: []string{"map service-ips 192.168.200.1 . tcp . 80 : goto pick-2",
				"map endpoints-tcp 192.168.200.1 . 80 . 1 : 10.244.2.1 . 8080"},
		},
		{
			name:    "winner deleted and loser changed in one sync",
			initial: map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2))},
			steps:   []map[ServiceName][]*ServicePort{{name("a"): nil, name("b"): svc(port("b", 2, endpoints(2)))}},
			want:    []string{"map endpoints-tcp 192.168.200.1 . 80 . 1 : 10.244.2.1 . 8080"},
		},
		{
			name: "shared NodePort",
			initial: map[ServiceName][]*ServicePort{
				name("a"): svc(port("a", 1, nodePort)), name("b"): svc(port("b", 2, nodePort))},
			steps: []map[ServiceName][]*ServicePort{{name("a"): nil}},
			want:  []string{"map endpoints-tcp 192.168.100.1 . 30080 . 0 : 10.244.1.2 . 8080"},
		},
		{
			name:    "loser with affinity",
			initial: map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2, affinity))},
			steps:   []map[ServiceName][]*ServicePort{{name("a"): nil}},
			want:    []string{"map service-ips 192.168.200.1 . tcp . 80 : goto pick-aff-cip-"},
		},
		{
			name: "loser of one port out of two",
			initial: map[ServiceName][]*ServicePort{
				name("a"): svc(port("a", 1)),
				name("b"): svc(port("b", 2), port("b", 2, func(p *ServicePort) {
					p.Name.Port, p.Port = "https", 443
				})),
			},
			steps: []map[ServiceName][]*ServicePort{{name("a"): nil}},
			want:  []string{served(2), "map endpoints-tcp 192.168.200.1 . 443 . 0 : 10.244.1.2 . 8080"},
		},
		{
			name:     "loser deleted and back: the current server keeps the entry",
			initial:  map[ServiceName][]*ServicePort{name("a"): svc(port("a", 1)), name("b"): svc(port("b", 2))},
			steps:    []map[ServiceName][]*ServicePort{{name("b"): nil}, {name("b"): svc(port("b", 2))}},
			want:     []string{served(1)},
			unwanted: []string{served(2)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nft := &countingNFT{Fake: knftables.NewFake(knftables.IPv4Family, "shardproxy-test")}
			s, err := NewSyncer(testConfig(IPv4), nft)
			if err != nil {
				t.Fatal(err)
			}
			state := maps.Clone(tc.initial)
			fullSync(t, s, state)
			nft.lists = 0
			for i, step := range tc.steps {
				if _, err := s.Partial(context.Background(), step); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for n, ports := range step {
					if ports == nil {
						delete(state, n)
					} else {
						state[n] = ports
					}
				}
				assertEqualsFull(t, nft.Fake, state)
			}
			if nft.lists != 0 {
				t.Errorf("partial syncs listed the table %d times", nft.lists)
			}
			dump := contentDump(nft.Fake)
			for _, want := range tc.want {
				if !contains(dump, want) {
					t.Errorf("missing %q in\n%s", want, dump)
				}
			}
			for _, bad := range tc.unwanted {
				if contains(dump, bad) {
					t.Errorf("unexpected %q in\n%s", bad, dump)
				}
			}
		})
	}
}

// failingNFT fails every Run after the first n.
type failingNFT struct {
	*knftables.Fake
	okRuns int
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.okRuns <= 0 {
		return errors.New("nft exploded")
	}
	f.okRuns--
	return f.Fake.Run(ctx, tx)
}

func TestFailedSyncForcesFullSync(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, "shardproxy-test")
	nft := &failingNFT{Fake: fake, okRuns: 1}
	s, err := NewSyncer(testConfig(IPv4), nft)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Full(context.Background(), generated(3)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-1"}: nil}); err == nil {
		t.Fatal("want the partial sync to fail")
	}
	if !s.NeedsFull() {
		t.Fatal("after a failed sync the state is unknown: a full sync must be needed")
	}
	if _, err := s.Partial(context.Background(), nil); !errors.Is(err, ErrNeedFullSync) {
		t.Errorf("partial before full: want ErrNeedFullSync, got %v", err)
	}
	// A plain full sync repairs a failed partial one, keeping the table.
	nft.okRuns = 1
	if _, err := s.Full(context.Background(), generated(2)); err != nil {
		t.Fatal(err)
	}
	if tx := fake.LastTransaction.String(); contains(tx, "delete table") {
		t.Errorf("a full sync after a failed partial one should not recreate the table:\n%s", tx)
	}
	// After a failed full sync (e.g. a table of an older layout) the next one recreates
	// the table, in the same transaction.
	if _, err := s.Full(context.Background(), generated(2)); err == nil {
		t.Fatal("want the full sync to fail")
	}
	nft.okRuns = 1
	if _, err := s.Full(context.Background(), generated(2)); err != nil {
		t.Fatal(err)
	}
	if tx := fake.LastTransaction.String(); !contains(tx, "delete table") {
		t.Errorf("a full sync after a failed full one must recreate the table atomically:\n%s", tx)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestPartialEqualsFullWithConflicts applies random changes to Services that fight over
// a few external IPs and NodePorts, with random claim ages (some equal, so the name
// breaks ties): after every partial sync the table is exactly what a full sync of the
// same Services writes, so the same Service serves each contested entry, the oldest
// claim, however the changes arrived.
func TestPartialEqualsFullWithConflicts(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) { partialEqualsFullWithConflicts(t, seed, LBRandom, 300, 1, conflictOpts{}) })
	}
	// roundRobin and ClientIP affinity put rules into shared bucket chains, reached
	// from the contested external entries through the cluster IP's (pick-rr-cip,
	// pick-aff-cip) unless the cluster IP entry was lost; with shared cluster IPs an
	// older claim takes a younger port's cluster IP entry, and so its place in the
	// bucket, within one change. The direct applier checks the buckets' deltas
	// (positions of removed rules) against the table.
	for seed := int64(1); seed <= 4; seed++ {
		for _, opts := range []conflictOpts{
			{},
			{affinity: true},
			{sharedClusterIPs: true, direct: true},
			{affinity: true, sharedClusterIPs: true, direct: true},
		} {
			t.Run(fmt.Sprintf("roundRobin seed %d %+v", seed, opts), func(t *testing.T) {
				partialEqualsFullWithConflicts(t, seed, LBRoundRobin, 150, 1, opts)
			})
		}
	}
	// consistentHash entries keep their tables as one record each (slotTable); entries
	// handed from Service to Service within one change must still come out right. Fewer
	// checks: the Fake is slow with 256 elements per entry (a wrong element stays wrong).
	// Seeds 4 and 5 hand tables over within one change (a slotChanges that drops them
	// fails at steps 29 and 49).
	for _, seed := range []int64{4, 5} {
		t.Run(fmt.Sprintf("consistentHash seed %d", seed), func(t *testing.T) {
			partialEqualsFullWithConflicts(t, seed, LBConsistentHash, 60, 5, conflictOpts{})
		})
	}
}

// conflictOpts vary partialEqualsFullWithConflicts: ClientIP affinity on two ports of
// three; half the ports on three shared cluster IPs; a direct applier (fakeNetlink)
// beside nft, and a full sync every 13 steps between the partial ones.
type conflictOpts struct {
	affinity, sharedClusterIPs, direct bool
}

func partialEqualsFullWithConflicts(t *testing.T, seed int64, mode LBMode, steps, every int, opts conflictOpts) {
	rng := rand.New(rand.NewSource(seed))
	shared := []netip.Addr{addr("192.168.200.1"), addr("192.168.200.2"), addr("192.168.200.3")}
	gen := func(i int) *ServicePort {
		p := genPort(i, rng.Intn(3))
		if opts.sharedClusterIPs && rng.Intn(2) == 0 {
			p.ClusterIP = netip.AddrFrom4([4]byte{172, 30, 0, byte(i % 3)})
		}
		p.Protocol, p.LoadBalancerIPs, p.SourceRanges, p.NodePort = TCP, nil, nil, 0
		for _, a := range shared {
			if rng.Intn(2) == 0 {
				p.ExternalIPs = append(p.ExternalIPs, a)
			}
		}
		if rng.Intn(3) == 0 {
			p.NodePort = uint16(30080 + rng.Intn(2))
		}
		// A Service keeps its claim across changes, as its creation time and UID do.
		p.Claim = Claim{Created: time.Unix(int64(1000+i%4), 0), UID: fmt.Sprintf("uid-%d", (i*7)%10)}
		p.LoadBalancing = mode
		if opts.affinity && rng.Intn(3) != 0 {
			p.AffinityTimeout = 300 * time.Second
		}
		if (mode == LBConsistentHash || mode == LBRoundRobin) && rng.Intn(2) == 0 {
			// Local external entries get tables of their own (not the cluster IP's),
			// and those are the entries contested here.
			p.ExternalLocal, p.LocalEndpoints = true, slices.Clone(p.ClusterEndpoints)
		}
		return p
	}
	s, fake := newFake(t, testConfig(IPv4))
	if opts.direct {
		s.SetDirect(&fakeNetlink{fake: fake})
	}
	state := map[ServiceName][]*ServicePort{}
	for i := 0; i < 8; i++ {
		state[ServiceName{"gen", fmt.Sprintf("svc-%d", i)}] = []*ServicePort{gen(i)}
	}
	fullSync(t, s, state)
	contested := 0
	for step := 0; step < steps; step++ {
		changes := map[ServiceName][]*ServicePort{}
		for k := 0; k < 1+rng.Intn(2); k++ {
			i := rng.Intn(10)
			name := ServiceName{"gen", fmt.Sprintf("svc-%d", i)}
			if rng.Intn(3) == 0 {
				changes[name] = nil
				delete(state, name)
				continue
			}
			changes[name] = []*ServicePort{gen(i)}
			state[name] = changes[name]
		}
		if opts.direct && step%13 == 12 {
			fullSync(t, s, state)
		}
		stats, err := s.Partial(context.Background(), changes)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		contested += len(stats.Conflicts)
		if step%every != every-1 && step != steps-1 {
			continue
		}
		ref, refFake := newFake(t, testConfig(IPv4))
		fullSync(t, ref, state)
		if diff := cmp.Diff(contentDump(refFake), contentDump(fake)); diff != "" {
			t.Fatalf("step %d: partial sync diverged from a full sync (-full +partial):\n%s", step, diff)
		}
	}
	if contested < steps/6 {
		t.Fatalf("only %d conflicts in %d steps: the test would prove little", contested, steps)
	}
}

// TestRestartOverExistingTable: a new Syncer (a restarted instance) knows nothing of the
// table it finds; its first full sync deletes the pick and affinity chains and the
// affinity sets nothing needs any more, keeps the affinity sets still in use with their
// clients, and leaves exactly what a sync into an empty table writes.
func TestRestartOverExistingTable(t *testing.T) {
	fake := knftables.NewFake(knftables.IPv4Family, "shardproxy-test")
	before, err := NewSyncer(testConfig(IPv4), fake)
	if err != nil {
		t.Fatal(err)
	}
	sticky := func(endpoints int) *ServicePort {
		p := genPort(7, endpoints)
		p.AffinityTimeout = 600e9
		return p
	}
	gone := genPort(1, 3) // the only Service with 3 endpoints: pick-3
	goneSticky := genPort(3, 2)
	goneSticky.AffinityTimeout = 300e9
	// affPrefix starts the names of a port's affinity chains and sets.
	affPrefix := func(p *ServicePort) string {
		spn := p.Name
		spn.Protocol = p.Protocol
		return affinityPrefix + portID(spn, p.AffinityTimeout) + "-"
	}
	old := map[ServiceName][]*ServicePort{
		{"gen", "svc-1"}: {gone},
		{"gen", "svc-2"}: {genPort(2, 4)},
		{"gen", "svc-3"}: {goneSticky},
		{"gen", "svc-7"}: {sticky(2)},
	}
	fullSync(t, before, old)
	// The affinity sets of svc-3 must go with it; those of svc-7 stay.
	var goneSets, keptSets []string
	for name := range fake.Table.Sets {
		if !strings.HasPrefix(name, affinityPrefix) {
			continue
		}
		if strings.HasPrefix(name, affPrefix(sticky(2))) {
			keptSets = append(keptSets, name)
		} else {
			goneSets = append(goneSets, name)
		}
	}
	if len(goneSets) == 0 || len(keptSets) == 0 || fake.Table.Chains[pickChainFor(LBRandom, false, 3)] == nil || fake.Table.Chains[pickChainFor(LBRandom, false, 4)] == nil {
		t.Fatalf("setup: want affinity sets of both Services, pick-3 and pick-4, got sets %v %v", goneSets, keptSets)
	}
	// A client pinned by the kernel before the restart.
	pinned := &knftables.Element{Key: []string{"10.244.9.9"}}
	if err := fake.Run(context.Background(), func() *knftables.Transaction {
		tx := fake.NewTransaction()
		tx.Add(&knftables.Element{Set: keptSets[0], Key: pinned.Key})
		return tx
	}()); err != nil {
		t.Fatal(err)
	}

	after, err := NewSyncer(testConfig(IPv4), fake)
	if err != nil {
		t.Fatal(err)
	}
	now := map[ServiceName][]*ServicePort{
		{"gen", "svc-7"}: {sticky(2)},
		{"gen", "svc-8"}: {genPort(8, 2)},
	}
	fullSync(t, after, now)
	for _, st := range goneSets {
		if fake.Table.Sets[st] != nil {
			t.Errorf("affinity set %s of a deleted Service survived the restart", st)
		}
	}
	for name := range fake.Table.Chains {
		if name == pickChainFor(LBRandom, false, 3) || name == pickChainFor(LBRandom, false, 4) || strings.HasPrefix(name, affPrefix(goneSticky)) {
			t.Errorf("chain %s, which nothing uses, survived the restart", name)
		}
	}
	if set := fake.Table.Sets[keptSets[0]]; set == nil || len(set.Elements) != 1 || set.Elements[0].Key[0] != pinned.Key[0] {
		t.Errorf("the pinned client of a Service still there was forgotten: %+v", set)
	}
	// Apart from the pinned client, the table is what a first sync writes.
	fake.Table.Sets[keptSets[0]].Elements = nil
	assertEqualsFull(t, fake, now)
	// And the restarted Syncer carries on with partial syncs from its own memory.
	if _, err := after.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-7"}: nil}); err != nil {
		t.Fatal(err)
	}
	delete(now, ServiceName{"gen", "svc-7"})
	assertEqualsFull(t, fake, now)
}

// TestElementIDsRoundTrip: the Syncer keeps only element ids and rebuilds elements from
// them when it writes; every element the features compile to (maps with verdicts and
// concatenations, sets, affinity) must come back exactly, in both families.
func TestElementIDsRoundTrip(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		cfg := testConfig(fam)
		c := newCompiler(&cfg)
		n := 0
		for _, ports := range featureServices(fam) {
			for _, sp := range ports {
				comp := c.compile(sp, func(string) bool { return true })
				all := slices.Clone(comp.shared)
				for _, ee := range comp.entries {
					all = append(all, ee.allIDs(c.slotPrefix)...)
				}
				for _, id := range all {
					n++
					e := elementFromID(id)
					if got := e.id(); got != id {
						t.Errorf("%s: element id %s came back as %s", fam, idString(id), idString(got))
					}
					for _, part := range slices.Concat([]string{e.set}, e.key, e.value) {
						if part == "" {
							t.Errorf("%s: element %s has an empty part", fam, idString(id))
						}
					}
					if e.isMap != (len(e.value) > 0) {
						t.Errorf("%s: element %s: map %v with value %q", fam, idString(id), e.isMap, e.value)
					}
				}
			}
		}
		if n < 50 {
			t.Errorf("%s: only %d elements checked", fam, n)
		}
	}
}

// TestElementIDFields: each part of an element comes back from its id as the very text
// it was, whatever its form: only canonical addresses and numbers are stored as binary.
func TestElementIDFields(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    element
	}{
		{"endpoint map element", element{set: endpointsMap(mapEndpoints, TCP), isMap: true,
			key: []string{"10.96.0.1", "80", "3"}, value: []string{"10.244.0.9", "8080"}}},
		{"verdict", element{set: mapServiceIPs, isMap: true, key: []string{"fd00::1", "udp", "65535"}, value: []string{"goto pick-10"}}},
		{"set of an unknown name", element{set: "some-set", key: []string{"1.2.3.4", "1.2.3.4"}}},
		{"non-canonical text stays text", element{set: setFirewallAllow,
			key: []string{"010.0.0.1", "FD00::1", "::ffff:1.2.3.4", "fe80::1%eth0", "08", "65536", "-1", "+2", "10.0.0.0/8", "0"}}},
		{"long text", element{set: mapNoEndpoints, isMap: true, key: []string{strings.Repeat("x", 300)}, value: []string{"drop"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.e.id()
			if got := elementFromID(id); !reflect.DeepEqual(got, tc.e) {
				t.Errorf("element %+v came back as %+v", tc.e, got)
			}
			if got := idSet(id); got != tc.e.set {
				t.Errorf("set %q came back as %q", tc.e.set, got)
			}
			want := strings.Join(tc.e.key, " . ")
			if tc.e.isMap {
				want += " : " + strings.Join(tc.e.value, " . ")
			}
			if got := string(appendIDText(nil, id, true)); got != want {
				t.Errorf("text %q, want %q", got, want)
			}
		})
	}
}

// TestElementIDSize: the ledger keeps an id for each of the table's elements; an
// endpoint map element's fits a 24-byte allocation (its text took 64).
func TestElementIDSize(t *testing.T) {
	e := element{set: endpointsMap(mapClusterEndpoints, SCTP), isMap: true,
		key: []string{"10.100.200.250", "65535", "255"}, value: []string{"10.244.255.254", "65535"}}
	if n := len(e.id()); n > 24 {
		t.Errorf("an endpoint element's id takes %d bytes, want at most 24", n)
	}
}

// TestAffinitySetsHaveNoSize: an explicit size on a set is also the kernel's initial hash
// table sizing, about 2 MB per affinity set allocated whether or not a client ever comes;
// the kernel already bounds sets that rules update to 65535 elements.
func TestAffinitySetsHaveNoSize(t *testing.T) {
	s, fake := newFake(t, testConfig(IPv4))
	state := generated(30) // every 7th Service has ClientIP affinity
	fullSync(t, s, state)
	sets := 0
	for name, set := range fake.Table.Sets {
		if !strings.HasPrefix(name, affinityPrefix) {
			continue
		}
		sets++
		if set.Size != nil {
			t.Errorf("affinity set %s has size %d", name, *set.Size)
		}
	}
	if sets == 0 {
		t.Fatal("no affinity set was created; the test proves nothing")
	}
}

// TestEntryListedTwiceInOnePort: an external IP equal to the cluster IP, or a NodePort
// equal to the port on a node IP that is also an external IP, is one entry; its
// elements are written once, with the first treatment (cluster IP, then external).
func TestEntryListedTwiceInOnePort(t *testing.T) {
	p := genPort(3, 2) // NodePort 30003 on the node IPs
	p.Port = p.NodePort
	p.ExternalIPs = []netip.Addr{p.ClusterIP, nodeIP4}
	cfg := testConfig(IPv4)
	comp := newCompiler(&cfg).compile(p, func(string) bool { return true })
	seen := map[string]bool{}
	for _, ee := range comp.entries {
		for _, id := range ee.ids {
			if seen[id] {
				t.Errorf("element %s written twice (entry %s)", idString(id), ee.entry)
			}
			seen[id] = true
		}
	}
	cip := entry{p.ClusterIP, p.Protocol, p.Port}.String()
	for _, id := range elementsOf(comp.entries, cip) {
		if idSet(id) == setExternalMasq {
			t.Errorf("the cluster IP entry got the external treatment: %s", idString(id))
		}
	}
	if len(comp.entries) != 2 {
		t.Errorf("want 2 entries (cluster IP, node IP), got %d: %v", len(comp.entries), comp.entries)
	}
	// And the table takes it.
	s, _ := newFake(t, cfg)
	fullSync(t, s, services(p))
}

// TestPanicInPartialForcesFullSync: a partial sync that panics half way (the instance
// recovers it) leaves a ledger that may not match the kernel; the next sync must be a
// full one, and it brings the table back to what the Services say.
func TestPanicInPartialForcesFullSync(t *testing.T) {
	s, fake := newFake(t, testConfig(IPv4))
	state := generated(10)
	fullSync(t, s, state)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("a nil ServicePort did not panic: the test proves nothing")
			}
		}()
		// svc-1 is released from the ledger, then compiling the nil port panics.
		_, _ = s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-1"}: {nil}})
	}()
	if !s.NeedsFull() {
		t.Fatal("after a panic in a partial sync the Syncer does not ask for a full sync")
	}
	if _, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-2"}: nil}); !errors.Is(err, ErrNeedFullSync) {
		t.Fatalf("partial sync after the panic: %v, want ErrNeedFullSync", err)
	}
	fullSync(t, s, state)
	assertEqualsFull(t, fake, state)
}

// TestEvictedBucketGroup: an older claim that takes a younger port's cluster IP entry
// in a partial sync puts its own rules in the bucket, not the younger port's (a group
// keyed by the entry alone kept the younger port's rules: a round-robin rule over 3
// endpoints for a port with 2, rejecting a third of its connections; affinity rules
// naming the younger port's deleted sets), and the younger port's removal afterwards
// applies.
func TestEvictedBucketGroup(t *testing.T) {
	for _, affinity := range []bool{false, true} {
		t.Run(fmt.Sprint("affinity ", affinity), func(t *testing.T) {
			eps := []Endpoint{ep("10.244.1.2", 8080), ep("10.244.2.2", 8080), ep("10.244.3.2", 8080)}
			port := func(name string, n int, created int64) *ServicePort {
				return sp(name, 80, withEndpoints(eps[:n], nil), func(p *ServicePort) {
					p.LoadBalancing = LBRoundRobin
					p.Claim = Claim{Created: time.Unix(created, 0), UID: name}
					if affinity {
						p.AffinityTimeout = 300 * time.Second
					}
				})
			}
			young, old := port("young", 3, 2000), port("old", 2, 1000)
			s, fake := newFake(t, testConfig(IPv4))
			s.SetDirect(&fakeNetlink{fake: fake})
			fullSync(t, s, services(young))
			if _, err := s.Partial(context.Background(), services(old)); err != nil {
				t.Fatal(err)
			}
			ref, refFake := newFake(t, testConfig(IPv4))
			fullSync(t, ref, services(young, old))
			if diff := cmp.Diff(contentDump(refFake), contentDump(fake)); diff != "" {
				t.Errorf("the older claim's partial sync differs from a full sync (-full +partial):\n%s", diff)
			}
			if _, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{Namespace: "ns", Name: "young"}: nil}); err != nil {
				t.Errorf("removing the younger Service: %v", err)
			}
		})
	}
}
