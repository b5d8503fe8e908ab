package tables

import (
	"context"
	"fmt"
	"io"
	"slices"

	"sigs.k8s.io/knftables"
)

// Applier applies a Diff to one table in one kernel transaction, all or nothing.
// NFTApplier applies any Diff; NetlinkWriter only those that need no rule text, at a
// cost that does not grow with the node's tables.
type Applier interface {
	Apply(ctx context.Context, d *Diff) error
}

// NFTApplier applies Diffs through knftables: as an `nft -f` script streamed to the nft
// binary (a ScriptRunner, as NewNFT's), or as one knftables.Transaction (knftables' Fake).
// knftables writes every command but the element commands of a script, which are this
// file's own (appendElementCommand): knftables has one object per element, and a
// script carries many elements a command.
type NFTApplier struct {
	nft knftables.Interface
	// perCommand is how many elements of one set one command of a script carries.
	perCommand int
	// family and table are the table nft is bound to, which element commands name.
	family knftables.Family
	table  string
}

var _ Applier = &NFTApplier{}

// MaxElementsPerCommand is what the nft binary is given per command: nft takes several
// times longer over one command per element than over one command per set (measured in
// test/bench; see tables/README.md), and the bound keeps each line of the script sane.
const MaxElementsPerCommand = 4096

// NewNFTApplier returns an Applier writing through nft, which must be bound to table
// of family (as NewNFT's and knftables.NewFake's are; knftables does not say which).
// elementsPerCommand above 1 writes up to that many elements of a set in one command of
// a script, as the nft binary accepts; a knftables.Transaction (knftables' Fake)
// carries one element per command whatever it is.
func NewNFTApplier(nft knftables.Interface, family knftables.Family, table string, elementsPerCommand int) *NFTApplier {
	return &NFTApplier{nft: nft, perCommand: max(1, elementsPerCommand), family: family, table: table}
}

// Apply implements Applier. An empty Diff runs nothing.
func (a *NFTApplier) Apply(ctx context.Context, d *Diff) error {
	if d.Len() == 0 {
		return nil
	}
	if sr, ok := a.nft.(ScriptRunner); ok {
		return sr.RunScript(ctx, false, func(w io.Writer) error { return a.stream(w, d) })
	}
	return a.nft.Run(ctx, a.knftTransaction(d))
}

// Check asks nft whether it would accept the Diff, without changing anything.
func (a *NFTApplier) Check(ctx context.Context, d *Diff) error {
	if sr, ok := a.nft.(ScriptRunner); ok {
		return sr.RunScript(ctx, true, func(w io.Writer) error { return a.stream(w, d) })
	}
	return a.nft.Check(ctx, a.knftTransaction(d))
}

// knftTransaction renders the whole Diff as one knftables transaction, one element per
// command, each a knftables.Element.
func (a *NFTApplier) knftTransaction(d *Diff) *knftables.Transaction {
	ops := a.newOpWriter()
	a.write(ops, d)
	return ops.tx
}

// streamChunkOps is how many operations are rendered at a time when streaming, an
// element counting as one operation even when several share a command: a full sync's
// script (tens of MB at 10,000s of Services) never exists whole in memory. Counted in
// commands, a chunk of 256 commands of MaxElementsPerCommand elements each held every
// element of a 10,000-Service table as text at once, twice (the commands and the
// chunk's rendering), at the full sync's memory peak.
const streamChunkOps = 256

// stream writes the Diff's script to w a chunk of operations at a time, its element
// commands straight from their ids: elements are most of a full sync's script, and
// knftables' buffer and its String copied each command twice more (~0.16 GB of garbage
// in a 100,000-Service full sync).
func (a *NFTApplier) stream(w io.Writer, d *Diff) error {
	ops := a.newOpWriter()
	ops.flush = func() error {
		_, err := io.WriteString(w, ops.tx.String())
		ops.tx, ops.pending = a.nft.NewTransaction(), 0
		return err
	}
	ops.elements = func(ids []string, del bool) error {
		if ops.tx.NumOperations() > 0 {
			if err := ops.flush(); err != nil {
				return err
			}
		}
		ops.line = appendElementCommand(ops.line[:0], a.family, a.table, ids, del)
		_, err := w.Write(ops.line)
		return err
	}
	a.write(ops, d)
	// Also when nothing is queued: a refused operation leaves none, only its error.
	if ops.err == nil {
		ops.err = ops.flush()
	}
	return ops.err
}

// newOpWriter returns an opWriter collecting into a new transaction of a.nft.
func (a *NFTApplier) newOpWriter() *opWriter {
	return &opWriter{tx: a.nft.NewTransaction(), check: a.nft.Check}
}

// opWriter collects a Diff's operations into tx; with flush set, it hands tx over every
// streamChunkOps operations and continues in a new one.
type opWriter struct {
	tx *knftables.Transaction
	// check is knftables' Check, which tells why tx refused an operation: knftables
	// keeps a refused operation, and every one after it, out of the transaction, and
	// the error for Run and Check.
	check func(context.Context, *knftables.Transaction) error
	// flush, when streaming, writes tx out and starts a new one.
	flush func() error
	err   error
	// pending counts the operations in tx, each element of a command as one.
	pending int
	// elements, when streaming, writes one command of the elements of ids, all of one
	// set (deletes them, with del), after the operations queued before it; nil: each
	// element is a knftables.Element of tx.
	elements func(ids []string, del bool) error
	// line is the element command being written, reused.
	line []byte
}

