package tables

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"sigs.k8s.io/knftables"
)

// NetlinkWriter applies Diffs that need no rule text to one table straight over netlink,
// without the nft binary. nft 1.0.6 dumps every chain and every set of the node before
// it runs any transaction (tables/README.md, "Sync", has the figures), so through nft a
// partial sync grows with the cluster and with every other table on the node; through
// this writer it costs what it changes.
//
// It knows the key and value layout of the table's fixed sets and maps (derived from
// the same skeleton a full sync writes) and encodes elements as nft does, so `nft list`
// shows the same table either way (TestNetlinkWriterMatchesNft). It writes nothing
// else: sets it does not know (affinity sets, filled by packets) are an error.
//
// It keeps one netlink socket open between transactions: the kernel makes the close of
// an nftables socket wait for an RCU grace period whenever a transaction deleted
// something (the release flushes the pending destroy work), so a socket per transaction
// made every partial sync that deletes an element take 6–24 ms instead of ~0.1 ms
// (tables/README.md, "Sync"). Close releases the socket; the next Apply opens another.
type NetlinkWriter struct {
	table   *nftables.Table
	schemas map[string]setSchema
	opts    []nftables.ConnOption

	mu sync.Mutex
	// conn is the lasting connection, nil until the first Apply and after a failure.
	conn *nftables.Conn
}

// NewNetlinkWriter returns a writer for cfg's table. opts reach the netlink connection
// (e.g. nftables.WithNetNSFd to write into another network namespace); by default each
// Apply opens a socket in the caller's namespace.
func NewNetlinkWriter(cfg Config, opts ...nftables.ConnOption) (*NetlinkWriter, error) {
	schemas, err := schemasOf(cfg)
	if err != nil {
		return nil, err
	}
	fam := nftables.TableFamilyIPv4
	if cfg.Family == IPv6 {
		fam = nftables.TableFamilyIPv6
	}
	return &NetlinkWriter{
		table:   &nftables.Table{Name: cfg.TableName(), Family: fam},
		schemas: schemas,
		opts:    append(slices.Clone(opts), nftables.AsLasting()),
	}, nil
}

var _ Applier = &NetlinkWriter{}

// netlinkChunk bounds the elements of one netlink message.
const netlinkChunk = 256

// MaxNetlinkElements bounds the elements of a Diff the Syncer sends through a
// NetlinkWriter; a larger change goes through nft, whose fixed cost is then small beside
// the work. It keeps a transaction well inside one netlink message buffer (the kernel
// refuses a send larger than the socket's send buffer, 208 KiB by default; an IPv6 map
// element is ~100 bytes).
const MaxNetlinkElements = 1000

// MaxNetlinkMessages bounds the netlink messages of one transaction. google/nftables
// v0.3.0 asks the kernel to acknowledge every message and reads the acknowledgements
// only after sending them all; the kernel queues them in the socket's receive buffer
// (208 KiB by default, ~700 bytes each), so past ~280 messages the transaction is
// applied but reported as failed (ENOBUFS) and the next sync would be a needless full
// one. A rule added also comes back as an echo, and the echoes are larger: a bucket of
// ~145 rules overflowed (netlinkMessages counts a rule as two). Deleting a
// ClientIP-affinity Service with 150 endpoints takes ~450 (a delete per set, and per
// rule of its group in its bucket: two per endpoint); such a sync goes through nft.
const MaxNetlinkMessages = 128

// fitsNetlink reports whether a NetlinkWriter can apply d: no rule text, and small
// enough for one netlink round trip.
func fitsNetlink(d *Diff) bool {
	return !d.NeedsRuleText() && len(d.AddElements)+len(d.DeleteElements) <= MaxNetlinkElements &&
		netlinkMessages(d) <= MaxNetlinkMessages
}

// netlinkMessages counts the messages NetlinkWriter sends for d: one per set and
// netlinkChunk elements, a flush and a delete per deleted chain, one per deleted set.
func netlinkMessages(d *Diff) int {
	n := len(d.FlushFirst) + len(d.FlushChains) + len(d.DeleteChains) + len(d.DeleteSets) + len(d.DeleteMaps)
	for _, ch := range d.WriteChains {
		n += ch.operations(2)
	}
	for _, ids := range [][]string{d.AddElements, d.DeleteElements} {
		run := 0
		for i, id := range ids {
			if i == 0 || run == netlinkChunk || idSet(id) != idSet(ids[i-1]) {
				n++
				run = 0
			}
			run++
		}
	}
	return n
}

