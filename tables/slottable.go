package tables

// A slotTable is one entry's consistent-hash table in ch-slots, kept as one record
// instead of as the ids of its 256 elements: the ledger holds one per consistentHash
// entry, and a partial sync compares the table before and after slot by slot, so one
// changed endpoint costs the slots that moved (about 1/N of them), not building,
// counting and comparing 512 ids. Its elements are exactly those the ids would have
// been (TestSlotTableIDs): slot . address . protocol . port : endpoint address . port.
type slotTable struct {
	// key holds the id fields of the entry (address, protocol, port).
	key string
	// vals holds, per endpoint, the id fields of its value (address, port).
	vals []string
	// slots holds, per slot, the index in vals of its endpoint. A table with rotation
	// chains has ConsistentTableSlots slots and at most that many endpoints.
	slots []uint8
}

// newSlotTable records entry key's table: slots[i] is the endpoint (index in strs, each
// an address and a port) of slot i.
func newSlotTable(key []string, strs [][]string, slots []int) *slotTable {
	t := &slotTable{vals: make([]string, len(strs)), slots: make([]uint8, len(slots))}
	var b []byte
	for _, k := range key {
		b = appendField(b, k)
	}
	t.key = string(b)
	for j, s := range strs {
		b = b[:0]
		for _, f := range s {
			b = appendField(b, f)
		}
		t.vals[j] = string(b)
	}
	for i, ep := range slots {
		t.slots[i] = uint8(ep)
	}
	return t
}

// val is the id fields of slot i's endpoint.
func (t *slotTable) val(i int) string { return t.vals[t.slots[i]] }

// id is the element id of slot i (prefix: the compiler's slotPrefix).
func (t *slotTable) id(prefix []string, i int) string {
	p, v := prefix[i], t.val(i)
	b := make([]byte, 0, len(p)+len(t.key)+1+len(v))
	b = append(append(b, p...), t.key...)
	return string(append(append(b, idValue), v...))
}

// appendIDs appends the ids of all the table's elements.
func (t *slotTable) appendIDs(ids []string, prefix []string) []string {
	for i := range t.slots {
		ids = append(ids, t.id(prefix, i))
	}
	return ids
}

// slotPrefixes are, per slot, the start of its ch-slots element ids: the map and the
// slot's number (slots: the numbers as text).
func slotPrefixes(slots []string) []string {
	out := make([]string, len(slots))
	for i, s := range slots {
		out[i] = string(appendField(appendSet(nil, mapConsistentSlots), s))
	}
	return out
}

// slotChanges returns the ids of the elements to delete and add for one entry whose
// tables went (released in the change) and came (taken in it). In a change the entry
// mostly had one table and has one again: compared slot by slot. Anything else (an
// entry evicted and handed over within the change) counts every element, as the ledger
// counts other elements.
func slotChanges(prefix []string, went, came []*slotTable) (del, add []string) {
	if len(went) <= 1 && len(came) <= 1 {
		switch {
		case len(went) == 0 && len(came) == 1:
			return nil, came[0].appendIDs(nil, prefix)
		case len(came) == 0 && len(went) == 1:
			return went[0].appendIDs(nil, prefix), nil
		case len(went) == 1 && len(came) == 1 && len(went[0].slots) == len(came[0].slots) && went[0].key == came[0].key:
			was, is := went[0], came[0]
			for i := range is.slots {
				if was.val(i) != is.val(i) {
					del, add = append(del, was.id(prefix, i)), append(add, is.id(prefix, i))
				}
			}
			return del, add
		}
	}
	return countedSlotChanges(prefix, went, came)
}

// slotElementChanges returns the ids of the ch-slots elements a tracked change deletes
// and adds: slotChanges of every entry whose tables went or came.
func (l *changeLog) slotElementChanges(prefix []string) (del, add []string) {
	for en, came := range l.slotsCame {
		d, a := slotChanges(prefix, l.slotsWent[en], came)
		del, add = append(del, d...), append(add, a...)
	}
	for en, went := range l.slotsWent {
		if _, ok := l.slotsCame[en]; !ok {
			d, _ := slotChanges(prefix, went, nil)
			del = append(del, d...)
		}
	}
	return del, add
}

// countedSlotChanges is slotChanges by definition: every element of every table counted,
// -1 for a table that went, +1 for one that came.
func countedSlotChanges(prefix []string, went, came []*slotTable) (del, add []string) {
	counts := map[string]int{}
	for _, t := range went {
		for _, id := range t.appendIDs(nil, prefix) {
			counts[id]--
		}
	}
	for _, t := range came {
		for _, id := range t.appendIDs(nil, prefix) {
			counts[id]++
		}
	}
	for id, n := range counts {
		switch {
		case n < 0:
			del = append(del, id)
		case n > 0:
			add = append(add, id)
		}
	}
	return del, add
}
