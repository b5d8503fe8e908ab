package tables

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// ledger is what one table holds, as the Syncer last wrote it: per Service port, the
// element ids and chains it brought; how many ports share each shared element and pick
// chain; which port owns each entry; and the Services that lost an entry to another.
// Changing it records the change in a changeLog, from which a Diff is computed.
//
// An entry several Services want goes to the oldest claim (ServicePort.Claim), whatever
// the order in which they arrive: a full sync acquires Services oldest first, and a
// partial sync in which an older claimant arrives evicts the younger owner (compiles it
// again, now without the entry). So partial and full syncs agree, and a user-chosen name
// never decides (it only breaks ties between equal claims).
type ledger struct {
	c *compiler

	// ports holds per Service what each of its ports brought, in port order; a slice,
	// not a map: a map of 8 slots of these per Service was 12 MB at 10,000 Services.
	ports map[ServiceName][]portState
	// shared counts the owners of each shared element (cluster IPs, hairpin pairs), by
	// id. The elements of an entry need no count: an entry has one owner, and its
	// elements exist exactly while that owner holds it, so their ids live only in the
	// owner's portState. An id is all there is to an element (elementFromID): the ledger
	// keeps no other copy of 100,000s of them.
	shared map[string]int
	// entryOwner maps each entry to the port that serves it: the name its portState
	// holds, not a copy (a 64-byte value in a map presized for every entry of the
	// table was 11.5 MB at 60,000 entries, 3.5 MB with pointers).
	entryOwner map[string]*ServicePortName
	// pickRefs counts the ports using each pick chain.
	pickRefs map[string]int
	// chainRules holds, per chain several ports write rules in (the round-robin and
	// affinity buckets), each port's rule group by its key: a chain exists while it has
	// groups. groupSeq numbers the groups as they come: a chain holds its groups in
	// that order, so a partial sync appends a new group and deletes a gone one, and
	// leaves the others' rules (and their numgen counters) alone.
	chainRules map[string]map[string]heldGroup
	groupSeq   uint64
	// held are the ports each Service was last given (read only: the caller builds new
	// ones for a change), to compile it again when it loses or regains an entry.
	held map[ServiceName][]*ServicePort
	// losers maps a contested entry to the Services that wanted it but found it taken,
	// and lost each such Service to its lost entries, so that a partial sync freeing the
	// entry hands it to the oldest of them at once instead of at the next full sync.
	losers map[string]map[ServiceName]bool
	lost   map[ServiceName][]string
}

// portState is what one Service port put into the table.
type portState struct {
	name      *ServicePortName // with the port's protocol; entryOwner points to it
	entryIDs  []entryElements  // the entries it serves, with the ids of their elements
	sharedIDs []string
	pick      []string // pick chains its elements jump to
	objects   portObjects
	rules     []ruleGroup // its rules in chains other ports write rules in too
}

// portObjects are the chains (with their rules) and sets that belong to one Service port
// alone (ClientIP affinity), or to the ports of several Services being changed.
type portObjects struct {
	chains map[string][]string
	sets   map[string]time.Duration
}

func newPortObjects() portObjects {
	return portObjects{chains: map[string][]string{}, sets: map[string]time.Duration{}}
}

func (o portObjects) addAll(from portObjects) {
	for name, rules := range from.chains {
		o.chains[name] = rules
	}
	for name, timeout := range from.sets {
		o.sets[name] = timeout
	}
}

// changeLog records what a run of ledger changes did, for the partial Diff. A full sync
// rewrites everything and tracks nothing: its log only collects conflicts and objects.
type changeLog struct {
	tracked bool
	// sharedBefore and pickBefore hold the counts of touched shared elements and pick
	// chains before the change; entryDelta the ids of entry elements brought (+1), taken
	// away (-1), or both (0).
	sharedBefore map[string]int
	pickBefore   map[string]int
	entryDelta   map[string]int
	// slotsWent and slotsCame hold, per entry, the consistent-hash tables released and
	// taken (their elements are counted as a whole: slotChanges).
	slotsWent, slotsCame map[string][]*slotTable
	// groupsBefore holds the groups of each touched chain of chainRules before the
	// change (nil: it did not exist).
	groupsBefore map[string]map[string]heldGroup
	// freed are entries whose owner let go of them; evicted are Services an older claim
	// took an entry from, to be compiled again.
	freed     map[string]bool
	evicted   map[ServiceName]bool
	conflicts []string
	// before holds, per changed Service, its per-port chains and sets as the kernel has
	// them (recorded at its first release in the change), after as they are now (its
	// last acquire); a Service may be compiled several times in one change (eviction,
	// regain), and only these two ends count.
	before, after map[ServiceName]portObjects
	// touched are the Services released or acquired so far in the change.
	touched map[ServiceName]bool
}

// changedObjects are the union of the changed Services' per-port chains and sets,
// before and after the change.
func (l *changeLog) changedObjects() (before, after portObjects) {
	before, after = newPortObjects(), newPortObjects()
	for _, o := range l.before {
		before.addAll(o)
	}
	for _, o := range l.after {
		after.addAll(o)
	}
	return before, after
}