// Apply implements Applier, for Diffs that need no rule text.
func (w *NetlinkWriter) Apply(_ context.Context, d *Diff) error {
	if d.NeedsRuleText() {
		return fmt.Errorf("table %s: a change that writes rules or creates objects cannot go over netlink", w.table.Name)
	}
	if d.Len() == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.openLocked(); err != nil {
		return err
	}
	if err := w.transact(w.conn, d); err != nil {
		// Queued messages or unread replies would corrupt the next transaction.
		w.closeLocked()
		return err
	}
	return nil
}

// transact queues d's operations on conn and commits them as one transaction.
func (w *NetlinkWriter) transact(conn *nftables.Conn, d *Diff) error {
	// Handles of the rules to remove, asked for before anything is queued.
	removals := map[string][]uint64{}
	for _, ch := range d.WriteChains {
		if ch.Edit != nil && len(ch.Edit.Remove) > 0 {
			handles, err := w.ruleHandles(conn, ch.Name, ch.Edit)
			if err != nil {
				return err
			}
			removals[ch.Name] = handles
		}
	}
	for _, ch := range d.FlushFirst {
		conn.FlushChain(&nftables.Chain{Name: ch, Table: w.table})
	}
	if err := w.queueElements(conn, d.DeleteElements, true); err != nil {
		return err
	}
	for _, ch := range d.FlushChains {
		conn.FlushChain(&nftables.Chain{Name: ch, Table: w.table})
	}
	// Every chain exists before the elements that jump to it.
	for _, ch := range d.WriteChains {
		chain := &nftables.Chain{Name: ch.Name, Table: w.table}
		rules := ch.Bucket
		if ch.Edit != nil {
			for _, h := range removals[ch.Name] {
				if err := conn.DelRule(&nftables.Rule{Table: w.table, Chain: chain, Handle: h}); err != nil {
					return fmt.Errorf("chain %s of table %s: %w", ch.Name, w.table.Name, err)
				}
			}
			rules = ch.Edit.Append
		} else {
			conn.AddChain(chain)
			if ch.MayExist {
				conn.FlushChain(chain)
			}
		}
		for _, r := range rules {
			exprs, err := r.exprs(w.table.Family)
			if err != nil {
				return fmt.Errorf("chain %s of table %s: %w", ch.Name, w.table.Name, err)
			}
			conn.AddRule(&nftables.Rule{Table: w.table, Chain: chain, Exprs: exprs})
		}
	}
	if err := w.queueElements(conn, d.AddElements, false); err != nil {
		return err
	}
	for _, ch := range d.DeleteChains {
		conn.DelChain(&nftables.Chain{Name: ch, Table: w.table})
	}
	for _, st := range d.DeleteSets {
		conn.DelSet(&nftables.Set{Name: st, Table: w.table})
	}
	for _, m := range d.DeleteMaps {
		conn.DelSet(&nftables.Set{Name: m, Table: w.table})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("netlink transaction of %d operations on table %s: %w", d.Len(), w.table.Name, err)
	}
	return nil
}

// HasChain asks the kernel for the one chain name of the writer's table, on the
// writer's socket, and returns nil if it is there. Any error, "not found" included
// (google/nftables v0.3.0 reports it as text), leaves the answer to the caller.
func (w *NetlinkWriter) HasChain(name string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.openLocked(); err != nil {
		return err
	}
	if _, err := w.conn.ListChain(w.table, name); err != nil {
		// A failed request may leave a reply behind for the next transaction to read.
		w.closeLocked()
		return fmt.Errorf("chain %s of table %s: %w", name, w.table.Name, err)
	}
	return nil
}

// openLocked opens the lasting connection unless it is open; mu must be held.
func (w *NetlinkWriter) openLocked() error {
	if w.conn != nil {
		return nil
	}
	conn, err := nftables.New(w.opts...)
	if err != nil {
		return fmt.Errorf("netlink connection for table %s: %w", w.table.Name, err)
	}
	w.conn = conn
	return nil
}

// Close closes the writer's netlink socket, if open; a later Apply opens a new one.
func (w *NetlinkWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closeLocked()
}

