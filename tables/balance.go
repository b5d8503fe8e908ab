package tables

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
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

// OrRandom is the mode itself, LBRandom for "": the one place "" means random.
func (m LBMode) OrRandom() LBMode {
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
// XOR the rotation of its /24 (IPv6: /120) prefix (rotationXOR of jhash of the prefix
// mod rotations). Within one prefix that is a permutation of the 256 slots, so every
// endpoint gets exactly its share of a prefix's clients, and clients numbered in a row
// spread almost exactly, where a hash of the whole address gives each endpoint a
// binomial share. Other tables (one endpoint; more than 256; the rare short circuit
// with endpoints of its own, which would need a second set of rotation chains) take
// jhash of the whole address.
func usesRotation(cluster bool, slots int) bool {
	return !cluster && slots == ConsistentTableSlots
}

// rotations is the number of rotation chains. Each binds the map of slots, and the
// kernel checks every element added to a map against every rule that binds it, so each
// chain costs every slot added (measured: a partial sync moving 57 slots took 352 us
// of kernel time with 256 chains, 146 us with one). 128 rotations, XORing the even
// numbers (rotationXOR), spread clients numbered from .2 on many nodes (the bits that
// vary among them are the low ones) as evenly as 256 do in TestConsistentHashEvenness's
// simulations; 64 left them 2 points less even, 32 four.
const rotations = 128

// rotationXOR is the number rotation chain k XORs the client's last byte with.
func rotationXOR(k int) int { return 2 * k }

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
	return greedyTable(eps, size, ^uint64(0))
}

// greedyTable builds the balanced rendezvous table of eps with size slots, each pair's
// score ANDed with mask (all ones but in tests, which make ties happen).
//
// Going through all size×n pairs from the highest score down is the definition; it
// needs only the pairs that decide something. Each slot keeps its own candidates, and
// its best one not yet turned down is its pick: the open slots' picks, sorted, then
// merged with a heap of the picks of slots turned down, give the pairs in the global
// order that can still take effect. An endpoint that is full turns down the slot, whose
// next candidate goes to the heap; endpoints only ever fill up, so a pair turned down
// then would be turned down in the global order too. A partial sync for one endpoint
// change rebuilds its port's table, and sorting all 2,560 pairs of ten endpoints took
// most of that sync's Go time.
func greedyTable(eps []Endpoint, size int, mask uint64) []int {
	n := len(eps)
	table := make([]int, size)
	if n <= 1 {
		return table
	}
	order := endpointOrder(eps)
	g := newGreedy(eps, order, size, mask)
	taken := make([]int, n)
	// quota slots each, and quota+1 for the first extra endpoints to reach quota: the
	// extras go to endpoints whose next pairs score highest, rather than (as a second
	// pass would) to whichever endpoints the leftover slots rank best, which moved more
	// clients when the set changed (tables/README.md has both).
	quota, extra := size/n, size%n
	for p, ok := g.next(); ok; p, ok = g.next() {
		r := p.rank
		if taken[r] > quota || (taken[r] == quota && extra == 0) {
			g.turnDown(p)
			continue
		}
		if taken[r] == quota {
			extra--
		}
		table[p.slot] = order[r]
		taken[r]++
	}
	return table
}

// endpointOrder returns the indexes of eps by address and port: an endpoint's rank,
// which breaks ties between equal scores, so that the table is a function of the set.
func endpointOrder(eps []Endpoint) []int {
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
	return order
}

// pair is a slot, an endpoint (by rank) and their score.
type pair struct {
	score uint64
	rank  int32
	slot  int32
}

// before reports whether a comes before b in the order pairs are taken in: higher
// score first, then lower rank, then lower slot.
func (a pair) before(b pair) bool {
	if a.score != b.score {
		return a.score > b.score
	}
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.slot < b.slot
}

// greedy is the state of greedyTable: the open slots' first picks in order, and a heap
// of the later picks of slots turned down. A slot's candidates are not kept: most slots
// take their first pick, and scoring a slot's n pairs again when it is turned down is
// cheaper than keeping (and collecting) size×n of them.
type greedy struct {
	bases []uint64 // per endpoint rank, the hash of the endpoint
	mask  uint64
	// firsts are each slot's first pick, sorted; at is the next one to take.
	firsts []pair
	at     int
	// later holds the picks of slots turned down, the first in order on top.
	later []pair
}

func newGreedy(eps []Endpoint, order []int, size int, mask uint64) *greedy {
	g := &greedy{bases: make([]uint64, len(eps)), mask: mask, firsts: make([]pair, size)}
	for r, i := range order {
		h := fnv.New64a()
		h.Write([]byte(eps[i].String()))
		g.bases[r] = h.Sum64()
	}
	for s := range size {
		g.firsts[s], _ = g.bestAfter(int32(s), nil)
	}
	slices.SortFunc(g.firsts, func(a, b pair) int {
		if a.before(b) {
			return -1
		}
		return 1 // no two pairs are equal: their slots differ
	})
	return g
}

// bestAfter returns slot s's best pair among those after prev in the order (all, for
// nil prev); false if none is left.
func (g *greedy) bestAfter(s int32, prev *pair) (pair, bool) {
	slot := mix64(uint64(s) + 1)
	var best pair
	found := false
	for r, base := range g.bases {
		c := pair{score: mix64(base^slot) & g.mask, rank: int32(r), slot: s}
		if (prev == nil || prev.before(c)) && (!found || c.before(best)) {
			best, found = c, true
		}
	}
	return best, found
}

// next returns the next pair of the global order that can still take effect.
func (g *greedy) next() (pair, bool) {
	switch {
	case len(g.later) > 0 && (g.at == len(g.firsts) || g.later[0].before(g.firsts[g.at])):
		p := g.later[0]
		last := len(g.later) - 1
		g.later[0] = g.later[last]
		g.later = g.later[:last]
		g.down(0)
		return p, true
	case g.at < len(g.firsts):
		g.at++
		return g.firsts[g.at-1], true
	}
	return pair{}, false
}

// turnDown moves p's slot on to its next candidate. One is always left: the
// endpoints' quotas add up to the slots.
func (g *greedy) turnDown(p pair) {
	next, _ := g.bestAfter(p.slot, &p)
	g.later = append(g.later, next)
	for i := len(g.later) - 1; i > 0; {
		up := (i - 1) / 2
		if !g.later[i].before(g.later[up]) {
			break
		}
		g.later[i], g.later[up] = g.later[up], g.later[i]
		i = up
	}
}

func (g *greedy) down(i int) {
	h := g.later
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].before(h[l]) {
			m = r
		}
		if !h[m].before(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
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
	switch m.OrRandom() {
	case LBRoundRobin:
		return "numgen inc mod " + strconv.Itoa(n) // a bucket rule's, written at every rewrite of its bucket
	case LBSourceHash, LBConsistentHash:
		return fmt.Sprintf("jhash %s saddr mod %d seed 0x%x", ip, n, HashSeed)
	}
	return fmt.Sprintf("numgen random mod %d", n)
}
