package tables

import (
	"encoding/binary"
	"net/netip"
	"strings"
)

// An element id is an element (its set, key and value) in a compact binary form: the
// ledger keeps one for every element of the table (283,000 at 10,000 Services × 10
// endpoints) and nothing else, so their size is most of what a Syncer remembers. The
// text form ("endpoints-tcp|10.96.0.1 . 80 . 3|10.244.0.9 . 8080", ~50 bytes, a 64-byte
// allocation) took 64 bytes of heap per element; this one takes 24 for most.
//
// Layout: one byte naming the set (its index in idSets, or idSetText followed by the
// name as a text field), then the key's fields, then, for a map element only, the byte
// idValue and the value's fields. Each field is a tag byte and its bytes: an IPv4 address
// (4 bytes), an IPv6 address (16), a decimal number up to 65535 written without leading
// zeros (2, big endian), or any other text (its length as a uvarint, then the text).
// Every form decodes to exactly the text it was made from, so an element written from an
// id is the element compiled. Ids sort by set first, so the elements of one set are next
// to each other once sorted.

// idSets are the sets and maps elements are written to, by their one-byte code (the
// index); any other name is written out (idSetText).
var idSets = [...]string{
	setClusterIPs, setExternalMasq, setExternalLocal, mapServiceIPs, mapShortCircuit,
	mapEndpoints + "-" + string(TCP), mapEndpoints + "-" + string(UDP), mapEndpoints + "-" + string(SCTP),
	mapClusterEndpoints + "-" + string(TCP), mapClusterEndpoints + "-" + string(UDP), mapClusterEndpoints + "-" + string(SCTP),
	mapRoundRobinPicks, mapRoundRobinClusterPicks, mapClusterIPOf, mapClusterPortOf, mapConsistentSlots,
	mapNoEndpoints, setFirewallIPs, setFirewallAllow, setFirewallLocal, setHairpin,
}

// Tags of an id's layout.
const (
	idSetText byte = 0xff // the set is not in idSets: its name follows as a text field
	idValue   byte = 0    // the value's fields follow
	tagIPv4   byte = 1
	tagIPv6   byte = 2
	tagNumber byte = 3
	tagText   byte = 4
)

// id identifies the element with its value, so a changed value is a delete plus an add.
func (e element) id() string {
	var buf [96]byte
	b := appendSet(buf[:0], e.set)
	for _, k := range e.key {
		b = appendField(b, k)
	}
	if e.isMap {
		b = append(b, idValue)
		for _, v := range e.value {
			b = appendField(b, v)
		}
	}
	return string(b)
}

func appendSet(b []byte, set string) []byte {
	for i, s := range idSets {
		if s == set {
			return append(b, byte(i))
		}
	}
	return appendText(append(b, idSetText), set)
}

// appendField appends one key or value part in its most compact form that decodes back
// to the same text.
func appendField(b []byte, s string) []byte {
	if n, ok := decimal16(s); ok {
		return binary.BigEndian.AppendUint16(append(b, tagNumber), n)
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		var buf [64]byte
		if string(a.AppendTo(buf[:0])) == s { // the canonical text only: it must come back
			if a.Is4() {
				v := a.As4()
				return append(append(b, tagIPv4), v[:]...)
			}
			v := a.As16()
			return append(append(b, tagIPv6), v[:]...)
		}
	}
	return appendText(b, s)
}

func appendText(b []byte, s string) []byte {
	b = binary.AppendUvarint(append(b, tagText), uint64(len(s)))
	return append(b, s...)
}

// decimal16 parses s as a number up to 65535 in its canonical decimal form.
func decimal16(s string) (uint16, bool) {
	if len(s) == 0 || len(s) > 5 || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	if n > 0xffff {
		return 0, false
	}
	return uint16(n), true
}

// idReader reads an id's parts in order.
type idReader struct {
	id  string
	pos int
}

// set reads the set's name.
func (r *idReader) set() string {
	code := r.id[r.pos]
	r.pos++
	if code == idSetText {
		return r.field()
	}
	return idSets[code]
}

// more reports whether another field of the current part (key or value) follows.
func (r *idReader) more() bool { return r.pos < len(r.id) && r.id[r.pos] != idValue }

// startValue moves past the key to the value, reporting whether the id has one.
func (r *idReader) startValue() bool {
	if r.pos < len(r.id) && r.id[r.pos] == idValue {
		r.pos++
		return true
	}
	return false
}

// field reads one field as text.
func (r *idReader) field() string {
	var buf [64]byte
	return string(r.appendField(buf[:0]))
}

// appendField appends the next field's text to b.
func (r *idReader) appendField(b []byte) []byte {
	tag, id := r.id[r.pos], r.id
	r.pos++
	switch tag {
	case tagIPv4:
		var a [4]byte
		r.pos += copy(a[:], id[r.pos:])
		b = netip.AddrFrom4(a).AppendTo(b)
	case tagIPv6:
		var a [16]byte
		r.pos += copy(a[:], id[r.pos:])
		b = netip.AddrFrom16(a).AppendTo(b)
	case tagNumber:
		b = appendUint(b, uint(id[r.pos])<<8|uint(id[r.pos+1]))
		r.pos += 2
	default:
		n := 0
		for shift := 0; ; shift += 7 { // the length, a uvarint
			c := id[r.pos]
			r.pos++
			n |= int(c&0x7f) << shift
			if c < 0x80 {
				break
			}
		}
		b = append(b, id[r.pos:r.pos+n]...)
		r.pos += n
	}
	return b
}

func appendUint(b []byte, n uint) []byte {
	var digits [5]byte
	i := len(digits)
	for {
		i--
		digits[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return append(b, digits[i:]...)
}

// appendPart appends the fields of the current part (key or value) joined by " . ".
func (r *idReader) appendPart(b []byte) []byte {
	for i := 0; r.more(); i++ {
		if i > 0 {
			b = append(b, " . "...)
		}
		b = r.appendField(b)
	}
	return b
}

// elementFromID is the element whose id is id.
func elementFromID(id string) element {
	r := &idReader{id: id}
	e := element{set: r.set()}
	for r.more() {
		e.key = append(e.key, r.field())
	}
	if r.startValue() {
		e.isMap = true
		for r.more() {
			e.value = append(e.value, r.field())
		}
	}
	return e
}

// idSet is the set part of an element id.
func idSet(id string) string {
	if id[0] == idSetText {
		return (&idReader{id: id}).set()
	}
	return idSets[id[0]]
}

// appendIDText appends the element's key as nft writes it ("k1 . k2"), and with
// withValue its value (" : v1 . v2") if it has one.
func appendIDText(b []byte, id string, withValue bool) []byte {
	r := &idReader{id: id}
	r.set()
	b = r.appendPart(b)
	if withValue && r.startValue() {
		b = r.appendPart(append(b, " : "...))
	}
	return b
}

// idString is the id as text, "set|key|value", for messages and tests.
func idString(id string) string {
	var b strings.Builder
	r := &idReader{id: id}
	b.WriteString(r.set())
	b.WriteByte('|')
	b.Write(r.appendPart(nil))
	b.WriteByte('|')
	if r.startValue() {
		b.Write(r.appendPart(nil))
	}
	return b.String()
}