func (w *NetlinkWriter) closeLocked() error {
	if w.conn == nil {
		return nil
	}
	err := w.conn.CloseLasting()
	w.conn = nil
	if err != nil {
		return fmt.Errorf("closing the netlink socket of table %s: %w", w.table.Name, err)
	}
	return nil
}

// queueElements encodes the elements of ids (sorted, so each set's are together) and
// queues them, one message per set and chunk, in order.
func (w *NetlinkWriter) queueElements(conn *nftables.Conn, ids []string, del bool) error {
	for len(ids) > 0 {
		name := idSet(ids[0])
		n := 1
		for n < len(ids) && n < netlinkChunk && idSet(ids[n]) == name {
			n++
		}
		sc, ok := w.schemas[name]
		if !ok {
			return fmt.Errorf("table %s: no element layout known for set %q", w.table.Name, name)
		}
		out := make([]nftables.SetElement, n)
		for i, id := range ids[:n] {
			var err error
			if out[i], err = sc.encodeID(id, del); err != nil {
				return fmt.Errorf("table %s set %s: %w", w.table.Name, name, err)
			}
		}
		set := &nftables.Set{Name: name, Table: w.table}
		var err error
		if del {
			err = conn.SetDeleteElements(set, out)
		} else {
			err = conn.SetAddElements(set, out)
		}
		if err != nil {
			return fmt.Errorf("table %s set %s: %w", w.table.Name, name, err)
		}
		ids = ids[n:]
	}
	return nil
}

// field is one part of a key or value, with nft's encoding of it.
type field int

const (
	fieldIPv4    field = iota // 4 bytes, network order
	fieldIPv6                 // 16 bytes, network order
	fieldProto                // inet_proto: 1 byte
	fieldPort                 // inet_service: 2 bytes, network order
	fieldIndex                // numgen's result: 4 bytes, host order
	fieldByte                 // a raw payload of 8 bits (@nh,<offset>,8): 1 byte
	fieldVerdict              // a vmap's value
)

// setSchema is the layout of one set or map.
type setSchema struct {
	key   []field
	value []field
	// interval: the last key field is an address range (prefix), sent as key and key end.
	interval bool
}

// schemasOf derives the layout of every fixed set and map from the skeleton.
func schemasOf(cfg Config) (map[string]setSchema, error) {
	prio, err := PrioritiesFor(cfg.Slot)
	if err != nil {
		return nil, err
	}
	sk := newCompiler(&cfg).skeleton(prio)
	out := map[string]setSchema{}
	for _, s := range sk.Sets {
		spec, typeOf := s.Type, s.TypeOf != ""
		if typeOf {
			spec = s.TypeOf
		}
		key, err := parseFields(spec, typeOf)
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", s.Name, err)
		}
		sc := setSchema{key: key}
		for _, f := range s.Flags {
			if f == knftables.IntervalFlag {
				sc.interval = true
			}
		}
		out[s.Name] = sc
	}
	for _, m := range sk.Maps {
		spec, typeOf := m.Type, m.TypeOf != ""
		if typeOf {
			spec = m.TypeOf
		}
		keyT, valT, ok := strings.Cut(spec, " : ")
		if !ok {
			return nil, fmt.Errorf("map %s: no value type in %q", m.Name, spec)
		}
		key, err := parseFields(keyT, typeOf)
		if err != nil {
			return nil, fmt.Errorf("map %s key: %w", m.Name, err)
		}
		value, err := parseFields(valT, typeOf)
		if err != nil {
			return nil, fmt.Errorf("map %s value: %w", m.Name, err)
		}
		out[m.Name] = setSchema{key: key, value: value}
	}
	return out, nil
}

