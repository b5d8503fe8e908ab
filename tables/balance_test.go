package tables

import (
	"cmp"
	"fmt"
	"math"
	"math/rand"
	"net/netip"
	"slices"
	"testing"

	"github.com/shardproxy/shardproxy/tables/tracer"
)

func TestParseLBMode(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    LBMode
		wantErr bool
	}{
		{"", LBRandom, false},
		{"random", LBRandom, false},
		{"roundRobin", LBRoundRobin, false},
		{"sourceHash", LBSourceHash, false},
		{"consistentHash", LBConsistentHash, false},
		{"maglev", "", true},
		{"RoundRobin", "", true},
	} {
		got, err := ParseLBMode(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseLBMode(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestPickChainNamesRoundTrip(t *testing.T) {
	for _, m := range []LBMode{LBRandom, LBSourceHash, LBConsistentHash} {
		for _, cluster := range []bool{false, true} {
			for _, n := range []int{1, 7, 320} {
				name := pickChainFor(m, cluster, n)
				gm, gc, gn, err := parsePickChain(name)
				if err != nil || gm != m || gc != cluster || gn != n {
					t.Errorf("%s: parsed as %q %v %d %v; want %q %v %d", name, gm, gc, gn, err, m, cluster, n)
				}
			}
		}
	}
	for _, bad := range []string{"pick-", "pick-x", "pick-sh-0", "pick-cluster-ch-", "rr-abc-2"} {
		if _, _, _, err := parsePickChain(bad); err == nil {
			t.Errorf("parsePickChain(%q) accepted it", bad)
		}
	}
}

// endpointSet is n endpoints of set number s (distinct across sets).
func endpointSet(s, n int) []Endpoint {
	var eps []Endpoint
	for i := range n {
		eps = append(eps, Endpoint{IP: netip.AddrFrom4([4]byte{10, byte(s), byte(i / 250), byte(i%250 + 1)}), Port: 8080})
	}
	return eps
}

// moved is the share of client hashes whose endpoint differs between two tables. A
// hash h in 0..2^32-1 reaches slot h*size>>32 (the kernel's reciprocal_scale), so
// tables of different sizes (one endpoint has one slot) are compared by sampling hashes.
func moved(before []int, beforeEps []Endpoint, after []int, afterEps []Endpoint) float64 {
	const samples = 1 << 16
	n := 0
	for i := range samples {
		h := uint64(i) << 16
		if beforeEps[before[h*uint64(len(before))>>32]] != afterEps[after[h*uint64(len(after))>>32]] {
			n++
		}
	}
	return float64(n) / samples
}

// TestConsistentTable checks the properties consistentHash relies on: every endpoint
// has exactly its share of slots; the table is a function of the endpoint set, not of its
// order; removing one of N endpoints moves about 1/N of the slots and adding one about
// 1/(N+1). The disruption bounds are what 30 sets of each size measure, with a little
// room.
func TestConsistentTable(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, tc := range []struct {
		n                       int
		removeMean, removeWorst float64
		addMean, addWorst       float64
	}{
		// Measured: 2: 50.0/50.0, 34.6/36.3; 3: 34.5/36.3, 27.0/28.5; 10: 13.0/15.2,
		// 12.1/15.6; 30: 6.7/8.6, 7.8/10.2 (% moved, mean/worst, removing/adding).
		{n: 2, removeMean: 0.51, removeWorst: 0.51, addMean: 0.36, addWorst: 0.38},
		{n: 3, removeMean: 0.36, removeWorst: 0.38, addMean: 0.28, addWorst: 0.30},
		{n: 10, removeMean: 0.14, removeWorst: 0.16, addMean: 0.13, addWorst: 0.16},
		{n: 30, removeMean: 0.08, removeWorst: 0.10, addMean: 0.085, addWorst: 0.11},
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			var removeSum, removeWorst, addSum, addWorst float64
			const sets = 30
			for s := range sets {
				eps := endpointSet(s, tc.n+1)
				grown, base := eps, eps[:tc.n]
				table := consistentTable(base)
				if len(table) != ConsistentTableSize(tc.n) {
					t.Fatalf("table of %d slots for %d endpoints", len(table), tc.n)
				}
				counts := make([]int, tc.n)
				for _, e := range table {
					counts[e]++
				}
				for i, c := range counts {
					if q := len(table) / tc.n; c != q && c != q+1 {
						t.Fatalf("endpoint %d has %d of %d slots; want %d or %d", i, c, len(table), q, q+1)
					}
				}
				shuffled := slices.Clone(base)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				if m := moved(table, base, consistentTable(shuffled), shuffled); m != 0 {
					t.Fatalf("reordering the endpoints moved %.0f%% of the slots", 100*m)
				}

				gone := s % tc.n
				rest := slices.Delete(slices.Clone(base), gone, gone+1)
				m := moved(table, base, consistentTable(rest), rest)
				removeSum, removeWorst = removeSum+m, max(removeWorst, m)
				m = moved(table, base, consistentTable(grown), grown)
				addSum, addWorst = addSum+m, max(addWorst, m)
			}
			t.Logf("%d endpoints: removing one moves %.1f%% (worst %.1f%%, minimum %.1f%%); adding one %.1f%% (worst %.1f%%, minimum %.1f%%)",
				tc.n, 100*removeSum/sets, 100*removeWorst, 100/float64(tc.n), 100*addSum/sets, 100*addWorst, 100/float64(tc.n+1))
			if removeSum/sets > tc.removeMean || removeWorst > tc.removeWorst {
				t.Errorf("removing one endpoint moves %.3f on average, %.3f at worst; want at most %.3f and %.3f", removeSum/sets, removeWorst, tc.removeMean, tc.removeWorst)
			}
			if addSum/sets > tc.addMean || addWorst > tc.addWorst {
				t.Errorf("adding one endpoint moves %.3f on average, %.3f at worst; want at most %.3f and %.3f", addSum/sets, addWorst, tc.addMean, tc.addWorst)
			}
		})
	}
}

func TestConsistentTableSize(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 0}, {1, 1}, {2, 256}, {10, 256}, {256, 256}, {257, 512}, {1000, 1024}, {5000, 8192},
	} {
		if got := ConsistentTableSize(tc.n); got != tc.want {
			t.Errorf("ConsistentTableSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

// TestConsistentTableSizeTradeoff measures what the table size buys (issue 14): the
// share of clients that removing one of ten endpoints moves, over every removal from 60
// endpoint sets, for tables of 128, 256 (ConsistentTableSlots) and 512 slots. Each slot
// is an element per entry, so the cost is proportional to the size; tables/README.md
// ("Load-balancing modes") has the figures this logs.
func TestConsistentTableSizeTradeoff(t *testing.T) {
	const n, sets = 10, 60
	for _, tc := range []struct {
		size                    int
		removeMean, removeWorst float64
	}{
		// Measured: 128: 14.5/18.8, 256: 13.0/16.4, 512: 12.3/13.9 (% moved, mean/worst);
		// with the extra slots handed out in a second pass (before issue 14's last
		// change): 16.7/24.2, 13.7/18.0, 12.5/14.5.
		{size: 128, removeMean: 0.15, removeWorst: 0.19},
		{size: ConsistentTableSlots, removeMean: 0.135, removeWorst: 0.17},
		{size: 512, removeMean: 0.125, removeWorst: 0.145},
	} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			var sum, worst float64
			for s := range sets {
				eps := endpointSet(s, n)
				table := consistentTableOfSize(eps, tc.size)
				for gone := range n {
					rest := slices.Delete(slices.Clone(eps), gone, gone+1)
					m := moved(table, eps, consistentTableOfSize(rest, tc.size), rest)
					sum, worst = sum+m, max(worst, m)
				}
			}
			mean := sum / (sets * n)
			t.Logf("%d slots: removing one of %d endpoints moves %.1f%% of the clients (worst %.1f%% of %d removals)", tc.size, n, 100*mean, 100*worst, sets*n)
			if mean > tc.removeMean || worst > tc.removeWorst {
				t.Errorf("%d slots: removing one endpoint moves %.3f on average, %.3f at worst; want at most %.3f and %.3f", tc.size, mean, worst, tc.removeMean, tc.removeWorst)
			}
		})
	}
}

