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
type ledger struct {
	c *compiler

	ports map[ServiceName]map[ServicePortName]portState
	// shared counts the owners of each shared element (cluster IPs, hairpin pairs), by
	// id. The elements of an entry need no count: an entry has one owner, and its
	// elements exist exactly while that owner holds it, so their ids live only in the
	// owner's portState. An id is all there is to an element (elementFromID): the ledger
	// keeps no other copy of 100,000s of them.
	shared map[string]int
	// entryOwner maps each entry to the port that serves it.
	entryOwner map[string]ServicePortName
	// pickRefs counts the ports using each pick chain.
	pickRefs map[string]int
	// losers maps a contested entry to the Services that wanted it but found it taken;
	// lost holds what those Services were given, so that a partial sync freeing the
	// entry hands it to one of them at once instead of at the next full sync.
	losers map[string]map[ServiceName]bool
	lost   map[ServiceName]lostEntries
}

// lostEntries is what a Service that lost entries to others asked for.
type lostEntries struct {
	entries []string
	ports   []*ServicePort
}

// portState is what one Service port put into the table.
type portState struct {
	entryIDs  map[string][]string // entry -> ids of the elements it brought
	sharedIDs []string
	pick      []string // pick chains its elements jump to
	objects   portObjects
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
	// freed are entries whose owner let go of them.
	freed     map[string]bool
	conflicts []string
	// before and after are the per-port chains and sets of the changed Services.
	before, after portObjects
}

func newChangeLog(tracked bool) *changeLog {
	l := &changeLog{tracked: tracked, freed: map[string]bool{}, before: newPortObjects(), after: newPortObjects()}
	if tracked {
		l.sharedBefore, l.pickBefore, l.entryDelta = map[string]int{}, map[string]int{}, map[string]int{}
	}
	return l
}

