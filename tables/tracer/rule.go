package tracer

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// value is one evaluated expression component.
type value struct {
	addr  netip.Addr
	num   uint64
	str   string
	isNum bool
	// numRange, when > 0, means "any of 0..numRange-1" (numgen random).
	numRange uint64
	// ctState marks the value of "ct state", which compares only with state names.
	ctState bool
}

func (v value) String() string {
	switch {
	case v.addr.IsValid():
		return v.addr.String()
	case v.isNum:
		return strconv.FormatUint(v.num, 10)
	}
	return v.str
}

// tokens is a rule being read.
type tokens struct {
	toks []string
	pos  int
}

func tokenize(rule string) []string {
	var out []string
	for _, f := range strings.Fields(rule) {
		// Split "{", "}", "," off words; our rules put spaces around them anyway.
		for f != "" {
			switch {
			case strings.HasPrefix(f, "{") || strings.HasPrefix(f, "}") || strings.HasPrefix(f, ","):
				out = append(out, f[:1])
				f = f[1:]
			case strings.HasSuffix(f, ",") || strings.HasSuffix(f, "}"):
				out = append(out, f[:len(f)-1])
				f = f[len(f)-1:]
			default:
				out = append(out, f)
				f = ""
			}
		}
	}
	return out
}

func (t *tokens) peek(n int) string {
	if t.pos+n < len(t.toks) {
		return t.toks[t.pos+n]
	}
	return ""
}

func (t *tokens) next() string {
	s := t.peek(0)
	t.pos++
	return s
}

func (t *tokens) done() bool { return t.pos >= len(t.toks) }

func (t *tokens) expect(words ...string) error {
	for _, w := range words {
		if got := t.next(); got != w {
			return fmt.Errorf("expected %q, got %q", w, got)
		}
	}
	return nil
}

// selector reads one selector expression (no concatenation) and evaluates it.
func (tr *Tracer) selector(t *tokens, s *state) (value, error) {
	w := t.next()
	switch w {
	case "ip", "ip6":
		switch t.next() {
		case "saddr":
			return value{addr: s.src}, nil
		case "daddr":
			return value{addr: s.dst}, nil
		}
	case "meta":
		switch t.next() {
		case "l4proto":
			return value{str: s.proto}, nil
		case "mark":
			return value{num: uint64(s.mark), isNum: true}, nil
		}
	case "th", "tcp", "udp", "sctp":
		if t.next() == "dport" {
			if w != "th" && w != s.proto {
				// A protocol-specific field on another protocol never matches.
				return value{str: "\x00mismatch"}, nil
			}
			return value{num: uint64(s.port), isNum: true}, nil
		}
	case "iifname":
		return value{str: s.iif}, nil
	case "ct":
		if v, ok := ctSelector(t, s); ok {
			return v, nil
		}
	case "fib":
		if t.next() == "saddr" && t.next() == "type" {
			if tr.isLocal(s.src) {
				return value{str: "local"}, nil
			}
			return value{str: "unicast"}, nil
		}
	case "numgen":
		return numgenSelector(t)
	case "jhash":
		return jhashSelector(t, s)
	}
	if strings.HasPrefix(w, "@nh,") {
		return rawPayloadSelector(w, s)
	}
	return value{}, fmt.Errorf("unknown selector at %q", w)
}

// rawPayloadSelector evaluates "@nh,OFFSET,8", the raw network-header byte the
// consistentHash rotation chains read: only the last byte of the source address is
// modelled (offset 120 in IPv4, 184 in IPv6).
func rawPayloadSelector(w string, s *state) (value, error) {
	want := "@nh,120,8"
	if s.src.Is6() {
		want = "@nh,184,8"
	}
	if w != want {
		return value{}, fmt.Errorf("raw payload %s of a %s packet: only %s (the last byte of the source address) is modelled", w, s.proto, want)
	}
	b := s.src.AsSlice()
	return value{num: uint64(b[len(b)-1]), isNum: true}, nil
}

