package tables

import (
	"context"
	"fmt"
	"io"
	"slices"
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
	if sr, ok := a.nft.(ScriptRunner); ok {
		return sr.RunScript(ctx, false, func(w io.Writer) error { return a.stream(w, d) })
	}
	return a.nft.Run(ctx, a.transaction(d))
}

// Check asks nft whether it would accept the Diff, without changing anything.
func (a *NFTApplier) Check(ctx context.Context, d *Diff) error {
	if sr, ok := a.nft.(ScriptRunner); ok {
		return sr.RunScript(ctx, true, func(w io.Writer) error { return a.stream(w, d) })
	}
	return a.nft.Check(ctx, a.transaction(d))
}

// transaction renders the whole Diff as one knftables transaction (knftables' Fake).
func (a *NFTApplier) transaction(d *Diff) *knftables.Transaction {
	ops := &opWriter{tx: a.nft.NewTransaction()}
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

// stream writes the Diff's script to w a chunk of operations at a time.
func (a *NFTApplier) stream(w io.Writer, d *Diff) error {
	ops := &opWriter{tx: a.nft.NewTransaction(), direct: w, newTx: a.nft.NewTransaction}
	ops.flush = func(tx *knftables.Transaction) error {
		text := tx.String()
		// knftables keeps an operation that fails its checks, and every one after it,
		// out of the text and ends the text with the error, which nft would take for a
		// comment: the transaction would run without them.
		if i := strings.LastIndexByte(text, '\n'); strings.HasPrefix(text[i+1:], "# ERROR: ") {
			return fmt.Errorf("rendering the transaction: %s", strings.TrimPrefix(text[i+1:], "# ERROR: "))
		}
		_, err := io.WriteString(w, text)
		ops.tx = ops.newTx()
		return err
	}
	a.write(ops, d)
	// Also when nothing is queued: a refused operation leaves none, only its error.
	if ops.err == nil {
		ops.err = ops.flush(ops.tx)
	}
	return ops.err
}

// opWriter collects a Diff's operations into tx; with flush set, it hands tx over every
// streamChunkOps operations and continues in a new one.
type opWriter struct {
	tx    *knftables.Transaction
	flush func(*knftables.Transaction) error
	err   error
	// pending counts the operations in tx, each element of a command as one.
	pending int
	// direct, when streaming, takes the element commands written straight from their
	// ids (writeElementsDirect) once the operations before them are flushed: elements
	// are most of a full sync's script, and knftables' buffer and its String copied
	// each command twice more (~0.16 GB of garbage in a 100,000-Service full sync).
	direct io.Writer
	// line is the element command being written, reused; prefixes caches, per set and
	// verb, the command's text up to its elements, as knftables writes it.
	line     []byte
	prefixes map[string]string
	newTx    func() *knftables.Transaction
}

func (o *opWriter) add(obj knftables.Object)    { o.tx.Add(obj); o.next(1) }
func (o *opWriter) empty(obj knftables.Object)  { o.tx.Flush(obj); o.next(1) }
func (o *opWriter) delete(obj knftables.Object) { o.tx.Delete(obj); o.next(1) }

// next counts n more operations in tx, and hands tx over when it holds a chunk.
func (o *opWriter) next(n int) {
	o.pending += n
	if o.flush != nil && o.err == nil && o.pending >= streamChunkOps {
		o.err = o.flush(o.tx)
		o.pending = 0
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
	// A bucket that only gains rules gets them appended (its other rules, and their
	// numgen counters, stay); nft cannot find the handles of rules to delete, so any
	// other change rewrites the chain.
	appendOnly := func(ch ChainRules) bool { return ch.Delta && len(ch.RemovedAt) == 0 }
	for _, ch := range d.WriteChains {
		ops.add(&knftables.Chain{Name: ch.Name})
		if ch.MayExist && !appendOnly(ch) {
			ops.empty(&knftables.Chain{Name: ch.Name})
		}
	}
	for _, ch := range d.WriteChains {
		rules := ch.Rules
		if appendOnly(ch) {
			rules = ch.Appended
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
// the elements of one set are next to each other, up to perCommand per command.
func (a *NFTApplier) writeElements(ops *opWriter, del bool, ids []string) {
	for len(ids) > 0 {
		set := idSet(ids[0])
		n := 1
		for n < len(ids) && n < a.perCommand && idSet(ids[n]) == set {
			n++
		}
		switch {
		case ops.direct != nil:
			ops.writeElementsDirect(ids[:n], del)
		case del:
			ops.tx.Delete(multiElement(ids[:n], del))
			ops.next(n)
		default:
			ops.tx.Add(multiElement(ids[:n], del))
			ops.next(n)
		}
		ids = ids[n:]
	}
}

// writeElementsDirect writes one command adding (deleting, with del) the elements of
// ids, all of one set, to o.direct, after flushing the operations queued before it. The
// text is the one knftables would write for multiElement(ids, del): the command's start
// is knftables' own, rendered once per set and verb (elementPrefix).
func (o *opWriter) writeElementsDirect(ids []string, del bool) {
	if o.err != nil {
		return
	}
	if o.tx.NumOperations() > 0 {
		if o.err = o.flush(o.tx); o.err != nil {
			return
		}
		o.pending = 0
	}
	prefix, err := o.elementPrefix(ids[0], del)
	if err != nil {
		o.err = err
		return
	}
	b := append(appendIDsText(append(o.line[:0], prefix...), ids, !del), " }\n"...)
	o.line = b
	_, o.err = o.direct.Write(b)
}

// elementPrefix returns the text knftables writes for an element command of id's set
// up to its elements ("add element ip <table> <set> { "), rendered once per set and verb
// from a transaction of the same nft, so that family and table are its own.
func (o *opWriter) elementPrefix(id string, del bool) (string, error) {
	key := idSet(id)
	if del {
		key = "delete " + key
	}
	if p, ok := o.prefixes[key]; ok {
		return p, nil
	}
	const marker = "\x00"
	el := elementFromID(id).object()
	el.Key = []string{marker}
	tx := o.newTx()
	if del {
		tx.Delete(el)
	} else {
		tx.Add(el)
	}
	line := tx.String()
	i := strings.Index(line, "{ "+marker)
	if i < 0 {
		return "", fmt.Errorf("rendering an element command of set %s: %q", idSet(id), line)
	}
	if o.prefixes == nil {
		o.prefixes = map[string]string{}
	}
	o.prefixes[key] = line[:i+2]
	return line[:i+2], nil
}

// multiElement returns one knftables element that stands for the elements of ids, all
// of one set, written straight from the ids: going through element structs made most of
// a full sync's garbage. knftables writes `add element <family> <table> <set> { KEY :
// VALUE }` (no value for delete), so the key "k1 : v1, k2 : v2, ..., kn" with the value
// vn adds all n in one command.
func multiElement(ids []string, del bool) *knftables.Element {
	el := elementFromID(ids[len(ids)-1]).object()
	if len(ids) == 1 {
		return el
	}
	size := 0
	for _, id := range ids {
		size += 3 * len(id) // text is longer than the binary id: a first guess
	}
	b := appendIDsText(make([]byte, 0, size), ids[:len(ids)-1], !del)
	// The last element's value is el's, which knftables writes after the key.
	b = appendIDText(append(b, ", "...), ids[len(ids)-1], false)
	el.Key = []string{string(b)}
	return el
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