func newChangeLog(tracked bool) *changeLog {
	l := &changeLog{tracked: tracked, freed: map[string]bool{}, evicted: map[ServiceName]bool{},
		before: map[ServiceName]portObjects{}, after: map[ServiceName]portObjects{}, touched: map[ServiceName]bool{}}
	if tracked {
		l.sharedBefore, l.pickBefore, l.entryDelta = map[string]int{}, map[string]int{}, map[string]int{}
		l.slotsWent, l.slotsCame = map[string][]*slotTable{}, map[string][]*slotTable{}
		l.groupsBefore = map[string]map[string]heldGroup{}
	}
	return l
}

// newLedger returns an empty ledger; entries sizes the entry map (growing maps step by
// step is a large share of a full sync's CPU).
func newLedger(c *compiler, entries int) *ledger {
	return &ledger{
		c:          c,
		ports:      map[ServiceName][]portState{},
		shared:     map[string]int{},
		entryOwner: make(map[string]*ServicePortName, entries),
		held:       make(map[ServiceName][]*ServicePort, entries/2),
		pickRefs:   map[string]int{},
		chainRules: map[string]map[string]heldGroup{},
		losers:     map[string]map[ServiceName]bool{},
		lost:       map[ServiceName][]string{},
	}
}

// count adds delta to counts[key], recording the value before the first change in
// before (if tracked), and dropping keys that reach zero.
func count(counts, before map[string]int, key string, delta int) {
	if before != nil {
		if _, seen := before[key]; !seen {
			before[key] = counts[key]
		}
	}
	counts[key] += delta
	if counts[key] <= 0 {
		delete(counts, key)
	}
}

// release forgets everything a Service contributed.
func (l *ledger) release(log *changeLog, svc ServiceName) {
	first := !log.touched[svc]
	log.touched[svc] = true
	delete(log.after, svc)
	for _, st := range l.ports[svc] {
		spn := *st.name
		if first && (st.objects.chains != nil || st.objects.sets != nil) {
			if log.before[svc].chains == nil {
				log.before[svc] = newPortObjects()
			}
			log.before[svc].addAll(st.objects)
		}
		for _, ee := range st.entryIDs {
			if en := ee.entry; l.entryOwner[en] != nil && *l.entryOwner[en] == spn {
				delete(l.entryOwner, en)
				log.freed[en] = true
			}
			if log.tracked {
				for _, id := range ee.ids {
					log.entryDelta[id]--
				}
				if ee.slots != nil {
					log.slotsWent[ee.entry] = append(log.slotsWent[ee.entry], ee.slots)
				}
			}
		}
		for _, id := range st.sharedIDs {
			count(l.shared, log.sharedBefore, id, -1)
		}
		for _, ch := range st.pick {
			count(l.pickRefs, log.pickBefore, ch, -1)
		}
		l.countRules(log, st.rules, -1)
	}
	delete(l.ports, svc)
	delete(l.held, svc)
	for _, en := range l.lost[svc] {
		delete(l.losers[en], svc)
		if len(l.losers[en]) == 0 {
			delete(l.losers, en)
		}
	}
	delete(l.lost, svc)
}

// acquire compiles a Service's ports and takes what they need. An entry another port
// already owns stays with it, unless this Service's claim is older: then the owner is
// evicted (log.evicted; settle compiles it again). A conflict is logged, and the loser
// remembered for regain.
func (l *ledger) acquire(log *changeLog, svc ServiceName, ports []*ServicePort) {
	if len(ports) == 0 {
		return
	}
	l.held[svc] = ports
	claim := ports[0].Claim
	sorted := slices.Clone(ports)
	slices.SortFunc(sorted, func(a, b *ServicePort) int {
		return strings.Compare(a.Name.String()+string(a.Protocol), b.Name.String()+string(b.Protocol))
	})
	byPort := make([]portState, 0, len(sorted))
	var lost []string
	for _, sp := range sorted {
		spn := sp.Name
		spn.Protocol = sp.Protocol
		comp := l.c.compile(sp, func(en string) bool {
			o, taken := l.entryOwner[en]
			if !taken || *o == spn {
				return true
			}
			owner := ServiceName{o.Namespace, o.Name}
			if owner != svc && l.outranks(svc, claim, owner) {
				log.conflicts = append(log.conflicts, fmt.Sprintf("%s takes %s from %s, a younger claim", spn, en, *o))
				log.evicted[owner] = true
				return true
			}
			log.conflicts = append(log.conflicts, fmt.Sprintf("%s wants %s, already served by %s", spn, en, *o))
			lost = append(lost, en)
			return false
		})
		byPort = append(byPort, l.take(log, spn, comp))
		if comp.objects.chains != nil || comp.objects.sets != nil {
			if log.after[svc].chains == nil {
				log.after[svc] = newPortObjects()
			}
			log.after[svc].addAll(comp.objects)
		}
	}
	if log.tracked {
		log.touched[svc] = true
	}
	l.ports[svc] = byPort
	if len(lost) > 0 {
		l.rememberLost(svc, lost)
	}
}