// mask applies "& lit" to address a, lit being an address of its family.
func mask(a netip.Addr, lit string) (netip.Addr, error) {
	b, err := netip.ParseAddr(lit)
	if err != nil || b.Is4() != a.Is4() {
		return netip.Addr{}, fmt.Errorf("& %s on %s: want an address of its family", lit, a)
	}
	x, y := a.AsSlice(), b.AsSlice()
	for i := range x {
		x[i] &= y[i]
	}
	out, _ := netip.AddrFromSlice(x)
	return out, nil
}

// ctSelector reads the rest of a "ct" selector (after "ct"); ok is false for one the
// tracer does not know.
func ctSelector(t *tokens, s *state) (v value, ok bool) {
	switch t.next() {
	case "state":
		return value{str: string(s.ct), ctState: true}, true
	case "status":
		if s.dnatted {
			return value{str: "dnat"}, true
		}
		return value{str: ""}, true
	case "original":
		switch t.next() {
		case "ip", "ip6":
			switch t.next() {
			case "daddr":
				return value{addr: s.origDst}, true
			case "saddr":
				return value{addr: s.src}, true
			}
		case "protocol":
			return value{str: s.proto}, true
		case "proto-dst":
			return value{num: uint64(s.origPort), isNum: true}, true
		}
	}
	return value{}, false
}

// numgenSelector reads the rest of "numgen random|inc mod N [offset K]" (after
// "numgen"): any of 0..N-1. The counter of "inc" is not modelled: over many connections
// it reaches every value, which is what the tracer reports. An offset is modelled only
// with "mod 1", the constant K the round-robin pick-at chains use.
func numgenSelector(t *tokens) (value, error) {
	if kind := t.next(); kind != "random" && kind != "inc" {
		return value{}, fmt.Errorf("unknown numgen %q", kind)
	}
	if err := t.expect("mod"); err != nil {
		return value{}, err
	}
	n, err := strconv.ParseUint(t.next(), 10, 32)
	if err != nil || n == 0 {
		return value{}, fmt.Errorf("bad numgen modulus")
	}
	if t.peek(0) != "offset" {
		return value{numRange: n, isNum: true}, nil
	}
	t.next()
	k, err := strconv.ParseUint(t.next(), 10, 32)
	if err != nil || n != 1 {
		return value{}, fmt.Errorf("numgen offset is modelled only as a constant (mod 1)")
	}
	return value{num: k, isNum: true}, nil
}

// jhashSelector reads the rest of "jhash ip|ip6 saddr [& MASK] mod N seed S" (after
// "jhash") and computes the value the kernel does for the packet's source, masked
// first if a mask is given (nft_jhash_eval over the bitwise expression's result).
func jhashSelector(t *tokens, s *state) (value, error) {
	fam := t.next()
	if fam != "ip" && fam != "ip6" {
		return value{}, fmt.Errorf("jhash of %q", fam)
	}
	if err := t.expect("saddr"); err != nil {
		return value{}, err
	}
	src := s.src
	if t.peek(0) == "&" {
		t.next()
		var err error
		if src, err = mask(src, t.next()); err != nil {
			return value{}, fmt.Errorf("jhash: %w", err)
		}
	}
	if err := t.expect("mod"); err != nil {
		return value{}, err
	}
	n, err := strconv.ParseUint(t.next(), 10, 32)
	if err != nil || n == 0 {
		return value{}, fmt.Errorf("bad jhash modulus")
	}
	if err := t.expect("seed"); err != nil {
		return value{}, err
	}
	seed, err := strconv.ParseUint(t.next(), 0, 32)
	if err != nil {
		return value{}, fmt.Errorf("bad jhash seed: %w", err)
	}
	if (fam == "ip") != s.src.Is4() {
		return value{}, fmt.Errorf("jhash %s saddr of %s", fam, s.src)
	}
	return value{num: uint64(JHashMod(src, uint32(seed), uint32(n))), isNum: true}, nil
}

