package tables

import (
	"context"
	"strings"

	"sigs.k8s.io/knftables"
)

// Applier applies a Diff to one table in one kernel transaction, all or nothing.
// NFTApplier applies any Diff; NetlinkWriter only those that need no rule text, at a
// cost that does not grow with the node's tables.
type Applier interface {
	Apply(ctx context.Context, d *Diff) error
}

// NFTApplier applies Diffs as knftables transactions: through the nft binary, or into
// knftables' Fake.
type NFTApplier struct {
	nft knftables.Interface
	// perCommand is how many elements of one set one command carries (see transaction).
	perCommand int
}

var _ Applier = &NFTApplier{}

// MaxElementsPerCommand is what the nft binary is given per command: nft takes several
// times longer over one command per element than over one command per set (measured in
// test/bench; see tables/README.md), and the bound keeps each line of the script sane.
const MaxElementsPerCommand = 4096

// NewNFTApplier returns an Applier writing through nft. elementsPerCommand above 1
// writes up to that many elements of a set in one command, as the nft binary accepts;
// knftables' Fake stores each element object as given and needs 1.
func NewNFTApplier(nft knftables.Interface, elementsPerCommand int) *NFTApplier {
	return &NFTApplier{nft: nft, perCommand: max(1, elementsPerCommand)}
}

// Apply implements Applier. An empty Diff runs nothing.
func (a *NFTApplier) Apply(ctx context.Context, d *Diff) error {
	if d.Len() == 0 {
		return nil
	}
	return a.nft.Run(ctx, a.transaction(d))
}

// Check asks nft whether it would accept the Diff, without changing anything.
func (a *NFTApplier) Check(ctx context.Context, d *Diff) error {
	return a.nft.Check(ctx, a.transaction(d))
}

// transaction renders the Diff, in the order its fields document.
func (a *NFTApplier) transaction(d *Diff) *knftables.Transaction {
	tx := a.nft.NewTransaction()
	if d.Recreate {
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
	}
	if d.Skeleton != nil {
		writeSkeleton(tx, d.Skeleton)
	}
	a.writeElements(tx, true, d.DeleteElements)
	for _, ch := range d.FlushChains {
		tx.Flush(&knftables.Chain{Name: ch})
	}
	for _, st := range d.AddSets {
		tx.Add(st)
	}
	for _, ch := range d.WriteChains {
		tx.Add(&knftables.Chain{Name: ch.Name})
		if ch.MayExist {
			tx.Flush(&knftables.Chain{Name: ch.Name})
		}
	}
	for _, ch := range d.WriteChains {
		for _, r := range ch.Rules {
			tx.Add(&knftables.Rule{Chain: ch.Name, Rule: r})
		}
	}
	a.writeElements(tx, false, d.AddElements)
	for _, ch := range d.DeleteChains {
		tx.Delete(&knftables.Chain{Name: ch})
	}
	for _, st := range d.DeleteSets {
		tx.Delete(&knftables.Set{Name: st})
	}
	return tx
}

// writeSkeleton adds the table and its fixed objects, emptying those that exist.
func writeSkeleton(tx *knftables.Transaction, sk *Skeleton) {
	tx.Add(sk.Table)
	for _, ch := range sk.Chains {
		tx.Add(ch)
		tx.Flush(ch)
	}
	for _, st := range sk.Sets {
		tx.Add(st)
		tx.Flush(st)
	}
	for _, m := range sk.Maps {
		tx.Add(m)
		tx.Flush(m)
	}
	for _, r := range sk.Rules {
		tx.Add(r)
	}
}

// writeElements adds (or, with del, deletes) the elements of ids, given sorted so that
// the elements of one set are next to each other, up to perCommand per command.
func (a *NFTApplier) writeElements(tx *knftables.Transaction, del bool, ids []string) {
	op := tx.Add
	if del {
		op = tx.Delete
	}
	for len(ids) > 0 {
		set := idSet(ids[0])
		n := 1
		for n < len(ids) && n < a.perCommand && idSet(ids[n]) == set {
			n++
		}
		op(multiElement(ids[:n], del))
		ids = ids[n:]
	}
}

// idSet is the set part of an element id.
func idSet(id string) string {
	set, _, _ := strings.Cut(id, "|")
	return set
}

// multiElement returns one knftables element that stands for the elements of ids, all
// of one set, built straight from the ids (which hold the key and value parts already
// joined by " . "): going through element structs made most of a full sync's garbage.
// knftables writes `add element <family> <table> <set> { KEY : VALUE }` (no value for
// delete), so the key "k1 : v1, k2 : v2, ..., kn" with the value vn adds all n in one
// command.
func multiElement(ids []string, del bool) *knftables.Element {
	el := elementFromID(ids[len(ids)-1]).object()
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