// parseFields reads the fields of a `type` (datatype names) or, with typeOf, of a
// `typeof` (expressions), as far as this package uses them.
func parseFields(spec string, typeOf bool) ([]field, error) {
	var out []field
	if !typeOf {
		for _, t := range strings.Split(spec, " . ") {
			switch t {
			case "ipv4_addr":
				out = append(out, fieldIPv4)
			case "ipv6_addr":
				out = append(out, fieldIPv6)
			case "inet_proto":
				out = append(out, fieldProto)
			case "inet_service":
				out = append(out, fieldPort)
			case "verdict":
				out = append(out, fieldVerdict)
			default:
				return nil, fmt.Errorf("unknown datatype %q", t)
			}
		}
		return out, nil
	}
	for _, e := range strings.Split(spec, " . ") {
		switch {
		case e == "ip daddr" || e == "ip saddr":
			out = append(out, fieldIPv4)
		case e == "ip6 daddr" || e == "ip6 saddr":
			out = append(out, fieldIPv6)
		case strings.HasSuffix(e, " dport") || strings.HasSuffix(e, " sport"):
			out = append(out, fieldPort)
		case e == "meta l4proto":
			out = append(out, fieldProto)
		case strings.HasPrefix(e, "numgen "):
			out = append(out, fieldIndex)
		case strings.HasPrefix(e, "@nh,") && strings.HasSuffix(e, ",8"):
			out = append(out, fieldByte)
		case e == "verdict":
			out = append(out, fieldVerdict)
		default:
			return nil, fmt.Errorf("unknown expression %q", e)
		}
	}
	return out, nil
}

// encode turns an element as the syncer writes it for nft into its netlink form. A
// deletion needs the key only.
func (sc setSchema) encode(el *knftables.Element, del bool) (nftables.SetElement, error) {
	var out nftables.SetElement
	if len(el.Key) != len(sc.key) {
		return out, fmt.Errorf("element %q: %d key parts, want %d", el.Key, len(el.Key), len(sc.key))
	}
	var end []byte
	for i, f := range sc.key {
		if sc.interval && i == len(sc.key)-1 {
			first, last, err := prefixBounds(el.Key[i])
			if err != nil {
				return out, err
			}
			end = append(append([]byte{}, out.Key...), pad(last.AsSlice())...)
			out.Key = append(out.Key, pad(first.AsSlice())...)
			continue
		}
		b, err := encodeField(f, el.Key[i])
		if err != nil {
			return out, fmt.Errorf("element %q: %w", el.Key, err)
		}
		out.Key = append(out.Key, inConcat(b, len(sc.key))...)
	}
	out.KeyEnd = end
	if del || len(sc.value) == 0 {
		return out, nil
	}
	if len(el.Value) != len(sc.value) {
		return out, fmt.Errorf("element %q: %d value parts, want %d", el.Key, len(el.Value), len(sc.value))
	}
	if sc.value[0] == fieldVerdict {
		v, err := parseVerdict(el.Value[0])
		if err != nil {
			return out, fmt.Errorf("element %q: %w", el.Key, err)
		}
		out.VerdictData = v
		return out, nil
	}
	for i, f := range sc.value {
		b, err := encodeField(f, el.Value[i])
		if err != nil {
			return out, fmt.Errorf("element %q value: %w", el.Key, err)
		}
		out.Val = append(out.Val, inConcat(b, len(sc.value))...)
	}
	return out, nil
}

// encodeID is encode of the element whose id is id, read straight from the id's binary
// fields (no text in between: a partial sync's elements are mostly addresses and
// numbers, which the id holds as bytes already). Interval sets take the text path.
func (sc setSchema) encodeID(id string, del bool) (nftables.SetElement, error) {
	if sc.interval {
		return sc.encode(elementFromID(id).object(), del)
	}
	var out nftables.SetElement
	r := &idReader{id: id}
	r.set()
	var err error
	if out.Key, err = r.encodePart(sc.key); err != nil {
		return out, fmt.Errorf("element %s: key: %w", idString(id), err)
	}
	if del || len(sc.value) == 0 {
		return out, nil
	}
	if !r.startValue() || !r.more() {
		return out, fmt.Errorf("element %s: no value", idString(id))
	}
	if sc.value[0] == fieldVerdict {
		out.VerdictData, err = parseVerdict(r.text())
	} else {
		out.Val, err = r.encodePart(sc.value)
	}
	if err != nil {
		return out, fmt.Errorf("element %s: value: %w", idString(id), err)
	}
	return out, nil
}

// encodePart encodes the fields of the id's current part (key or value) as fields.
func (r *idReader) encodePart(fields []field) ([]byte, error) {
	var b []byte
	for i, f := range fields {
		if !r.more() {
			return nil, fmt.Errorf("%d parts, want %d", i, len(fields))
		}
		start := len(b)
		var err error
		if b, err = r.appendEncoded(b, f); err != nil {
			return nil, err
		}
		if len(fields) > 1 {
			b = append(b[:start], pad(b[start:])...)
		}
	}
	if r.more() {
		return nil, fmt.Errorf("more than %d parts", len(fields))
	}
	return b, nil
}