// TestConsistentHashEvenness measures the evenness question of issue 14 through the
// kernel's jhash (tracer.JHashMod) and the 256-slot table of ten endpoints: over 1,000
// clients each endpoint's count is Binomial(1000, 0.1) whatever the hash, so all ten
// within ±15% of the mean happens only about a third of the time; over 10,000 clients
// they are. A key made of the address's low bits (slot = last byte) would spread a
// block of consecutive clients exactly, but pods numbered from .2 on every node's /24
// use a few slots only and leave most endpoints idle, so the hash stays.
func TestConsistentHashEvenness(t *testing.T) {
	eps := endpointSet(7, 10)
	table := consistentTable(eps)
	byHash := func(a netip.Addr) int {
		return table[tracer.JHashMod(a, HashSeed, uint32(len(table)))]
	}
	byLowByte := func(a netip.Addr) int { return table[a.As16()[15]] }
	consecutive := func(first netip.Addr, count int) []netip.Addr {
		out := make([]netip.Addr, count)
		for i := range out {
			out[i], first = first, first.Next()
		}
		return out
	}
	var pods []netip.Addr // 50 nodes' /24s, pods .2 to .21 on each
	for node := range 50 {
		pods = append(pods, consecutive(netip.AddrFrom4([4]byte{10, 244, byte(node), 2}), 20)...)
	}
	rng := rand.New(rand.NewSource(3))
	within, trials := 0, 300
	for range trials {
		var clients []netip.Addr
		for range 1000 {
			clients = append(clients, netip.AddrFrom4([4]byte{byte(rng.Intn(223) + 1), byte(rng.Intn(256)), byte(rng.Intn(256)), byte(rng.Intn(256))}))
		}
		if worstDeviation(clients, byHash, len(eps)) <= 0.15 {
			within++
		}
	}
	t.Logf("1,000 random clients, jhash: all ten endpoints within 15%% in %d of %d client sets", within, trials)
	if share := float64(within) / float64(trials); share < 0.2 || share > 0.5 {
		t.Errorf("all endpoints within 15%% for %.2f of the client sets; binomial noise gives about a third", share)
	}
	for _, tc := range []struct {
		name    string
		clients []netip.Addr
		pick    func(netip.Addr) int
		atMost  float64 // the worst deviation from the mean allowed; 0: must exceed atLeast
		atLeast float64
	}{
		{"10,000 consecutive clients, jhash", consecutive(netip.MustParseAddr("10.100.0.1"), 10_000), byHash, 0.15, 0},
		{"1,000 consecutive clients, last byte", consecutive(netip.MustParseAddr("10.100.0.1"), 1000), byLowByte, 0.10, 0},
		{"1,000 pods (.2-.21 of 50 /24s), jhash", pods, byHash, 0.40, 0},
		{"1,000 pods (.2-.21 of 50 /24s), last byte", pods, byLowByte, 0, 0.5},
	} {
		w := worstDeviation(tc.clients, tc.pick, len(eps))
		t.Logf("%s: worst endpoint %.1f%% from the mean", tc.name, 100*w)
		if (tc.atMost > 0 && w > tc.atMost) || w < tc.atLeast {
			t.Errorf("%s: worst endpoint %.3f from the mean; want at most %.2f, at least %.2f", tc.name, w, tc.atMost, tc.atLeast)
		}
	}
}