func (o *opWriter) add(obj knftables.Object)    { o.queue((*knftables.Transaction).Add, obj) }
func (o *opWriter) empty(obj knftables.Object)  { o.queue((*knftables.Transaction).Flush, obj) }
func (o *opWriter) delete(obj knftables.Object) { o.queue((*knftables.Transaction).Delete, obj) }

// queue adds one operation to tx; one tx refuses stops the writer with knftables' reason.
func (o *opWriter) queue(op func(*knftables.Transaction, knftables.Object), obj knftables.Object) {
	if o.err != nil {
		return
	}
	n := o.tx.NumOperations()
	op(o.tx, obj)
	if o.tx.NumOperations() == n {
		// A transaction holding a refused operation fails Check without running
		// anything, with that operation's error.
		err := o.check(context.Background(), o.tx)
		if err == nil {
			err = fmt.Errorf("knftables refused a %T operation", obj)
		}
		o.err = fmt.Errorf("rendering the transaction: %w", err)
		return
	}
	o.next(1)
}

// next counts n more operations in tx, and hands tx over when it holds a chunk.
func (o *opWriter) next(n int) {
	o.pending += n
	if o.flush != nil && o.err == nil && o.pending >= streamChunkOps {
		o.err = o.flush()
	}
}

// write adds the Diff's operations, in the order its fields document.
func (a *NFTApplier) write(ops *opWriter, d *Diff) {
	if d.Recreate {
		ops.add(&knftables.Table{})
		ops.delete(&knftables.Table{})
	}
	for _, ch := range d.FlushFirst {
		ops.empty(&knftables.Chain{Name: ch})
	}
	if d.Skeleton != nil {
		writeSkeleton(ops, d.Skeleton)
	}
	a.writeElements(ops, true, d.DeleteElements)
	for _, ch := range d.FlushChains {
		ops.empty(&knftables.Chain{Name: ch})
	}
	for _, st := range d.AddSets {
		ops.add(st)
	}
	for _, ch := range d.WriteChains {
		ops.add(&knftables.Chain{Name: ch.Name})
		if ch.MayExist && !ch.appendOnly() {
			ops.empty(&knftables.Chain{Name: ch.Name})
		}
	}
	for _, ch := range d.WriteChains {
		rules := ch.text()
		if ch.appendOnly() {
			rules = ruleTexts(ch.Edit.Append)
		}
		for _, r := range rules {
			ops.add(&knftables.Rule{Chain: ch.Name, Rule: r})
		}
	}
	a.writeElements(ops, false, d.AddElements)
	for _, ch := range d.DeleteChains {
		ops.delete(&knftables.Chain{Name: ch})
	}
	for _, st := range d.DeleteSets {
		ops.delete(&knftables.Set{Name: st})
	}
	for _, m := range d.DeleteMaps {
		ops.delete(&knftables.Map{Name: m})
	}
}

// writeSkeleton adds the table and its fixed objects, emptying those that exist.
func writeSkeleton(ops *opWriter, sk *Skeleton) {
	ops.add(sk.Table)
	for _, ch := range sk.Chains {
		ops.add(ch)
		ops.empty(ch)
	}
	for _, st := range sk.Sets {
		ops.add(st)
		ops.empty(st)
	}
	for _, m := range sk.Maps {
		ops.add(m)
		if slices.Contains(sk.RecreatedMaps, m.Name) {
			ops.delete(&knftables.Map{Name: m.Name})
			ops.add(m)
			continue
		}
		ops.empty(m)
	}
	for _, r := range sk.Rules {
		ops.add(r)
	}
}

// writeElements adds (or, with del, deletes) the elements of ids, given sorted so that
// the elements of one set are next to each other: as commands of up to perCommand
// elements when streaming, as one knftables.Element each otherwise.
func (a *NFTApplier) writeElements(ops *opWriter, del bool, ids []string) {
	if ops.elements == nil {
		for _, id := range ids {
			if del {
				ops.delete(elementFromID(id).object())
			} else {
				ops.add(elementFromID(id).object())
			}
		}
		return
	}
	for len(ids) > 0 && ops.err == nil {
		set := idSet(ids[0])
		n := 1
		for n < len(ids) && n < a.perCommand && idSet(ids[n]) == set {
			n++
		}
		ops.err = ops.elements(ids[:n], del)
		ids = ids[n:]
	}
}

// appendElementCommand appends the nft command adding (deleting, with del) the elements
// of ids, all of one set of table: `add element <family> <table> <set> { k1 : v1, k2 :
// v2 }` (a delete names keys only), as nft's grammar has it and as knftables writes one
// element (TestStreamWritesTheTransaction compares them byte for byte).
func appendElementCommand(b []byte, fam knftables.Family, table string, ids []string, del bool) []byte {
	verb := "add"
	if del {
		verb = "delete"
	}
	b = append(append(append(b, verb...), " element "...), fam...)
	b = append(append(append(append(b, ' '), table...), ' '), idSet(ids[0])...)
	b = appendIDsText(append(b, " { "...), ids, !del)
	return append(b, " }\n"...)
}

// appendIDsText appends the text of the elements of ids, separated by ", ", each with
// its value when withValues.
func appendIDsText(b []byte, ids []string, withValues bool) []byte {
	for i, id := range ids {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendIDText(b, id, withValues)
	}
	return b
}