// expr reads a concatenation of selectors, each maybe XORed with a constant ("@nh,120,8
// ^ 0x7": a number, as the rotation chains' slot).
func (tr *Tracer) expr(t *tokens, s *state) ([]value, error) {
	var vals []value
	for {
		v, err := tr.selector(t, s)
		if err != nil {
			return nil, err
		}
		if t.peek(0) == "^" {
			t.next()
			x, err := strconv.ParseUint(t.next(), 0, 32)
			if err != nil || !v.isNum || v.numRange > 0 {
				return nil, fmt.Errorf("^ is modelled only between a number and a constant")
			}
			v.num ^= x
		}
		vals = append(vals, v)
		if t.peek(0) != "." {
			return vals, nil
		}
		t.next()
	}
}

func isSelectorStart(w string) bool {
	switch w {
	case "ip", "ip6", "meta", "th", "tcp", "udp", "sctp", "iifname", "ct", "fib", "numgen", "jhash":
		return true
	}
	return strings.HasPrefix(w, "@nh,")
}

// componentMatches compares one evaluated value with one element or literal component.
func componentMatches(lit string, v value) bool {
	lit = strings.Trim(lit, `"`)
	switch {
	case v.addr.IsValid():
		if strings.Contains(lit, "/") {
			p, err := netip.ParsePrefix(lit)
			return err == nil && p.Contains(v.addr)
		}
		a, err := netip.ParseAddr(lit)
		return err == nil && a == v.addr
	case v.isNum:
		lo, hi, err := parseRange(lit)
		return err == nil && v.num >= lo && v.num <= hi
	default:
		if strings.HasSuffix(lit, "*") {
			return strings.HasPrefix(v.str, strings.TrimSuffix(lit, "*"))
		}
		return lit == v.str
	}
}

func parseRange(lit string) (uint64, uint64, error) {
	if lo, hi, ok := strings.Cut(lit, "-"); ok {
		l, err1 := strconv.ParseUint(lo, 0, 64)
		h, err2 := strconv.ParseUint(hi, 0, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("bad range %q", lit)
		}
		return l, h, nil
	}
	n, err := strconv.ParseUint(lit, 0, 64)
	return n, n, err
}

// expand turns values with a numgen range into every concrete combination.
func expand(vals []value) [][]value {
	out := [][]value{{}}
	for _, v := range vals {
		var next [][]value
		if v.numRange > 0 {
			for n := uint64(0); n < v.numRange; n++ {
				for _, o := range out {
					next = append(next, append(append([]value{}, o...), value{num: n, isNum: true}))
				}
			}
		} else {
			for _, o := range out {
				next = append(next, append(append([]value{}, o...), v))
			}
		}
		out = next
	}
	return out
}

