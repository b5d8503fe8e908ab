package tables

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// generated returns n Services with two endpoints each and a mix of features.
func generated(n int) map[ServiceName][]*ServicePort {
	out := map[ServiceName][]*ServicePort{}
	for i := 0; i < n; i++ {
		out[ServiceName{"gen", fmt.Sprintf("svc-%d", i)}] = []*ServicePort{genPort(i, 2)}
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

func TestPartialSyncCostIndependentOfClusterSize(t *testing.T) {
	ops := map[int]int{}
	for _, n := range []int{10, 1000} {
		s, _ := newFake(t, testConfig(IPv4))
		all := generated(n)
		fullSync(t, s, all)
		name := ServiceName{"gen", "svc-4"} // plain ClusterIP, TCP
		stats, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{name: {genPort(4, 3)}})
		if err != nil {
			t.Fatal(err)
		}
		ops[n] = stats.Operations
	}
	if ops[10] != ops[1000] || ops[10] == 0 {
		t.Errorf("one changed endpoint costs %d operations among 10 Services and %d among 1000; want equal and non-zero", ops[10], ops[1000])
	}
}

// TestPartialEqualsFull applies random changes with partial syncs and checks the table
// always holds exactly what a fresh full sync of the same Services would write.
func TestPartialEqualsFull(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	s, fake := newFake(t, testConfig(IPv4))
	state := generated(40)
	fullSync(t, s, state)
	for step := 0; step < 200; step++ {
		changes := map[ServiceName][]*ServicePort{}
		for k := 0; k < 1+rng.Intn(3); k++ {
			i := rng.Intn(50)
			name := ServiceName{"gen", fmt.Sprintf("svc-%d", i)}
			if rng.Intn(4) == 0 {
				changes[name] = nil
				delete(state, name)
				continue
			}
			p := genPort(i, rng.Intn(4))
			if rng.Intn(3) == 0 {
				p.AffinityTimeout = 0
			}
			changes[name] = []*ServicePort{p}
			state[name] = changes[name]
		}
		if _, err := s.Partial(context.Background(), changes); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		ref, refFake := newFake(t, testConfig(IPv4))
		fullSync(t, ref, state)
		if diff := cmp.Diff(contentDump(refFake), contentDump(fake)); diff != "" {
			t.Fatalf("step %d: partial sync diverged from a full sync (-full +partial):\n%s", step, diff)
		}
	}
}

func TestUnusedPickChainsAreRemoved(t *testing.T) {
	s, fake := newFake(t, testConfig(IPv4))
	p := genPort(1, 3)
	fullSync(t, s, services(p))
	if fake.Table.Chains[pickChain(3)] == nil {
		t.Fatal("pick-3 missing")
	}
	p2 := genPort(1, 2)
	if _, err := s.Partial(context.Background(), map[ServiceName][]*ServicePort{{"gen", "svc-1"}: {p2}}); err != nil {
		t.Fatal(err)
	}
	if fake.Table.Chains[pickChain(3)] != nil {
		t.Error("pick-3 survived although no Service has 3 endpoints")
	}
	if fake.Table.Chains[pickChain(2)] == nil {
		t.Error("pick-2 missing")
	}
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