// outranks reports whether svc, with claim, comes before owner: an older claim, or an
// equal one and an earlier name.
func (l *ledger) outranks(svc ServiceName, claim Claim, owner ServiceName) bool {
	return rankBefore(claim, svc, l.claimOf(owner), owner)
}

// rankBefore orders Services by claim, then by namespace/name.
func rankBefore(c Claim, n ServiceName, oc Claim, on ServiceName) bool {
	if c.before(oc) || oc.before(c) {
		return c.before(oc)
	}
	if n.Namespace != on.Namespace {
		return n.Namespace < on.Namespace
	}
	return n.Name < on.Name
}

// take records what one compiled port brings.
func (l *ledger) take(log *changeLog, spn ServicePortName, comp *compiled) portState {
	name := &spn
	for _, ee := range comp.entries {
		l.entryOwner[ee.entry] = name
		if log.tracked {
			for _, id := range ee.ids {
				log.entryDelta[id]++
			}
			if ee.slots != nil {
				log.slotsCame[ee.entry] = append(log.slotsCame[ee.entry], ee.slots)
			}
		}
	}
	for _, id := range comp.shared {
		count(l.shared, log.sharedBefore, id, +1)
	}
	for _, ch := range comp.pick {
		count(l.pickRefs, log.pickBefore, ch, +1)
	}
	l.countRules(log, comp.rules, +1)
	return portState{name: name, entryIDs: comp.entries, sharedIDs: comp.shared, pick: comp.pick, objects: comp.objects,
		rules: comp.rules}
}

// rememberLost records the entries svc lost, so that it can have them back.
func (l *ledger) rememberLost(svc ServiceName, lost []string) {
	l.lost[svc] = lost
	for _, en := range lost {
		if l.losers[en] == nil {
			l.losers[en] = map[ServiceName]bool{}
		}
		l.losers[en][svc] = true
	}
}

// settle compiles again the Services the change evicted (they lose entries to older
// claims), and the Services that lost an entry the change freed, if it is free now or
// held by a younger claim (so the oldest gets it), until neither is left. Every step
// moves an entry to an older claim, so it ends.
func (l *ledger) settle(log *changeLog) {
	for len(log.evicted) > 0 || len(log.freed) > 0 {
		again := map[ServiceName][]*ServicePort{}
		for n := range log.evicted {
			again[n] = l.held[n]
		}
		clear(log.evicted)
		for en := range log.freed {
			o, taken := l.entryOwner[en]
			for n := range l.losers[en] {
				if !taken || l.outranks(n, l.claimOf(n), ServiceName{o.Namespace, o.Name}) {
					again[n] = l.held[n]
				}
			}
		}
		clear(log.freed)
		for _, n := range byClaim(again) {
			l.release(log, n)
			l.acquire(log, n, again[n])
		}
	}
}

// claimOf is the claim of a Service the ledger holds.
func (l *ledger) claimOf(n ServiceName) Claim {
	if held := l.held[n]; len(held) > 0 {
		return held[0].Claim
	}
	return Claim{}
}

// replace makes each changed Service's ports exactly the ones given (none: the Service
// is gone), then settles who owns contested entries.
func (l *ledger) replace(log *changeLog, changes map[ServiceName][]*ServicePort) {
	names := byClaim(changes)
	// Release everything first, so entries that move between Services in one change (or
	// a changed value of one key) are deleted before they are added again.
	for _, n := range names {
		l.release(log, n)
	}
	for _, n := range names {
		l.acquire(log, n, changes[n])
	}
	l.settle(log)
}

// elementIDs returns the ids of every element, sorted (so each set's are together).
func (l *ledger) elementIDs() []string {
	n := len(l.shared)
	for _, ports := range l.ports {
		for _, st := range ports {
			for _, ee := range st.entryIDs {
				n += len(ee.ids)
				if ee.slots != nil {
					n += len(ee.slots.slots)
				}
			}
		}
	}
	ids := make([]string, 0, n)
	for id := range l.shared {
		ids = append(ids, id)
	}
	for _, ports := range l.ports {
		for _, st := range ports {
			for _, ee := range st.entryIDs {
				ids = append(ids, ee.ids...)
				if ee.slots != nil {
					ids = ee.slots.appendIDs(ids, l.c.slotPrefix)
				}
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// byClaim returns the Service names of m, oldest claim first (the claim of a Service's
// first port; none for a deleted one), then in namespace/name order.
func byClaim(m map[ServiceName][]*ServicePort) []ServiceName {
	names := make([]ServiceName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	claim := func(n ServiceName) Claim {
		if ports := m[n]; len(ports) > 0 {
			return ports[0].Claim
		}
		return Claim{}
	}
	slices.SortFunc(names, func(a, b ServiceName) int {
		switch {
		case rankBefore(claim(a), a, claim(b), b):
			return -1
		case rankBefore(claim(b), b, claim(a), a):
			return 1
		}
		return 0
	})
	return names
}
