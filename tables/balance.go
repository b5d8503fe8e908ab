package tables

import (
	"fmt"
	"hash/fnv"
	"slices"
)

// LBMode is how a Service port picks one of its endpoints for a new connection.
type LBMode string

const (
	// LBRandom picks uniformly at random (numgen random), as upstream's nftables mode.
	LBRandom LBMode = "random"
	// LBRoundRobin sends successive new connections to successive endpoints, with one
	// counter per Service port (numgen inc in a chain of the port's own).
	LBRoundRobin LBMode = "roundRobin"
	// LBSourceHash picks by a hash of the client address (jhash mod endpoint count):
	// the same client reaches the same endpoint while the endpoint set is unchanged,
	// and most clients move when it changes.
	LBSourceHash LBMode = "sourceHash"
	// LBConsistentHash picks by the client address through a lookup table of
	// ConsistentTableSize slots, built so that removing one of N endpoints moves about
	// 1/N of the clients (consistentTable). In a 256-slot table a client's slot is the
	// last byte of its address XOR a rotation hashed from the rest (usesRotation), so
	// the clients of one /24 (IPv6: /120) take every slot once.
	LBConsistentHash LBMode = "consistentHash"
)

// LBModes lists every mode, the default first.
func LBModes() []LBMode {
	return []LBMode{LBRandom, LBRoundRobin, LBSourceHash, LBConsistentHash}
}

// ParseLBMode returns the mode named s; "" is LBRandom.
func ParseLBMode(s string) (LBMode, error) {
	if s == "" {
		return LBRandom, nil
	}
	if m := LBMode(s); slices.Contains(LBModes(), m) {
		return m, nil
	}
	return "", fmt.Errorf("unknown load-balancing mode %q (one of %v)", s, LBModes())
}

// orRandom is the mode itself, LBRandom for "".
func (m LBMode) orRandom() LBMode {
	if m == "" {
		return LBRandom
	}
	return m
}

// HashSeed is the jhash seed of sourceHash and consistentHash rules. It is fixed, not
// random (nft picks a random one when none is given): the same client must reach the
// same endpoint after a full sync rewrites the rule, after a restart, and from every
// node (traffic of one client may enter the cluster through several nodes).
const HashSeed = 0x1f2e3d4c

// ConsistentTableSlots is the size of a consistent-hash table for up to that many
// endpoints. The size must not follow the endpoint count: a client's slot is its hash
// scaled to the size, so a table of another size moves nearly every client. With 256
// slots, 10 endpoints get 25 or 26 slots each (4% apart); removing one of them moves
// about 13% of the clients (10% is the minimum). Each slot is one element per entry
// (cluster IP, each external address, each NodePort address) in the endpoint maps, so
// the size is the mode's memory cost; tables/README.md has the measurements.
const ConsistentTableSlots = 256

// ConsistentTableSize is the number of slots of the consistent-hash table of n
// endpoints: ConsistentTableSlots, or, for more endpoints than that, the next power of
// two (at least one slot each; crossing a power of two moves most clients, as any
// change of a sourceHash Service does). One endpoint needs one slot.
func ConsistentTableSize(n int) int {
	switch {
	case n <= 1:
		return n
	case n <= ConsistentTableSlots:
		return ConsistentTableSlots
	}
	size := ConsistentTableSlots
	for size < n {
		size *= 2
	}
	return size
}

// usesRotation reports whether a consistentHash table of slots slots, in the endpoint
// maps of a class (cluster: the short circuit's own cluster-endpoints table), is looked
// up through the rotation chains: the client's slot is the last byte of its address
// XOR the rotation of its /24 (IPv6: /120) prefix, jhash of the prefix mod 256. Within
// one prefix that is a permutation of the 256 slots, so every endpoint gets exactly its
// share of a prefix's clients, and clients numbered in a row spread almost exactly,
// where a hash of the whole address gives each endpoint a binomial share. Other tables
// (one endpoint; more than 256; the rare short circuit with endpoints of its own, which
// would need a second set of rotation chains) take jhash of the whole address.
func usesRotation(cluster bool, slots int) bool {
	return !cluster && slots == ConsistentTableSlots
}

