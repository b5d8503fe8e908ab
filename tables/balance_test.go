package tables

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"testing"
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
		// Measured: 2: 50.0/50.0, 34.8/36.7; 3: 34.6/36.3, 27.1/29.3; 10: 13.5/15.6,
		// 12.5/15.6; 30: 7.5/10.2, 7.3/9.4 (% moved, mean/worst, removing/adding).
		{n: 2, removeMean: 0.51, removeWorst: 0.51, addMean: 0.36, addWorst: 0.38},
		{n: 3, removeMean: 0.36, removeWorst: 0.38, addMean: 0.28, addWorst: 0.30},
		{n: 10, removeMean: 0.14, removeWorst: 0.16, addMean: 0.13, addWorst: 0.16},
		{n: 30, removeMean: 0.08, removeWorst: 0.11, addMean: 0.08, addWorst: 0.10},
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