// worstDeviation is the largest relative distance from the mean of the clients each of
// n endpoints gets, pick choosing one for each client.
func worstDeviation(clients []netip.Addr, pick func(netip.Addr) int, n int) float64 {
	counts := make([]int, n)
	for _, c := range clients {
		counts[pick(c)]++
	}
	mean, worst := float64(len(clients))/float64(n), 0.0
	for _, c := range counts {
		worst = max(worst, math.Abs(float64(c)-mean)/mean)
	}
	return worst
}

// TestScoredPairsOrder checks the radix sort against a comparison sort of the same pairs:
// highest score first, equal scores by endpoint address and port. Ties never occur
// with real scores, so the test also sorts pairs whose scores keep only a few bits.
func TestScoredPairsOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		mask uint64
	}{{"real scores", ^uint64(0)}, {"scores of 3 bits: ties everywhere", 0x7 << 40}} {
		t.Run(tc.name, func(t *testing.T) {
			for s := range 20 {
				eps := endpointSet(s, 1+s%12)
				rand.New(rand.NewSource(int64(s))).Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
				// In the order scoredPairs makes them before sorting: by endpoint, then slot.
				pairs := scoredPairs(eps, 64)
				slices.SortFunc(pairs, func(a, b scoredPair) int {
					if c := eps[a.ep].IP.Compare(eps[b.ep].IP); c != 0 {
						return c
					}
					return cmp.Compare(a.slot, b.slot)
				})
				for i := range pairs {
					pairs[i].score &= tc.mask
				}
				want := slices.Clone(pairs)
				slices.SortStableFunc(want, func(a, b scoredPair) int {
					if a.score != b.score {
						return cmp.Compare(b.score, a.score)
					}
					if c := eps[a.ep].IP.Compare(eps[b.ep].IP); c != 0 {
						return c
					}
					return cmp.Compare(eps[a.ep].Port, eps[b.ep].Port)
				})
				if got := sortByScore(slices.Clone(pairs)); !slices.Equal(got, want) {
					t.Fatalf("set %d: radix order differs from the comparison sort", s)
				}
			}
		})
	}
}

func BenchmarkConsistentTable(b *testing.B) {
	eps := endpointSet(3, 10)
	for b.Loop() {
		consistentTable(eps)
	}
}
