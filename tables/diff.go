package tables

import (
	"maps"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Diff is one change of an instance's table, as plain data: what a sync deletes,
// flushes, adds and rewrites. A full sync's Diff is the whole table (Skeleton set, and
// the stale objects an earlier run left); a partial sync's is what its Services changed.
// An Applier applies it in one transaction, all or nothing, in the order of the fields.
type Diff struct {
	// Recreate deletes the table before anything else (a full sync after a failed one,
	// which may have met an incompatible table).
	Recreate bool
	// Skeleton, if set, (re)creates the table and its fixed chains, sets and maps,
	// emptied, with the fixed rules.
	Skeleton *Skeleton
	// FlushFirst are chains emptied before the skeleton is written (and deleted with
	// DeleteChains): rotation chains an earlier run left (a table that allowed
	// consistentHash, or one of a version with more rotations), whose rules bind the
	// map of slots that the skeleton deletes and recreates or that is deleted last.
	FlushFirst []string
	// DeleteElements are ids of elements to delete (see elementFromID), sorted, so the
	// elements of one set are next to each other.
	DeleteElements []string
	// FlushChains are emptied before anything is added: the chains about to be deleted,
	// which may jump to each other.
	FlushChains []string
	// AddSets are sets to create (ClientIP affinity sets; never flushed, since they hold
	// the clients to remember).
	AddSets []*knftables.Set
	// WriteChains are created, or emptied and rewritten, with exactly their rules; every
	// chain exists before any rule is added, as rules jump between them.
	WriteChains []ChainRules
	// AddElements are ids of elements to add, sorted like DeleteElements.
	AddElements []string
	// DeleteChains, DeleteSets and DeleteMaps are deleted last, in that order.
	DeleteChains []string
	DeleteSets   []string
	DeleteMaps   []string
}

// Skeleton is the fixed part of a table, the same whatever Services it serves.
type Skeleton struct {
	// Table carries the instance in its comment.
	Table *knftables.Table
	// Chains are the base chains and the fixed regular chains (names.go).
	Chains []*knftables.Chain
	// Sets and Maps are the fixed sets and maps, whose elements the Services bring.
	Sets []*knftables.Set
	Maps []*knftables.Map
	// Rules are the rules of Chains.
	Rules []*knftables.Rule
	// RecreatedMaps are maps of Maps that a full sync deletes and adds again, empty,
	// instead of flushing: maps bound only by Chains (flushed just before), which many
	// chains bind. The kernel walks a map's elements, flushed ones included, for each
	// chain whose new rules bind it; an empty map costs nothing.
	RecreatedMaps []string
}

// ChainRules is a chain a Diff writes, with all its rules: a pick or affinity chain's
// as nft text (Rules), a bucket chain's as BucketRules (Bucket; bucket.go).
type ChainRules struct {
	// Name is the chain's name (a pick, affinity or bucket chain).
	Name string
	// Rules are the rules of a chain other than a bucket, in order.
	Rules []string
	// Bucket are the rules of a bucket chain, in order.
	Bucket []BucketRule
	// MayExist is false when the chain is known not to be in the kernel, so it needs no
	// flush (with a few thousand affinity chains, the flushes cost more than the rest of
	// a full sync's load).
	MayExist bool
	// Edit, if set, is how the chain (a bucket the kernel holds) gets to Bucket in
	// place; nil: the chain is created, or emptied, and written whole.
	Edit *ChainEdit
}

// text returns the chain's rules as nft text, in order.
func (ch ChainRules) text() []string {
	if ch.Bucket == nil {
		return ch.Rules
	}
	return ruleTexts(ch.Bucket)
}

// NeedsRuleText reports whether the Diff writes rules or creates objects, which only nft
// can compile; the rest is element and chain bookkeeping any Applier can do, and the
// bucket rules NetlinkWriter encodes itself (netlinkEncodable).
func (d *Diff) NeedsRuleText() bool {
	return d.Recreate || d.Skeleton != nil || len(d.AddSets) > 0 || !netlinkEncodable(d.WriteChains)
}

// Len is the number of operations the Diff makes, one per element.
func (d *Diff) Len() int {
	n := len(d.FlushFirst) + len(d.DeleteElements) + len(d.FlushChains) + len(d.AddSets) + len(d.AddElements) +
		len(d.DeleteChains) + len(d.DeleteSets) + len(d.DeleteMaps)
	if d.Recreate {
		n += 2
	}
	if sk := d.Skeleton; sk != nil {
		n += 1 + 2*(len(sk.Chains)+len(sk.Sets)+len(sk.Maps)) + len(sk.Rules) + len(sk.RecreatedMaps)
	}
	for _, ch := range d.WriteChains {
		n += ch.operations(1)
	}
	return n
}

// operations counts the operations writing ch takes, a rule added counting perRule (the
// netlink writer's take two: google/nftables asks for its echo besides the ack): one per
// rule an edit removes and the rules it appends, else a create (and a flush when it may
// exist) and the rules.
func (ch ChainRules) operations(perRule int) int {
	rules := len(ch.Rules) + len(ch.Bucket)
	switch {
	case ch.Edit != nil:
		return len(ch.Edit.Remove) + perRule*len(ch.Edit.Append)
	case ch.MayExist:
		return 2 + perRule*rules
	default:
		return 1 + perRule*rules
	}
}

// diffOfChange computes the Diff of a tracked change of the ledger: elements whose
// count went from zero to some or back, pick chains that came or went, and the per-port
// chains and sets of the changed Services, before and after.
func (l *ledger) diffOfChange(log *changeLog) (*Diff, error) {
	d := &Diff{}
	for id, delta := range log.entryDelta {
		switch {
		case delta > 0:
			d.AddElements = append(d.AddElements, id)
		case delta < 0:
			d.DeleteElements = append(d.DeleteElements, id)
		}
	}
	del, add := log.slotElementChanges(l.c.slotPrefix)
	d.DeleteElements, d.AddElements = append(d.DeleteElements, del...), append(d.AddElements, add...)
	added, deleted := countChanges(log.sharedBefore, l.shared)
	d.AddElements = append(d.AddElements, added...)
	d.DeleteElements = append(d.DeleteElements, deleted...)
	slices.Sort(d.AddElements)
	slices.Sort(d.DeleteElements)

	newPicks, gonePicks := countChanges(log.pickBefore, l.pickRefs)
	slices.Sort(newPicks)
	slices.Sort(gonePicks)
	before, after := log.changedObjects()
	written, goneRules := l.ruleChainChanges(log)
	d.FlushChains = slices.Concat(gonePicks, goneKeys(before.chains, after.chains), goneRules)
	d.DeleteChains = slices.Clone(d.FlushChains)
	d.DeleteSets = goneKeys(before.sets, after.sets)

	d.AddSets, d.WriteChains = l.c.portObjectChanges(before, after, func(string) bool { return true })
	picks, err := l.c.pickChains(newPicks, func(string) bool { return true })
	if err != nil {
		return nil, err
	}
	d.WriteChains = slices.Concat(d.WriteChains, written, picks)
	return d, nil
}

// countChanges compares counts before a change with counts now: the keys that went from
// zero to some (appeared) and from some to zero (vanished).
func countChanges(before, now map[string]int) (appeared, vanished []string) {
	for key, was := range before {
		is := now[key]
		switch {
		case was == 0 && is > 0:
			appeared = append(appeared, key)
		case was > 0 && is == 0:
			vanished = append(vanished, key)
		}
	}
	return appeared, vanished
}

// goneKeys returns the keys of before that now lacks, sorted.
func goneKeys[V any](before, now map[string]V) []string {
	var gone []string
	for key := range before {
		if _, kept := now[key]; !kept {
			gone = append(gone, key)
		}
	}
	slices.Sort(gone)
	return gone
}

// portObjectChanges returns the per-port sets that are new between before and after,
// and the per-port chains that are new or have other rules, sorted by name.
func (c *compiler) portObjectChanges(before, after portObjects, mayExist func(string) bool) ([]*knftables.Set, []ChainRules) {
	var sets []*knftables.Set
	for _, name := range slices.Sorted(maps.Keys(after.sets)) {
		if _, ok := before.sets[name]; !ok {
			sets = append(sets, c.affinitySet(name, after.sets[name]))
		}
	}
	var chains []ChainRules
	for _, name := range slices.Sorted(maps.Keys(after.chains)) {
		rules := after.chains[name]
		if prev, ok := before.chains[name]; ok && slices.Equal(prev, rules) {
			continue
		}
		chains = append(chains, ChainRules{Name: name, Rules: rules, MayExist: mayExist(name)})
	}
	return sets, chains
}

// pickChains returns the given pick chains with their rules.
func (c *compiler) pickChains(names []string, mayExist func(string) bool) ([]ChainRules, error) {
	out := make([]ChainRules, 0, len(names))
	for _, name := range names {
		rules, err := c.pickChainRules(name)
		if err != nil {
			return nil, err
		}
		out = append(out, ChainRules{Name: name, Rules: rules, MayExist: mayExist(name)})
	}
	return out, nil
}

// existing is what a full sync found in the kernel before writing. known false: nothing
// was listed, any chain may exist; known true: exactly chains and sets exist (none for a
// missing table, or one about to be recreated).
type existing struct {
	chains []string
	sets   []string
	known  bool
}

// diffOfAll computes the Diff of a full sync of the whole ledger: the skeleton, every
// per-port object, pick chain and element, and the deletion of the pick and affinity
// objects an earlier run left in the kernel (in).
func (l *ledger) diffOfAll(sk *Skeleton, in existing, log *changeLog, recreate bool) (*Diff, error) {
	d := &Diff{Recreate: recreate, Skeleton: sk}
	_, after := log.changedObjects()
	mayExist := func(string) bool { return true }
	if in.known {
		present := make(map[string]bool, len(in.chains))
		for _, ch := range in.chains {
			present[ch] = true
		}
		mayExist = func(ch string) bool { return present[ch] }
		rotationLeft := false
		for _, ch := range in.chains {
			if _, wanted := after.chains[ch]; isDynamicChain(ch) && l.pickRefs[ch] == 0 && l.chainRules[ch] == nil && !wanted {
				d.FlushChains = append(d.FlushChains, ch)
			}
			if l.c.leftoverRotation(ch) {
				d.FlushFirst, rotationLeft = append(d.FlushFirst, ch), true
			}
		}
		// Their map too, unless the skeleton recreates it.
		if rotationLeft && !l.c.cfg.ConsistentHash {
			d.DeleteMaps = append(d.DeleteMaps, mapConsistentSlots)
		}
		for _, st := range in.sets {
			if _, wanted := after.sets[st]; strings.HasPrefix(st, affinityPrefix) && !wanted {
				d.DeleteSets = append(d.DeleteSets, st)
			}
		}
		d.DeleteChains = slices.Concat(d.FlushChains, d.FlushFirst)
	}
	d.AddSets, d.WriteChains = l.c.portObjectChanges(portObjects{}, after, mayExist)
	picks, err := l.c.pickChains(slices.Sorted(maps.Keys(l.pickRefs)), mayExist)
	if err != nil {
		return nil, err
	}
	d.WriteChains = append(d.WriteChains, picks...)
	for _, ch := range slices.Sorted(maps.Keys(l.chainRules)) {
		d.WriteChains = append(d.WriteChains, ChainRules{Name: ch, Bucket: l.rulesOf(ch), MayExist: mayExist(ch)})
	}
	d.AddElements = l.elementIDs()
	return d, nil
}