// appendEncoded appends the next field encoded as f, in its own length.
func (r *idReader) appendEncoded(b []byte, f field) ([]byte, error) {
	id, tag := r.id, r.id[r.pos]
	switch {
	case tag == tagIPv4 && f == fieldIPv4:
		r.pos += 1 + 4
		return append(b, id[r.pos-4:r.pos]...), nil
	case tag == tagIPv6 && f == fieldIPv6:
		r.pos += 1 + 16
		return append(b, id[r.pos-16:r.pos]...), nil
	case tag == tagNumber && f == fieldPort:
		r.pos += 1 + 2
		return append(b, id[r.pos-2:r.pos]...), nil
	case tag == tagNumber && f == fieldByte && id[r.pos+1] == 0:
		r.pos += 1 + 2
		return append(b, id[r.pos-1]), nil
	case tag == tagNumber && f == fieldIndex:
		r.pos += 1 + 2
		return binary.NativeEndian.AppendUint32(b, uint32(id[r.pos-2])<<8|uint32(id[r.pos-1])), nil
	}
	v, err := encodeField(f, r.text())
	return append(b, v...), err
}

// text reads the next field as text; a text field's is a part of the id, not a copy.
func (r *idReader) text() string {
	if r.id[r.pos] != tagText {
		return r.field()
	}
	r.pos++
	n, size := binary.Uvarint([]byte(r.id[r.pos:min(len(r.id), r.pos+binary.MaxVarintLen64)]))
	r.pos += size
	s := r.id[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return s
}

// inConcat is field b as it stands among parts fields: nft pads each field of a
// concatenation to 4 bytes, while a lone field keeps its own length, which the kernel
// checks against the set's (a lone inet_service value, cluster-port-of's, is 2 bytes;
// sent padded to 4 it was refused with EINVAL).
func inConcat(b []byte, parts int) []byte {
	if parts > 1 {
		return pad(b)
	}
	return b
}

// encodeField encodes one part in its own length (inConcat pads it in a
// concatenation).
func encodeField(f field, s string) ([]byte, error) {
	switch f {
	case fieldIPv4, fieldIPv6:
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, err
		}
		if a.Is4() != (f == fieldIPv4) {
			return nil, fmt.Errorf("address %s of the wrong family", s)
		}
		return a.AsSlice(), nil
	case fieldProto:
		p, ok := protoNumbers[Protocol(s)]
		if !ok {
			return nil, fmt.Errorf("unknown protocol %q", s)
		}
		return []byte{p}, nil
	case fieldPort:
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", s, err)
		}
		return binary.BigEndian.AppendUint16(nil, uint16(n)), nil
	case fieldIndex:
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("index %q: %w", s, err)
		}
		return binary.NativeEndian.AppendUint32(nil, uint32(n)), nil
	case fieldByte:
		n, err := strconv.ParseUint(s, 0, 8)
		if err != nil {
			return nil, fmt.Errorf("byte %q: %w", s, err)
		}
		return []byte{byte(n)}, nil
	}
	return nil, fmt.Errorf("field kind %d cannot be encoded as data", f)
}

var protoNumbers = map[Protocol]byte{TCP: 6, UDP: 17, SCTP: 132}

// pad extends b with zeros to a multiple of 4 bytes.
func pad(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// prefixBounds returns the first and last address of a prefix or single address.
func prefixBounds(s string) (netip.Addr, netip.Addr, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		return a, a, err
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	p = p.Masked()
	last := p.Addr().AsSlice()
	for i := p.Bits(); i < len(last)*8; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	end, _ := netip.AddrFromSlice(last)
	return p.Addr(), end, nil
}

// parseVerdict reads the verdicts the syncer writes into vmaps.
func parseVerdict(s string) (*expr.Verdict, error) {
	kind, chain, _ := strings.Cut(s, " ")
	switch kind {
	case "goto":
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}, nil
	case "jump":
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}, nil
	case "drop":
		return &expr.Verdict{Kind: expr.VerdictDrop}, nil
	case "accept":
		return &expr.Verdict{Kind: expr.VerdictAccept}, nil
	case "return":
		return &expr.Verdict{Kind: expr.VerdictReturn}, nil
	}
	return nil, fmt.Errorf("unknown verdict %q", s)
}