// lookup finds the elements of a set or map matching the key.
func lookup(tbl *knftables.FakeTable, name string, key []value) ([]*knftables.Element, error) {
	var elems []*knftables.Element
	if st, ok := tbl.Sets[name]; ok {
		elems = st.Elements
	} else if m, ok := tbl.Maps[name]; ok {
		elems = m.Elements
	} else {
		return nil, fmt.Errorf("no set or map %q", name)
	}
	var out []*knftables.Element
	for _, e := range elems {
		if len(e.Key) != len(key) {
			return nil, fmt.Errorf("key of %d parts against @%s elements of %d", len(key), name, len(e.Key))
		}
		ok := true
		for i := range key {
			if !componentMatches(e.Key[i], key[i]) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// literal reads a literal or a { a, b } set literal.
func literal(t *tokens) []string {
	if t.peek(0) != "{" {
		return []string{t.next()}
	}
	t.next()
	var out []string
	for !t.done() {
		w := t.next()
		switch w {
		case "}":
			return out
		case ",":
		default:
			out = append(out, w)
		}
	}
	return out
}

// evalRule runs one rule on a state and returns the resulting states.
func (tr *Tracer) evalRule(tbl *knftables.FakeTable, rule string, s *state, depth int) ([]*state, error) {
	return tr.evalFrom(tbl, &tokens{toks: tokenize(rule)}, s.clone(), depth)
}

// evalFrom runs the rest of a rule from t's position on s (which it may change).
func (tr *Tracer) evalFrom(tbl *knftables.FakeTable, t *tokens, s *state, depth int) ([]*state, error) {
	for !t.done() {
		w := t.peek(0)
		switch {
		case isPayloadSet(w, t.peek(2)):
			matched, err := tr.evalPayloadSet(tbl, t, s)
			if err != nil {
				return nil, err
			}
			if !matched {
				return []*state{s}, nil
			}
		case isSelectorStart(w) && !(w == "meta" && t.peek(1) == "mark" && t.peek(2) == "set"):
			vals, err := tr.expr(t, s)
			if err != nil {
				return nil, err
			}
			if hasRange(vals) && t.peek(0) != "vmap" {
				return tr.forkMatch(tbl, t, s, vals, depth)
			}
			matched, res, err := tr.evalMatch(tbl, t, s, vals, depth)
			if err != nil {
				return nil, err
			}
			if res != nil {
				return res, nil
			}
			if !matched {
				return []*state{s}, nil
			}
		case w == "meta":
			if err := evalMarkSet(t, s); err != nil {
				return nil, err
			}
		case w == "jump" || w == "goto":
			t.next()
			return tr.jump(tbl, w, t.next(), s, depth)
		case w == "return" || w == "drop" || w == "reject" || w == "accept":
			t.next()
			s.verdict = w
			return []*state{s}, nil
		case w == "masquerade":
			t.next()
			if t.peek(0) == "fully-random" {
				t.next()
			}
			s.masq = true
			s.verdict = "nat"
			return []*state{s}, nil
		case w == "dnat":
			return tr.evalDNAT(tbl, t, s)
		case w == "update":
			if err := tr.evalUpdate(t, s); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unknown statement at %q", w)
		}
	}
	return []*state{s}, nil
}

// hasRange reports whether a value is a numgen range (any of several numbers).
func hasRange(vals []value) bool {
	for _, v := range vals {
		if v.numRange > 0 {
			return true
		}
	}
	return false
}

// forkMatch compares a numgen range with what follows once for each number it can
// take: the rule goes on for the numbers that match and ends for the others (the packet
// goes on to the next rule), as it does in the kernel for one packet or another. Rules
// tried in turn, each with its own numgen, place new ClientIP-affinity clients.
func (tr *Tracer) forkMatch(tbl *knftables.FakeTable, t *tokens, s *state, vals []value, depth int) ([]*state, error) {
	var out []*state
	missed := false
	for _, concrete := range expand(vals) {
		tc := &tokens{toks: t.toks, pos: t.pos}
		matched, res, err := tr.evalMatch(tbl, tc, s, concrete, depth)
		switch {
		case err != nil:
			return nil, err
		case res != nil:
			out = append(out, res...)
		case !matched:
			missed = true
		default:
			rest, err := tr.evalFrom(tbl, tc, s.clone(), depth)
			if err != nil {
				return nil, err
			}
			out = append(out, rest...)
		}
	}
	if missed {
		out = append(out, s)
	}
	return out, nil
}

// isPayloadSet reports whether a statement starting "w _ third" writes a header field
// ("ip daddr set ...", "tcp dport set ...").
func isPayloadSet(w, third string) bool {
	switch w {
	case "ip", "ip6", "th", "tcp", "udp", "sctp":
		return third == "set"
	}
	return false
}

// evalPayloadSet applies "ip|ip6 daddr set <expr> map @m" and "tcp|udp|sctp dport set
// <expr> map @m": the destination address or port becomes the map's value for the key.
// A miss ends the rule (matched false), as in the kernel; the packet keeps any field an
// earlier statement of the rule wrote.
func (tr *Tracer) evalPayloadSet(tbl *knftables.FakeTable, t *tokens, s *state) (bool, error) {
	hdr, field := t.next(), t.next()
	t.next() // set
	vals, err := tr.expr(t, s)
	if err != nil {
		return false, err
	}
	if err := t.expect("map"); err != nil {
		return false, fmt.Errorf("%s %s set: only a map lookup is modelled: %w", hdr, field, err)
	}
	name := strings.TrimPrefix(t.next(), "@")
	elems, err := lookup(tbl, name, vals)
	if err != nil || len(elems) == 0 {
		return false, err
	}
	if len(elems[0].Value) != 1 {
		return false, fmt.Errorf("%s %s set: map @%s value %v is not one field", hdr, field, name, elems[0].Value)
	}
	v := elems[0].Value[0]
	switch {
	case (hdr == "ip" || hdr == "ip6") && field == "daddr":
		a, err := netip.ParseAddr(v)
		if err != nil {
			return false, fmt.Errorf("%s daddr set: %w", hdr, err)
		}
		s.dst = a
	case field == "dport" && (hdr == "th" || hdr == s.proto):
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return false, fmt.Errorf("%s dport set: %w", hdr, err)
		}
		s.port = uint16(p)
	default:
		return false, fmt.Errorf("%s %s set on a %s packet is not modelled", hdr, field, s.proto)
	}
	return true, nil
}

// evalMarkSet applies "meta mark set meta mark (or|xor) X".
func evalMarkSet(t *tokens, s *state) error {
	if err := t.expect("meta", "mark", "set", "meta", "mark"); err != nil {
		return err
	}
	op := t.next()
	n, err := strconv.ParseUint(t.next(), 0, 32)
	if err != nil {
		return fmt.Errorf("bad mark: %w", err)
	}
	switch op {
	case "or":
		s.mark |= uint32(n)
	case "xor":
		s.mark ^= uint32(n)
	default:
		return fmt.Errorf("unknown mark operation %q", op)
	}
	return nil
}

// evalMatch handles what follows an expression: a comparison, a set lookup or a vmap.
// It returns matched=false to stop the rule, or final states when a vmap decided.
func (tr *Tracer) evalMatch(tbl *knftables.FakeTable, t *tokens, s *state, vals []value, depth int) (bool, []*state, error) {
	w := t.peek(0)
	negate := false
	if w == "!=" {
		negate = true
		t.next()
		w = t.peek(0)
	}
	switch {
	case w == "&":
		return matchMask(t, vals)
	case len(vals) == 1 && vals[0].ctState && (w == "vmap" || w == "&" || strings.HasPrefix(w, "@")):
		return false, nil, fmt.Errorf("ct state compared with %q: only state names are modelled", w)
	case w == "vmap" && t.peek(1) == "{":
		return tr.evalAnonVmap(tbl, t, s, vals, depth)
	case w == "vmap":
		if negate {
			return false, nil, fmt.Errorf("negated vmap")
		}
		return tr.evalVmap(tbl, t, s, vals, depth)
	case strings.HasPrefix(w, "@"):
		t.next()
		elems, err := lookup(tbl, strings.TrimPrefix(w, "@"), vals)
		if err != nil {
			return false, nil, err
		}
		return (len(elems) > 0) != negate, nil, nil
	default:
		matched, err := matchLiterals(t, vals)
		if err != nil {
			return false, nil, err
		}
		return matched != negate, nil, nil
	}
}

// matchMask evaluates "& MASK (==|!=) VALUE" on a single value.
func matchMask(t *tokens, vals []value) (bool, []*state, error) {
	t.next()
	mask, err := strconv.ParseUint(t.next(), 0, 32)
	if err != nil {
		return false, nil, err
	}
	op := t.next()
	want, err := strconv.ParseUint(t.next(), 0, 32)
	if err != nil || len(vals) != 1 {
		return false, nil, fmt.Errorf("bad mask comparison")
	}
	got := vals[0].num & mask
	if op == "!=" {
		return got != want, nil, nil
	}
	return got == want, nil, nil
}

// evalAnonVmap follows an anonymous verdict map, as in
// "numgen random mod 2 vmap { 0 : goto a, 1 : goto b }": every entry whose key the value
// can take (each of a numgen range) gives its chain's states; none means no match.
func (tr *Tracer) evalAnonVmap(tbl *knftables.FakeTable, t *tokens, s *state, vals []value, depth int) (bool, []*state, error) {
	t.next()
	t.next()
	var out []*state
	for !t.done() && t.peek(0) != "}" {
		k := t.next()
		if err := t.expect(":"); err != nil {
			return false, nil, err
		}
		verdict, chain := t.next(), ""
		if verdict == "goto" || verdict == "jump" {
			chain = t.next()
		}
		if t.peek(0) == "," {
			t.next()
		}
		if len(vals) != 1 {
			return false, nil, fmt.Errorf("anonymous vmap needs a single key")
		}
		n, err := strconv.ParseUint(k, 10, 32)
		if err != nil {
			return false, nil, err
		}
		if vals[0].numRange > 0 && n >= vals[0].numRange || vals[0].numRange == 0 && !componentMatches(k, vals[0]) {
			continue
		}
		if chain == "" {
			return false, nil, fmt.Errorf("anonymous vmap verdict %q not supported", verdict)
		}
		res, err := tr.jump(tbl, verdict, chain, s.clone(), depth)
		if err != nil {
			return false, nil, err
		}
		out = append(out, res...)
	}
	if len(out) == 0 {
		return false, nil, nil
	}
	return true, out, nil
}

// evalVmap looks the values up in a named verdict map ("vmap @m") and applies the
// verdict of the first matching element; no element means no match. A numgen range
// ("numgen inc mod 3 vmap @m") takes every index it can, each to its own outcome.
func (tr *Tracer) evalVmap(tbl *knftables.FakeTable, t *tokens, s *state, vals []value, depth int) (bool, []*state, error) {
	t.next()
	name := strings.TrimPrefix(t.next(), "@")
	keys := expand(vals)
	var out []*state
	for _, key := range keys {
		elems, err := lookup(tbl, name, key)
		if err != nil {
			return false, nil, err
		}
		if len(elems) == 0 {
			continue
		}
		n := s
		if len(keys) > 1 {
			n = s.clone()
		}
		res, err := tr.applyVerdict(tbl, name, elems[0].Value, n, depth)
		if err != nil {
			return false, nil, err
		}
		out = append(out, res...)
	}
	return len(out) > 0, out, nil
}

// applyVerdict applies the verdict value of an element of the verdict map name.
func (tr *Tracer) applyVerdict(tbl *knftables.FakeTable, name string, value []string, s *state, depth int) ([]*state, error) {
	verdict := strings.Fields(strings.Join(value, " "))
	switch verdict[0] {
	case "goto", "jump":
		return tr.jump(tbl, verdict[0], verdict[1], s, depth)
	case "drop", "accept", "return":
		s.verdict = verdict[0]
		return []*state{s}, nil
	}
	return nil, fmt.Errorf("unknown verdict %q in @%s", verdict, name)
}

// matchLiterals compares a single value with a literal or a { a, b } set literal: true
// when any element matches. A ct state value only compares with state names.
func matchLiterals(t *tokens, vals []value) (bool, error) {
	if len(vals) != 1 {
		return false, fmt.Errorf("comparison of a concatenation with %q", t.peek(0))
	}
	lits := literal(t)
	any := false
	for _, l := range lits {
		if vals[0].ctState && !ctStates[l] {
			return false, fmt.Errorf("unknown conntrack state %q", l)
		}
		if componentMatches(l, vals[0]) {
			any = true
		}
	}
	return any, nil
}

func (tr *Tracer) jump(tbl *knftables.FakeTable, how, chain string, s *state, depth int) ([]*state, error) {
	res, err := tr.runChain(tbl, chain, s, depth+1)
	if err != nil {
		return nil, err
	}
	for _, r := range res {
		if how == "goto" && r.verdict == "" {
			// The end of a goto'd chain ends the chain that went there.
			r.verdict = "return"
		}
	}
	return res, nil
}

// evalDNAT handles "dnat ip to <expr> map @m": one state per distinct target.
func (tr *Tracer) evalDNAT(tbl *knftables.FakeTable, t *tokens, s *state) ([]*state, error) {
	t.next()
	fam := t.next()
	if fam != "ip" && fam != "ip6" {
		return nil, fmt.Errorf("dnat without family")
	}
	if err := t.expect("to"); err != nil {
		return nil, err
	}
	if !isSelectorStart(t.peek(0)) {
		return dnatLiteral(t, s)
	}
	vals, err := tr.expr(t, s)
	if err != nil {
		return nil, err
	}
	if err := t.expect("map"); err != nil {
		return nil, err
	}
	name := strings.TrimPrefix(t.next(), "@")
	if !t.done() {
		return nil, fmt.Errorf("unexpected %q after dnat", t.peek(0))
	}
	out, err := dnatTargets(tbl, name, vals, s)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		// A lookup miss makes the rule not match.
		return []*state{s}, nil
	}
	return out, nil
}

// dnatLiteral handles a literal target: "dnat ip to 10.0.0.1:80", "dnat ip6 to [fd00::1]:80".
func dnatLiteral(t *tokens, s *state) ([]*state, error) {
	ap, err := netip.ParseAddrPort(t.next())
	if err != nil {
		return nil, fmt.Errorf("bad dnat target: %w", err)
	}
	if !t.done() {
		return nil, fmt.Errorf("unexpected %q after dnat", t.peek(0))
	}
	s.dst, s.port, s.dnatted, s.verdict = ap.Addr(), ap.Port(), true, "nat"
	return []*state{s}, nil
}

// dnatTargets looks every concrete key of vals up in the map @name and returns one
// DNATed copy of s per distinct "addr . port" found (none when every lookup misses).
func dnatTargets(tbl *knftables.FakeTable, name string, vals []value, s *state) ([]*state, error) {
	seen := map[string]bool{}
	var out []*state
	for _, key := range expand(vals) {
		elems, err := lookup(tbl, name, key)
		if err != nil {
			return nil, err
		}
		if len(elems) == 0 {
			continue
		}
		v := elems[0].Value
		if len(v) != 2 {
			return nil, fmt.Errorf("dnat map @%s value %v is not addr . port", name, v)
		}
		if seen[strings.Join(v, ":")] {
			continue
		}
		seen[strings.Join(v, ":")] = true
		addr, err := netip.ParseAddr(v[0])
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(v[1], 10, 16)
		if err != nil {
			return nil, err
		}
		n := s.clone()
		n.dst, n.port, n.dnatted, n.verdict = addr, uint16(port), true, "nat"
		out = append(out, n)
	}
	return out, nil
}

// evalUpdate records "update @set { key }".
func (tr *Tracer) evalUpdate(t *tokens, s *state) error {
	t.next()
	name := t.next()
	if err := t.expect("{"); err != nil {
		return err
	}
	key, err := tr.expr(t, s)
	if err != nil {
		return err
	}
	if err := t.expect("}"); err != nil {
		return err
	}
	s.updates = append(s.updates, fmt.Sprintf("%s { %s }", name, join(key)))
	return nil
}

func join(vals []value) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = v.String()
	}
	return strings.Join(parts, " . ")
}
