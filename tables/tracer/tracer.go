// Package tracer follows packets through the rules of knftables.Fake tables: which
// base chains see them, in priority order, and what each rule does. It understands only
// the rule shapes shardproxy emits and fails loudly on anything else, so a new rule shape
// cannot slip past the tests untraced.
package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// Origin is where a packet comes from.
type Origin string

const (
	// FromPod is a packet from a pod on this node (arrives on a pod interface).
	FromPod Origin = "pod"
	// FromOutside is a packet from outside the node (another node or an external client).
	FromOutside Origin = "outside"
	// FromHost is a packet from a host-network process on this node (output path).
	FromHost Origin = "host"
)

// CtState is the conntrack state of the connection a packet belongs to ("ct state").
type CtState string

const (
	// CtNew is the first packet of a connection: the nat chains decide its translation.
	CtNew CtState = "new"
	// CtEstablished is a later packet of a connection conntrack already tracks: no nat
	// chain sees it, and conntrack translates it as its first packet was (Packet.Conn).
	CtEstablished CtState = "established"
)

// ctStates are the states "ct state" can be compared with; the tracer models new and
// established packets, so a rule naming any other state is an error.
var ctStates = map[string]bool{"new": true, "established": true, "related": true, "invalid": true, "untracked": true}

// Packet is one packet; by default the first packet of a new connection.
type Packet struct {
	Origin Origin
	Src    netip.Addr
	// IIF is the interface the packet arrives on; empty for FromHost.
	IIF   string
	Proto string // tcp, udp or sctp
	Dst   netip.Addr
	Port  uint16
	// State is the conntrack state of the packet's connection; "" means CtNew.
	State CtState
	// Conn is, for a CtEstablished packet, the translation its connection got from the
	// rules when it was new (possibly rules that have changed since).
	Conn Conn
}

// Conn is what conntrack remembers of an established connection's NAT.
type Conn struct {
	// DNAT is the endpoint the connection was DNATed to; invalid when it was not.
	DNAT netip.AddrPort
	// Masquerade says the connection is masqueraded.
	Masquerade bool
}

// Env describes the node the rules run on.
type Env struct {
	// LocalIPs are the node's addresses (fib type local, and the routing decision after
	// DNAT); loopback addresses are always local.
	LocalIPs []netip.Addr
}

// Outcome is one way a packet can end; a random endpoint choice gives one per endpoint.
type Outcome struct {
	// Verdict is "accept", "drop" or "reject".
	Verdict string
	// DNAT is the endpoint "ip:port" the packet was sent to, or "" if not DNATed.
	DNAT string
	// Masquerade is true when the packet was masqueraded in postrouting.
	Masquerade bool
	// Local is true when the (translated) destination is one of the node's addresses.
	Local bool
	// Updates lists the dynamic set updates done on the way, as
	// "@map { key : value } timeout Ns".
	Updates []string
}

// String returns a compact description, for test failure messages.
func (o Outcome) String() string {
	s := o.Verdict
	if o.DNAT != "" {
		s += " dnat " + o.DNAT
	}
	if o.Masquerade {
		s += " masq"
	}
	return s
}

type chainRef struct {
	table    *knftables.FakeTable
	name     string
	typ      string
	hook     string
	priority int
}

// effective is where the kernel really runs the chain: every nat chain runs from the NAT
// hook, at dstnat (-100) on prerouting and output and srcnat (100) on input and
// postrouting; its own priority only orders it among nat chains.
func (c chainRef) effective() int {
	if c.typ != "nat" {
		return c.priority
	}
	if c.hook == "prerouting" || c.hook == "output" {
		return -100
	}
	return 100
}

// Tracer traces packets through a set of tables, as the kernel would order them.
type Tracer struct {
	env   Env
	hooks map[string][]chainRef
}

// New builds a Tracer over the tables of the given fakes.
func New(env Env, fakes ...*knftables.Fake) (*Tracer, error) {
	t := &Tracer{env: env, hooks: map[string][]chainRef{}}
	for _, f := range fakes {
		for _, tables := range f.Tables {
			for _, tbl := range tables {
				for name, ch := range tbl.Chains {
					if ch.Hook == nil {
						continue
					}
					prio, err := parsePriority(string(*ch.Priority))
					if err != nil {
						return nil, fmt.Errorf("chain %s: %w", name, err)
					}
					t.hooks[string(*ch.Hook)] = append(t.hooks[string(*ch.Hook)], chainRef{
						table: tbl, name: name, typ: string(*ch.Type), hook: string(*ch.Hook), priority: prio,
					})
				}
			}
		}
	}
	for _, refs := range t.hooks {
		sort.SliceStable(refs, func(i, j int) bool {
			ei, ej := refs[i].effective(), refs[j].effective()
			if ei != ej {
				return ei < ej
			}
			if refs[i].priority != refs[j].priority {
				return refs[i].priority < refs[j].priority
			}
			return refs[i].table.Name < refs[j].table.Name
		})
	}
	return t, nil
}

var namedPriorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

func parsePriority(s string) (int, error) {
	s = strings.ReplaceAll(s, " ", "")
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	for name, base := range namedPriorities {
		if rest, ok := strings.CutPrefix(s, name); ok {
			if rest == "" {
				return base, nil
			}
			n, err := strconv.Atoi(rest)
			if err == nil {
				return base + n, nil
			}
		}
	}
	return 0, fmt.Errorf("cannot parse priority %q", s)
}

// state is a packet on its way, with what happened to it so far.
type state struct {
	src, dst netip.Addr
	proto    string
	port     uint16
	iif      string
	mark     uint32
	ct       CtState
	conn     Conn

	origDst  netip.Addr
	origPort uint16
	dnatted  bool
	masq     bool
	// natDone is set once a nat chain on the current hook translated the packet.
	natDone bool
	updates []string
	// verdict is "" (continue), "return", "accept", "drop", "reject" or "nat".
	verdict string
}

func (s *state) clone() *state {
	c := *s
	c.updates = slices.Clone(s.updates)
	return &c
}

func (t *Tracer) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.Contains(t.env.LocalIPs, a)
}

// Trace follows p and returns every way it can end, without duplicates: through its
// first hook, then, for each state that was not dropped, through the hooks its
// (translated) destination takes it to.
func (t *Tracer) Trace(p Packet) ([]Outcome, error) {
	st, firstHook, err := initialState(p)
	if err != nil {
		return nil, err
	}
	states, err := t.runHook(firstHook, []*state{st})
	if err != nil {
		return nil, err
	}
	var outcomes []Outcome
	for _, s := range states {
		if s.verdict == "drop" || s.verdict == "reject" {
			outcomes = append(outcomes, t.outcome(s))
			continue
		}
		cur, err := t.runHooks(t.hooksAfter(p.Origin, s), s)
		if err != nil {
			return nil, err
		}
		for _, c := range cur {
			outcomes = append(outcomes, t.outcome(c))
		}
	}
	return dedupe(outcomes), nil
}

// initialState checks p and returns its state before any hook, and the hook it enters
// first: output for a packet from the host, prerouting for one that arrives.
func initialState(p Packet) (*state, string, error) {
	st := &state{src: p.Src, dst: p.Dst, proto: p.Proto, port: p.Port, iif: p.IIF, origDst: p.Dst, origPort: p.Port,
		ct: p.State, conn: p.Conn}
	switch p.State {
	case "":
		st.ct = CtNew
	case CtNew, CtEstablished:
	default:
		return nil, "", fmt.Errorf("unsupported conntrack state %q", p.State)
	}
	if st.ct == CtNew && p.Conn != (Conn{}) {
		return nil, "", fmt.Errorf("a new connection has no conntrack translation yet")
	}
	switch p.Origin {
	case FromHost:
		st.iif = ""
		return st, "output", nil
	case FromPod, FromOutside:
		return st, "prerouting", nil
	}
	return nil, "", fmt.Errorf("unknown origin %q", p.Origin)
}

// hooksAfter is the route after the first hook, decided by where the packet comes from
// and whether its destination, as the first hook left it, is local.
func (t *Tracer) hooksAfter(origin Origin, s *state) []string {
	switch {
	case origin == FromHost && t.isLocal(s.dst):
		return []string{"postrouting", "input"}
	case origin == FromHost:
		return []string{"postrouting"}
	case t.isLocal(s.dst):
		return []string{"input"}
	default:
		return []string{"forward", "postrouting"}
	}
}

// runHooks runs s through the hooks in order; a state dropped or rejected on one hook
// skips the rest.
func (t *Tracer) runHooks(hooks []string, s *state) ([]*state, error) {
	cur := []*state{s}
	for _, h := range hooks {
		var live, done []*state
		for _, c := range cur {
			if c.verdict == "drop" || c.verdict == "reject" {
				done = append(done, c)
			} else {
				live = append(live, c)
			}
		}
		res, err := t.runHook(h, live)
		if err != nil {
			return nil, err
		}
		cur = append(done, res...)
	}
	return cur, nil
}

