package tables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/knftables"
)

// ServiceName identifies a Service (namespace and name).
type ServiceName struct {
	Namespace, Name string
}

// String returns "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Stats describes one sync.
type Stats struct {
	// Full is true for a full sync.
	Full bool
	// Operations is the number of operations in the transaction.
	Operations int
	// Added and Deleted count set and map elements.
	Added, Deleted int
	// Conflicts lists entries (address . protocol . port) a Service port wanted but
	// another one already serves; the first one keeps them.
	Conflicts []string
	// Elapsed is the wall time of the sync, including the transaction.
	Elapsed time.Duration
	// Direct is true for a partial sync written by the BatchWriter rather than nft.
	Direct bool
}

// ErrNeedFullSync is returned by Partial when the table state is unknown (before the
// first full sync or after a failed sync).
var ErrNeedFullSync = errors.New("a full sync is needed first")

// Syncer keeps one instance's table of one family in step with its Services. It
// remembers what it last wrote, so a partial sync costs what changed, never what exists.
// It is not safe for concurrent use.
type Syncer struct {
	cfg  Config
	nft  knftables.Interface
	c    *compiler
	prio Priorities

	// synced is true while the state below matches the kernel.
	synced bool
	// recreate asks the next full sync to delete the table first (after a failed full
	// sync, e.g. an incompatible table left by another version or another slot).
	recreate bool
	// batch writes many elements per command; see writeElements.
	batch bool
	// direct, if set, writes the partial syncs that need no rule text (see Batch).
	direct BatchWriter

	ports map[ServiceName]map[ServicePortName]portState
	// shared counts the owners of each shared element (cluster IPs, hairpin pairs), by
	// id. The elements of an entry need no count: an entry has one owner, and its
	// elements exist exactly while that owner holds it, so their ids live only in the
	// owner's portState. An id is all there is to an element (elementFromID): the Syncer
	// keeps no other copy of 100,000s of them.
	shared   map[string]int
	owner    map[string]ServicePortName // entry -> the port that serves it
	chainRef map[string]int             // dynamic chain -> number of owners
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

// NewSyncer returns a Syncer for cfg, writing through nft (bound to cfg's family and table).
func NewSyncer(cfg Config, nft knftables.Interface) (*Syncer, error) {
	prio, err := PrioritiesFor(cfg.Slot)
	if err != nil {
		return nil, err
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masquerade bit %d is out of range [0, 31]", cfg.MasqueradeBit)
	}
	s := &Syncer{cfg: cfg, nft: nft, prio: prio, batch: !inMemory(nft)}
	s.c = newCompiler(&s.cfg)
	s.reset(0)
	return s, nil
}

// WriteBatchesWith makes partial syncs that need no rule text go through w instead of
// nft (nil: everything through nft).
func (s *Syncer) WriteBatchesWith(w BatchWriter) { s.direct = w }

// Family returns the family the Syncer writes.
func (s *Syncer) Family() Family { return s.cfg.Family }

// NeedsFull reports whether the next sync must be a full one.
func (s *Syncer) NeedsFull() bool { return !s.synced }

// reset forgets everything; entries sizes the entry map (growing maps step by step cost
// 15% of a full sync's CPU at 10,000 Services).
func (s *Syncer) reset(entries int) {
	s.ports = map[ServiceName]map[ServicePortName]portState{}
	s.shared = map[string]int{}
	s.owner = make(map[string]ServicePortName, entries)
	s.chainRef = map[string]int{}
	s.losers = map[string]map[ServiceName]bool{}
	s.lost = map[ServiceName]lostEntries{}
}

// portState is what one Service port put into the table.
type portState struct {
	// compiled keeps the port's chains and owned objects; its elements are dropped, as
	// ids below stand for them.
	*compiled
	entryIDs  map[string][]string // entry -> ids of the elements it brought
	sharedIDs []string
	timeout   time.Duration
}

// batch accumulates the element and chain changes of one sync.
type batch struct {
	// before maps touched shared element ids to their counts before the batch,
	// chainBefore the same for chains, and entryDelta the ids of entry elements to +1
	// (brought), -1 (taken away) or 0 (both); nil in a full sync, which rewrites
	// everything anyway.
	before      map[string]int
	chainBefore map[string]int
	entryDelta  map[string]int
	// freed are entries whose owner let go of them during the batch.
	freed     map[string]bool
	conflicts []string
	// oldOwn and newOwn are the per-port chains and sets of the Services in the batch,
	// before and after.
	oldOwn, newOwn owned
}

// owned collects per-port chains (with their rules) and sets.
type owned struct {
	chains map[string][]string
	sets   map[string]time.Duration
}

func newOwned() owned { return owned{chains: map[string][]string{}, sets: map[string]time.Duration{}} }

func (o owned) addFrom(comp *compiled, timeout time.Duration) {
	for _, ch := range comp.ownChains {
		o.chains[ch.name] = ch.rules
	}
	for _, st := range comp.ownSets {
		o.sets[st] = timeout
	}
}

// newBatch starts a batch; track records what each touched id had before (partial
// syncs write the difference).
func (s *Syncer) newBatch(track bool) *batch {
	b := &batch{freed: map[string]bool{}, oldOwn: newOwned(), newOwn: newOwned()}
	if track {
		b.before, b.chainBefore, b.entryDelta = map[string]int{}, map[string]int{}, map[string]int{}
	}
	return b
}

func (s *Syncer) touch(b *batch, id string) {
	if b.before == nil {
		return
	}
	if _, ok := b.before[id]; !ok {
		b.before[id] = s.shared[id]
	}
}

func (s *Syncer) touchChain(b *batch, name string) {
	if b.chainBefore == nil {
		return
	}
	if _, ok := b.chainBefore[name]; !ok {
		b.chainBefore[name] = s.chainRef[name]
	}
}

// release forgets everything a Service contributed.
func (s *Syncer) release(b *batch, svc ServiceName) {
	for spn, comp := range s.ports[svc] {
		b.oldOwn.addFrom(comp.compiled, comp.timeout)
		for en, ids := range comp.entryIDs {
			if s.owner[en] == spn {
				delete(s.owner, en)
				b.freed[en] = true
			}
			if b.entryDelta != nil {
				for _, id := range ids {
					b.entryDelta[id]--
				}
			}
		}
		for _, id := range comp.sharedIDs {
			s.unref(b, id)
		}
		for _, ch := range comp.chains {
			s.touchChain(b, ch)
			s.chainRef[ch]--
			if s.chainRef[ch] <= 0 {
				delete(s.chainRef, ch)
			}
		}
	}
	delete(s.ports, svc)
	for _, en := range s.lost[svc].entries {
		delete(s.losers[en], svc)
		if len(s.losers[en]) == 0 {
			delete(s.losers, en)
		}
	}
	delete(s.lost, svc)
}

// unref lets go of the shared element with this id.
func (s *Syncer) unref(b *batch, id string) {
	s.touch(b, id)
	s.shared[id]--
	if s.shared[id] <= 0 {
		delete(s.shared, id)
	}
}

// ref takes a reference on the shared element with this id.
func (s *Syncer) ref(b *batch, id string) {
	s.touch(b, id)
	s.shared[id]++
}

// acquire compiles a Service's ports and takes what they need.
func (s *Syncer) acquire(b *batch, svc ServiceName, ports []*ServicePort) {
	if len(ports) == 0 {
		return
	}
	sorted := slices.Clone(ports)
	slices.SortFunc(sorted, func(a, b *ServicePort) int {
		return strings.Compare(a.Name.String()+string(a.Protocol), b.Name.String()+string(b.Protocol))
	})
	byPort := map[ServicePortName]portState{}
	var lost []string
	for _, sp := range sorted {
		spn := sp.Name
		spn.Protocol = sp.Protocol
		comp := s.c.compile(sp, func(en string) bool {
			o, taken := s.owner[en]
			if taken && o != spn {
				b.conflicts = append(b.conflicts, fmt.Sprintf("%s wants %s, already served by %s", spn, en, o))
				lost = append(lost, en)
				return false
			}
			return true
		})
		st := portState{entryIDs: make(map[string][]string, len(comp.entries)), timeout: sp.AffinityTimeout}
		for en, ids := range comp.entries {
			s.owner[en] = spn
			if b.entryDelta != nil {
				for _, id := range ids {
					b.entryDelta[id]++
				}
			}
			st.entryIDs[en] = ids
		}
		for _, id := range comp.shared {
			s.ref(b, id)
		}
		st.sharedIDs = comp.shared
		for _, ch := range comp.chains {
			s.touchChain(b, ch)
			s.chainRef[ch]++
		}
		b.newOwn.addFrom(comp, sp.AffinityTimeout)
		comp.entries, comp.shared = nil, nil
		st.compiled = comp
		byPort[spn] = st
	}
	s.ports[svc] = byPort
	if len(lost) > 0 {
		// Shallow copies: the caller owns its ServicePorts (their slices are only read).
		kept := make([]*ServicePort, len(ports))
		for i, sp := range ports {
			c := *sp
			kept[i] = &c
		}
		s.lost[svc] = lostEntries{entries: lost, ports: kept}
		for _, en := range lost {
			if s.losers[en] == nil {
				s.losers[en] = map[ServiceName]bool{}
			}
			s.losers[en][svc] = true
		}
	}
}

// regain hands the entries freed during the batch to the Services that lost them, by
// acquiring those Services again (their other elements are unchanged, so they cost
// nothing). Losers go in name order, as in a full sync. done holds the Services already
// acquired in this batch, which saw every entry freed by a change: a Service is never
// released twice in one batch.
func (s *Syncer) regain(b *batch, done map[ServiceName]bool) {
	for len(b.freed) > 0 {
		again := map[ServiceName][]*ServicePort{}
		for en := range b.freed {
			if _, taken := s.owner[en]; taken {
				continue
			}
			for svc := range s.losers[en] {
				if !done[svc] {
					again[svc] = s.lost[svc].ports
				}
			}
		}
		clear(b.freed)
		for _, n := range sortedNames(again) {
			done[n] = true
			s.release(b, n)
			s.acquire(b, n, again[n])
		}
	}
}

// Full replaces the whole table with the given Services in one atomic transaction.
// Nothing that works is removed before the replacement is in place, and the clients
// remembered for ClientIP affinity survive.
func (s *Syncer) Full(ctx context.Context, services map[ServiceName][]*ServicePort) (Stats, error) {
	start := time.Now()
	tx, stats, err := s.buildFull(ctx, services, true)
	if err != nil {
		return stats, err
	}
	if err := s.nft.Run(ctx, tx); err != nil {
		s.recreate = true
		return stats, fmt.Errorf("full sync of table %s %s: %w", s.c.ip, s.cfg.TableName(), err)
	}
	s.recreate = false
	s.synced = true
	stats.Elapsed = time.Since(start)
	return stats, nil
}

// Check asks the kernel whether it would accept a full sync of services, without
// changing anything.
func (s *Syncer) Check(ctx context.Context, services map[ServiceName][]*ServicePort) error {
	tx, _, err := s.buildFull(ctx, services, false)
	if err != nil {
		return err
	}
	s.synced = false
	return s.nft.Check(ctx, tx)
}

// buildFull computes the state for services and the transaction that writes it; with
// listStale it also finds leftover per-Service objects to delete.
func (s *Syncer) buildFull(ctx context.Context, services map[ServiceName][]*ServicePort, listStale bool) (*knftables.Transaction, Stats, error) {
	stats := Stats{Full: true}
	s.synced = false
	s.reset(max(len(s.owner), 2*len(services)))
	b := s.newBatch(false)
	for _, n := range sortedNames(services) {
		s.acquire(b, n, services[n])
	}
	stats.Conflicts = b.conflicts

	// Chains and sets of an earlier run that nothing needs any more are deleted; listing
	// their names is cheap next to listing the whole table, and only a full sync does it.
	var staleChains, staleSets []string
	// exists tells which chains are in the kernel (nil: unknown, any may be). A chain
	// that is not needs no flush, and with a few thousand affinity chains the flushes
	// cost more than the rest of the load: at 10,000 Services, nft -f takes 10.2 s with
	// them and 4.6 s without (mostly kernel time).
	var exists map[string]bool
	if s.recreate {
		exists = map[string]bool{}
	}
	if listStale && !s.recreate {
		chains, err := s.nft.List(ctx, "chains")
		if err != nil && !notFound(err) {
			return nil, stats, fmt.Errorf("listing chains of %s: %w", s.cfg.TableName(), err)
		}
		exists = make(map[string]bool, len(chains))
		for _, ch := range chains {
			exists[ch] = true
		}
		for _, ch := range chains {
			_, own := b.newOwn.chains[ch]
			if isDynamicChain(ch) && s.chainRef[ch] == 0 && !own {
				staleChains = append(staleChains, ch)
			}
		}
		// A table without chains is missing (or empty): nothing of ours to find. Listing
		// its sets over netlink would fail with an error that does not say "not found".
		var sets []string
		if len(chains) > 0 {
			sets, err = s.nft.List(ctx, "sets")
			if err != nil && !notFound(err) {
				return nil, stats, fmt.Errorf("listing sets of %s: %w", s.cfg.TableName(), err)
			}
		}
		for _, st := range sets {
			if _, own := b.newOwn.sets[st]; strings.HasPrefix(st, affinityPrefix) && !own {
				staleSets = append(staleSets, st)
			}
		}
	}

	tx := s.nft.NewTransaction()
	table := &knftables.Table{Comment: ptr("shardproxy instance " + s.cfg.Instance)}
	if s.recreate {
		tx.Add(table)
		tx.Delete(table)
	}
	tx.Add(table)
	sets, maps, chains, rules := s.c.skeleton(s.prio)
	for _, ch := range chains {
		tx.Add(ch)
		tx.Flush(ch)
	}
	for _, st := range sets {
		tx.Add(st)
		tx.Flush(st)
	}
	for _, m := range maps {
		tx.Add(m)
		tx.Flush(m)
	}
	for _, r := range rules {
		tx.Add(r)
	}
	// Stale chains may jump to each other: flush them all before deleting any.
	for _, ch := range staleChains {
		tx.Flush(&knftables.Chain{Name: ch})
	}
	mayExist := func(ch string) bool { return exists == nil || exists[ch] }
	newSets, changedChains := ownedChanges(newOwned(), b.newOwn)
	s.writeOwned(tx, b.newOwn, newSets, changedChains, mayExist)
	if err := s.addPickChains(tx, sortedKeys(s.chainRef), mayExist); err != nil {
		return nil, stats, err
	}
	ids := s.allIDs()
	saved := s.writeElements(tx, false, ids)
	stats.Added = len(ids)
	for _, ch := range staleChains {
		tx.Delete(&knftables.Chain{Name: ch})
	}
	for _, st := range staleSets {
		tx.Delete(&knftables.Set{Name: st})
	}
	stats.Operations = tx.NumOperations() + saved
	return tx, stats, nil
}

// allIDs returns the ids of every element, sorted (so each set's are together).
func (s *Syncer) allIDs() []string {
	n := len(s.shared)
	for _, ports := range s.ports {
		for _, st := range ports {
			for _, ids := range st.entryIDs {
				n += len(ids)
			}
		}
	}
	ids := make([]string, 0, n)
	for id := range s.shared {
		ids = append(ids, id)
	}
	for _, ports := range s.ports {
		for _, st := range ports {
			for _, en := range st.entryIDs {
				ids = append(ids, en...)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// Partial applies the changes of the given Services: each one's ports become exactly
// the ports given (none: the Service is gone). Its cost depends only on those Services.
func (s *Syncer) Partial(ctx context.Context, changes map[ServiceName][]*ServicePort) (Stats, error) {
	start := time.Now()
	stats := Stats{}
	if !s.synced {
		return stats, ErrNeedFullSync
	}
	b := s.newBatch(true)
	names := sortedNames(changes)
	// Release everything first, so entries that move between Services in one batch (or
	// a changed value of one key) are deleted before they are added again.
	for _, n := range names {
		s.release(b, n)
	}
	done := map[ServiceName]bool{}
	for _, n := range names {
		s.acquire(b, n, changes[n])
		done[n] = true
	}
	s.regain(b, done)
	stats.Conflicts = b.conflicts

	var added, deleted []string
	for id, delta := range b.entryDelta {
		switch {
		case delta > 0:
			added = append(added, id)
		case delta < 0:
			deleted = append(deleted, id)
		}
	}
	for id, before := range b.before {
		after := s.shared[id]
		switch {
		case before == 0 && after > 0:
			added = append(added, id)
		case before > 0 && after == 0:
			deleted = append(deleted, id)
		}
	}
	slices.Sort(added)
	slices.Sort(deleted)
	var newChains, goneChains []string
	for ch, before := range b.chainBefore {
		after := s.chainRef[ch]
		switch {
		case before == 0 && after > 0:
			newChains = append(newChains, ch)
		case before > 0 && after == 0:
			goneChains = append(goneChains, ch)
		}
	}
	slices.Sort(newChains)
	slices.Sort(goneChains)
	for ch := range b.oldOwn.chains {
		if _, keep := b.newOwn.chains[ch]; !keep {
			goneChains = append(goneChains, ch)
		}
	}
	var goneSets []string
	for st := range b.oldOwn.sets {
		if _, keep := b.newOwn.sets[st]; !keep {
			goneSets = append(goneSets, st)
		}
	}
	slices.Sort(goneSets)

	stats.Added, stats.Deleted = len(added), len(deleted)
	newSets, changedChains := ownedChanges(b.oldOwn, b.newOwn)
	if s.direct != nil && len(newSets) == 0 && len(changedChains) == 0 && len(newChains) == 0 &&
		len(added)+len(deleted) <= MaxBatchElements &&
		batchMessages(added, deleted, len(goneChains), len(goneSets)) <= MaxBatchMessages {
		// Nothing needs rule text: straight to the kernel, without nft's cost per table.
		batch := &Batch{
			DeleteElements: objectsOf(deleted),
			FlushChains:    goneChains,
			AddElements:    objectsOf(added),
			DeleteChains:   goneChains,
			DeleteSets:     goneSets,
		}
		stats.Operations, stats.Direct = batch.Len(), true
		if stats.Operations > 0 {
			if err := s.direct.WriteBatch(ctx, batch); err != nil {
				s.synced = false
				return stats, fmt.Errorf("partial sync of table %s %s: %w", s.c.ip, s.cfg.TableName(), err)
			}
		}
		stats.Elapsed = time.Since(start)
		return stats, nil
	}

	tx := s.nft.NewTransaction()
	saved := s.writeElements(tx, true, deleted)
	for _, ch := range goneChains {
		tx.Flush(&knftables.Chain{Name: ch})
	}
	mayExist := func(string) bool { return true }
	s.writeOwned(tx, b.newOwn, newSets, changedChains, mayExist)
	if err := s.addPickChains(tx, newChains, mayExist); err != nil {
		s.synced = false
		return stats, err
	}
	saved += s.writeElements(tx, false, added)
	for _, ch := range goneChains {
		tx.Delete(&knftables.Chain{Name: ch})
	}
	for _, st := range goneSets {
		tx.Delete(&knftables.Set{Name: st})
	}
	stats.Operations = tx.NumOperations() + saved
	if stats.Operations > 0 {
		if err := s.nft.Run(ctx, tx); err != nil {
			s.synced = false
			return stats, fmt.Errorf("partial sync of table %s %s: %w", s.c.ip, s.cfg.TableName(), err)
		}
	}
	stats.Elapsed = time.Since(start)
	return stats, nil
}

// ownedChanges returns the per-port sets that are new between old and now, and the
// per-port chains that are new or have other rules.
func ownedChanges(old, now owned) (newSets, changedChains []string) {
	for _, st := range sortedKeys(now.sets) {
		if _, ok := old.sets[st]; !ok {
			newSets = append(newSets, st)
		}
	}
	for _, ch := range sortedKeys(now.chains) {
		if prev, ok := old.chains[ch]; ok && slices.Equal(prev, now.chains[ch]) {
			continue
		}
		changedChains = append(changedChains, ch)
	}
	return newSets, changedChains
}

// writeOwned adds the given per-port sets and (re)writes the given chains of now. Sets
// are only ever added (never flushed): they hold the affinity clients. Chains for which
// mayExist is false are known not to be in the kernel and are not flushed.
func (s *Syncer) writeOwned(tx *knftables.Transaction, now owned, newSets, changedChains []string, mayExist func(string) bool) {
	for _, st := range newSets {
		tx.Add(s.c.affinitySet(st, now.sets[st]))
	}
	for _, ch := range changedChains {
		tx.Add(&knftables.Chain{Name: ch})
		if mayExist(ch) {
			tx.Flush(&knftables.Chain{Name: ch})
		}
	}
	// Rules only after every chain exists: class chains jump to endpoint chains.
	for _, ch := range changedChains {
		for _, r := range now.chains[ch] {
			tx.Add(&knftables.Rule{Chain: ch, Rule: r})
		}
	}
}

// maxBatch bounds the elements of one command, so no line of the script gets huge.
const maxBatch = 4096

// writeElements adds (or, with del, deletes) the elements of ids, given sorted so that
// the elements of one set are next to each other. It returns how many operations batching
// saved, so Stats.Operations counts one per element either way.
//
// nft takes several times longer over one command per element than over one command per
// set (measured with test/bench: 1,000 Services' 28,000 elements load in 1.1 s one per
// command and in 0.35 s as one command per set, the time of `nft -f` of the resulting
// ruleset), so for the real nft a set's elements go out in commands of up to maxBatch.
// knftables has no multi-element object, so batchElement builds one from its rendering.
// In-memory fakes keep one object per element: they store elements as they get them.
func (s *Syncer) writeElements(tx *knftables.Transaction, del bool, ids []string) (saved int) {
	op := tx.Add
	if del {
		op = tx.Delete
	}
	if !s.batch {
		for _, id := range ids {
			op(elementFromID(id).object())
		}
		return 0
	}
	for len(ids) > 0 {
		set := idSet(ids[0])
		n := 1
		for n < len(ids) && n < maxBatch && idSet(ids[n]) == set {
			n++
		}
		op(batchElement(ids[:n], del))
		saved += n - 1
		ids = ids[n:]
	}
	return saved
}

// idSet is the set part of an element id.
func idSet(id string) string {
	set, _, _ := strings.Cut(id, "|")
	return set
}

// batchElement returns one knftables element that stands for the elements of ids, all
// of one set, built straight from the ids (which hold the key and value parts already
// joined by " . "): at 10,000 Services, going through element structs cost 90 MB of
// garbage per full sync. knftables writes `add element <family> <table> <set> { KEY :
// VALUE }` (no value for delete), so the key "k1 : v1, k2 : v2, ..., kn" with the value
// vn adds all n in one command.
func batchElement(ids []string, del bool) *knftables.Element {
	last := elementFromID(ids[len(ids)-1])
	el := last.object()
	if len(ids) == 1 {
		return el
	}
	size := 0
	for _, id := range ids {
		size += len(id) + 2
	}
	var b strings.Builder
	b.Grow(size)
	for i, id := range ids {
		_, rest, _ := strings.Cut(id, "|")
		key, value, _ := strings.Cut(rest, "|")
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(key)
		if value != "" && !del && i < len(ids)-1 {
			b.WriteString(" : ")
			b.WriteString(value)
		}
	}
	el.Key = []string{b.String()}
	return el
}

// inMemory reports whether nft is knftables' Fake or wraps one (tests do, to inject
// failures): those can dump their content, the real nft cannot.
func inMemory(nft knftables.Interface) bool {
	_, ok := nft.(interface{ Dump() string })
	return ok
}

// objectsOf turns element ids into knftables elements, one each.
func objectsOf(ids []string) []*knftables.Element {
	out := make([]*knftables.Element, len(ids))
	for i, id := range ids {
		out[i] = elementFromID(id).object()
	}
	return out
}

// addPickChains adds pick chains with their rules (flushing first, so a chain left over
// by an earlier run gets exactly the rules wanted; unless mayExist says it is not there).
func (s *Syncer) addPickChains(tx *knftables.Transaction, names []string, mayExist func(string) bool) error {
	for _, ch := range names {
		rules, err := s.c.pickChainRules(ch)
		if err != nil {
			return err
		}
		tx.Add(&knftables.Chain{Name: ch})
		if mayExist(ch) {
			tx.Flush(&knftables.Chain{Name: ch})
		}
		for _, r := range rules {
			tx.Add(&knftables.Rule{Chain: ch, Rule: r})
		}
	}
	return nil
}

func sortedNames(m map[ServiceName][]*ServicePort) []ServiceName {
	names := make([]ServiceName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b ServiceName) int { return strings.Compare(a.String(), b.String()) })
	return names
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TableExists reports whether the table is still in the kernel. Over netlink
// (knftables.UseNetlink, as the supervisor opens its tables) it reads chain names only,
// cheap enough to call every few seconds at any size; through the nft binary it lists
// the whole table (seconds at 10,000 Services).
func (s *Syncer) TableExists(ctx context.Context) (bool, error) {
	chains, err := s.nft.List(ctx, "chains")
	if notFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Listing over netlink answers an empty list, not "not found", for a missing table;
	// a table without our base chain is not ours to trust either.
	return slices.Contains(chains, chainNATPrerouting), nil
}

// notFound reports whether err says the table (or object) does not exist: nft's own
// error, or ENOENT where netlink keeps it (google/nftables flattens some of its errors to
// text, so callers over netlink must not rely on this alone).
func notFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT)
}

// Reconfigure replaces the node-dependent settings (addresses, pod CIDRs); the next
// sync is a full one. The family, table and slot cannot change.
func (s *Syncer) Reconfigure(cfg Config) error {
	if cfg.Family != s.cfg.Family || cfg.TableName() != s.cfg.TableName() || cfg.Slot != s.cfg.Slot {
		return fmt.Errorf("table %s: family, name and slot cannot change while running", s.cfg.TableName())
	}
	s.cfg = cfg
	s.c = newCompiler(&s.cfg)
	s.synced = false
	return nil
}