// newLedger returns an empty ledger; entries sizes the entry map (growing maps step by
// step is a large share of a full sync's CPU).
func newLedger(c *compiler, entries int) *ledger {
	return &ledger{
		c:          c,
		ports:      map[ServiceName]map[ServicePortName]portState{},
		shared:     map[string]int{},
		entryOwner: make(map[string]ServicePortName, entries),
		pickRefs:   map[string]int{},
		losers:     map[string]map[ServiceName]bool{},
		lost:       map[ServiceName]lostEntries{},
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
	for spn, st := range l.ports[svc] {
		log.before.addAll(st.objects)
		for en, ids := range st.entryIDs {
			if l.entryOwner[en] == spn {
				delete(l.entryOwner, en)
				log.freed[en] = true
			}
			if log.tracked {
				for _, id := range ids {
					log.entryDelta[id]--
				}
			}
		}
		for _, id := range st.sharedIDs {
			count(l.shared, log.sharedBefore, id, -1)
		}
		for _, ch := range st.pick {
			count(l.pickRefs, log.pickBefore, ch, -1)
		}
	}
	delete(l.ports, svc)
	for _, en := range l.lost[svc].entries {
		delete(l.losers[en], svc)
		if len(l.losers[en]) == 0 {
			delete(l.losers, en)
		}
	}
	delete(l.lost, svc)
}

// acquire compiles a Service's ports and takes what they need. An entry another port
// already owns stays with it: the conflict is logged and remembered, for regain.
func (l *ledger) acquire(log *changeLog, svc ServiceName, ports []*ServicePort) {
	if len(ports) == 0 {
		return
	}
	sorted := slices.Clone(ports)
	slices.SortFunc(sorted, func(a, b *ServicePort) int {
		return strings.Compare(a.Name.String()+string(a.Protocol), b.Name.String()+string(b.Protocol))
	})
	byPort := make(map[ServicePortName]portState, len(sorted))
	var lost []string
	for _, sp := range sorted {
		spn := sp.Name
		spn.Protocol = sp.Protocol
		comp := l.c.compile(sp, func(en string) bool {
			o, taken := l.entryOwner[en]
			if taken && o != spn {
				log.conflicts = append(log.conflicts, fmt.Sprintf("%s wants %s, already served by %s", spn, en, o))
				lost = append(lost, en)
				return false
			}
			return true
		})
		byPort[spn] = l.take(log, spn, comp)
	}
	l.ports[svc] = byPort
	if len(lost) > 0 {
		l.rememberLost(svc, ports, lost)
	}
}

// take records what one compiled port brings.
func (l *ledger) take(log *changeLog, spn ServicePortName, comp *compiled) portState {
	for en, ids := range comp.entries {
		l.entryOwner[en] = spn
		if log.tracked {
			for _, id := range ids {
				log.entryDelta[id]++
			}
		}
	}
	for _, id := range comp.shared {
		count(l.shared, log.sharedBefore, id, +1)
	}
	for _, ch := range comp.pick {
		count(l.pickRefs, log.pickBefore, ch, +1)
	}
	log.after.addAll(comp.objects)
	return portState{entryIDs: comp.entries, sharedIDs: comp.shared, pick: comp.pick, objects: comp.objects}
}

// rememberLost keeps what svc asked for, so that it can have its lost entries back.
func (l *ledger) rememberLost(svc ServiceName, ports []*ServicePort, lost []string) {
	// Shallow copies: the caller owns its ServicePorts (their slices are only read).
	kept := make([]*ServicePort, len(ports))
	for i, sp := range ports {
		c := *sp
		kept[i] = &c
	}
	l.lost[svc] = lostEntries{entries: lost, ports: kept}
	for _, en := range lost {
		if l.losers[en] == nil {
			l.losers[en] = map[ServiceName]bool{}
		}
		l.losers[en][svc] = true
	}
}

// regain hands the entries freed so far to the Services that lost them, by acquiring
// those Services again (their other elements are unchanged, so they cost nothing).
// Losers go in name order, as in a full sync. done holds the Services already acquired
// in this change, which saw every entry freed by it: a Service is never released twice.
func (l *ledger) regain(log *changeLog, done map[ServiceName]bool) {
	for len(log.freed) > 0 {
		again := map[ServiceName][]*ServicePort{}
		for en := range log.freed {
			if _, taken := l.entryOwner[en]; taken {
				continue
			}
			for svc := range l.losers[en] {
				if !done[svc] {
					again[svc] = l.lost[svc].ports
				}
			}
		}
		clear(log.freed)
		for _, n := range sortedNames(again) {
			done[n] = true
			l.release(log, n)
			l.acquire(log, n, again[n])
		}
	}
}

// replace makes each changed Service's ports exactly the ones given (none: the Service
// is gone), then hands freed entries to the Services that lost them.
func (l *ledger) replace(log *changeLog, changes map[ServiceName][]*ServicePort) {
	names := sortedNames(changes)
	// Release everything first, so entries that move between Services in one change (or
	// a changed value of one key) are deleted before they are added again.
	for _, n := range names {
		l.release(log, n)
	}
	done := make(map[ServiceName]bool, len(names))
	for _, n := range names {
		l.acquire(log, n, changes[n])
		done[n] = true
	}
	l.regain(log, done)
}

// elementIDs returns the ids of every element, sorted (so each set's are together).
func (l *ledger) elementIDs() []string {
	n := len(l.shared)
	for _, ports := range l.ports {
		for _, st := range ports {
			for _, ids := range st.entryIDs {
				n += len(ids)
			}
		}
	}
	ids := make([]string, 0, n)
	for id := range l.shared {
		ids = append(ids, id)
	}
	for _, ports := range l.ports {
		for _, st := range ports {
			for _, en := range st.entryIDs {
				ids = append(ids, en...)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// sortedNames returns the Service names of m in namespace/name order.
func sortedNames(m map[ServiceName][]*ServicePort) []ServiceName {
	names := make([]ServiceName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b ServiceName) int { return strings.Compare(a.String(), b.String()) })
	return names
}