func (t *Tracer) outcome(s *state) Outcome {
	o := Outcome{Verdict: "accept", Masquerade: s.masq, Local: t.isLocal(s.dst), Updates: s.updates}
	if s.verdict == "drop" || s.verdict == "reject" {
		o.Verdict = s.verdict
	}
	if s.dnatted {
		o.DNAT = netip.AddrPortFrom(s.dst, s.port).String()
	}
	return o
}

func dedupe(in []Outcome) []Outcome {
	seen := map[string]bool{}
	var out []Outcome
	for _, o := range in {
		k := fmt.Sprintf("%s|%v|%v|%v", o.String(), o.Local, o.Updates, o.Verdict)
		if !seen[k] {
			seen[k] = true
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// natPriority is where the kernel's NAT hook sits on a hook: dstnat on prerouting and
// output, srcnat on input and postrouting.
func natPriority(hook string) int {
	if hook == "prerouting" || hook == "output" {
		return -100
	}
	return 100
}

// conntrackNAT translates an established packet at the NAT hook as its connection was.
func conntrackNAT(hook string, s *state) {
	if s.ct != CtEstablished || s.verdict == "drop" || s.verdict == "reject" {
		return
	}
	switch hook {
	case "prerouting", "output":
		if s.conn.DNAT.IsValid() {
			s.dst, s.port, s.dnatted = s.conn.DNAT.Addr(), s.conn.DNAT.Port(), true
		}
	case "postrouting":
		s.masq = s.masq || s.conn.Masquerade
	}
}

// runHook runs every base chain of a hook, in priority order, on each state.
func (t *Tracer) runHook(hook string, in []*state) ([]*state, error) {
	cur := in
	for _, s := range cur {
		s.natDone = false
	}
	natDone := false
	for _, ref := range t.hooks[hook] {
		if !natDone && ref.effective() >= natPriority(hook) {
			natDone = true
			for _, s := range cur {
				conntrackNAT(hook, s)
			}
		}
		var next []*state
		for _, s := range cur {
			if s.verdict == "drop" || s.verdict == "reject" {
				next = append(next, s)
				continue
			}
			if ref.typ == "nat" && (s.natDone || s.ct != CtNew) {
				// Once a nat chain translated the connection, later nat chains on the
				// hook never see it; and nat chains only ever see a connection's first
				// packet.
				next = append(next, s)
				continue
			}
			s.verdict = ""
			res, err := t.runChain(ref.table, ref.name, s, 0)
			if err != nil {
				return nil, fmt.Errorf("%s chain %s: %w", hook, ref.name, err)
			}
			for _, r := range res {
				switch r.verdict {
				case "nat":
					r.natDone = true
					r.verdict = ""
				case "accept", "return":
					r.verdict = ""
				}
				next = append(next, r)
			}
		}
		cur = next
	}
	if !natDone {
		for _, s := range cur {
			conntrackNAT(hook, s)
		}
	}
	return cur, nil
}

// runChain evaluates a chain; the returned states carry the verdict that ended it
// ("" when the chain ran to its end).
func (t *Tracer) runChain(tbl *knftables.FakeTable, name string, s *state, depth int) ([]*state, error) {
	if depth > 16 {
		return nil, fmt.Errorf("chain recursion too deep at %s", name)
	}
	ch := tbl.Chains[name]
	if ch == nil {
		return nil, fmt.Errorf("no chain %q", name)
	}
	return t.runRules(tbl, ch.Rules, 0, s, depth)
}

func (t *Tracer) runRules(tbl *knftables.FakeTable, rules []*knftables.Rule, i int, s *state, depth int) ([]*state, error) {
	if i >= len(rules) {
		return []*state{s}, nil
	}
	results, err := t.evalRule(tbl, rules[i].Rule, s, depth)
	if err != nil {
		return nil, fmt.Errorf("rule %q: %w", rules[i].Rule, err)
	}
	var out []*state
	for _, r := range results {
		if r.verdict == "" {
			more, err := t.runRules(tbl, rules, i+1, r, depth)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
			continue
		}
		if r.verdict == "return" {
			r.verdict = ""
		}
		out = append(out, r)
	}
	return out, nil
}