// consistentTable returns the slot table of eps: slot -> index into eps. Every endpoint
// gets size/n slots or one more, and the table depends only on the set of endpoints
// (not their order, not history), so every node and every restart computes the same one.
//
// It is a balanced rendezvous: every (slot, endpoint) pair has a pseudo-random score,
// and going through all pairs from the highest score down, a slot takes the endpoint of
// its pair unless the slot is taken or the endpoint is full (size/n slots, or one more
// for the first size%n endpoints to get size/n). Without the capacity this is plain
// rendezvous hashing, where removing an endpoint moves only its own slots (the minimum)
// but the slots per endpoint vary by about their square root; the capacity makes the
// shares even at the price of some extra moves (TestConsistentTable measures both).
// Maglev's table, for comparison, needs about 2,000 slots for 10 endpoints before one
// removal moves less than 15% of the slots.
func consistentTable(eps []Endpoint) []int {
	return consistentTableOfSize(eps, ConsistentTableSize(len(eps)))
}

// consistentTableOfSize is consistentTable with size slots (at least len(eps); one
// for one endpoint). Only tests ask for another size than ConsistentTableSize's, to
// measure what the size buys.
func consistentTableOfSize(eps []Endpoint, size int) []int {
	n := len(eps)
	if n <= 1 {
		return make([]int, size)
	}
	pairs := scoredPairs(eps, size)
	table := make([]int, size)
	for i := range table {
		table[i] = -1
	}
	taken := make([]int, n)
	// quota slots each, and quota+1 for the first extra endpoints to reach quota: the
	// extras go to endpoints whose next pairs score highest, rather than (as a second
	// pass would) to whichever endpoints the leftover slots rank best, which moved more
	// clients when the set changed (tables/README.md has both).
	quota, extra := size/n, size%n
	for _, p := range pairs {
		if table[p.slot] >= 0 || taken[p.ep] > quota || (taken[p.ep] == quota && extra == 0) {
			continue
		}
		if taken[p.ep] == quota {
			extra--
		}
		table[p.slot] = int(p.ep)
		taken[p.ep]++
	}
	return table
}

// scoredPair is one (slot, endpoint) pair of a consistent-hash table and its score.
type scoredPair struct {
	score uint64
	slot  int32
	ep    int32
}

// scoredPairs returns every (slot, endpoint) pair, highest score first; pairs with
// equal scores (possible, never seen) in the order of their endpoints' addresses and
// ports, not their positions in eps, so the table stays a function of the set.
func scoredPairs(eps []Endpoint, size int) []scoredPair {
	order := make([]int, len(eps))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := eps[a].IP.Compare(eps[b].IP); c != 0 {
			return c
		}
		return int(eps[a].Port) - int(eps[b].Port)
	})
	pairs := make([]scoredPair, 0, len(eps)*size)
	for _, i := range order {
		h := fnv.New64a()
		h.Write([]byte(eps[i].String()))
		base := h.Sum64()
		for s := range size {
			pairs = append(pairs, scoredPair{score: mix64(base ^ mix64(uint64(s)+1)), slot: int32(s), ep: int32(i)})
		}
	}
	return sortByScore(pairs)
}

// sortByScore sorts pairs by descending score, keeping the order of equal scores: a
// radix sort, a byte at a time. A comparison sort of a table's pairs (2,560 for 10
// endpoints) took most of a consistentHash full sync's Go time at 10,000 Services.
func sortByScore(pairs []scoredPair) []scoredPair {
	tmp := make([]scoredPair, len(pairs))
	for shift := 0; shift < 64; shift += 8 {
		var count [257]int
		for _, p := range pairs {
			count[int(^byte(p.score>>shift))+1]++
		}
		for b := 1; b < len(count); b++ {
			count[b] += count[b-1]
		}
		for _, p := range pairs {
			d := ^byte(p.score >> shift)
			tmp[count[d]] = p
			count[d]++
		}
		pairs, tmp = tmp, pairs
	}
	return pairs
}

// mix64 is splitmix64's finalizer: a cheap bijection that spreads every input bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// pickExpr is the nft expression that picks an index among n choices in mode m, for
// the family's address keyword ip ("ip" or "ip6"). For consistentHash, n is the table
// size, not the endpoint count.
func pickExpr(m LBMode, ip string, n int) string {
	switch m.orRandom() {
	case LBRoundRobin:
		return fmt.Sprintf("numgen inc mod %d", n)
	case LBSourceHash, LBConsistentHash:
		return fmt.Sprintf("jhash %s saddr mod %d seed 0x%x", ip, n, HashSeed)
	}
	return fmt.Sprintf("numgen random mod %d", n)
}
