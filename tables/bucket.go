package tables

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The bucket chains (rr-bucket-<b>, aff-bucket-<b>; names.go) hold the rules of many
// Service ports each, so their order is a protocol of its own, kept in this file:
//
//   - The compiler gives each port's rules in a bucket as one ruleGroup, under a key
//     of the port's own (portCompiler.groupKey). Each rule is a BucketRule, kept as its
//     parts: both writers write it from them (nft text, netlink expressions), and
//     NetlinkWriter finds it in the kernel by them, so no rule text is read back.
//   - The ledger holds a chain's groups with a sequence number each (heldGroup.seq,
//     countRules): the chain's rules are its groups in the order they came (rulesOf),
//     and a group that comes back within a change with the same rules keeps its place.
//   - A partial sync writes a bucket that existed as a ChainEdit (groupEdit): the
//     rules of the groups that went or changed, by position in what the kernel holds,
//     and those of the groups that came or changed, appended, since they come last.
//   - nft cannot find rules to delete, so it rewrites a bucket that loses rules and
//     appends to one that only gains them (ChainRules.appendOnly), keeping the other
//     rules' numgen counters; NetlinkWriter deletes the lost rules by handle
//     (ruleHandles, after checking that the kernel's rules are the expected ones:
//     BucketRule.foundIn) and encodes the appended rules itself (BucketRule.exprs;
//     consistentHash's affinity picks go through nft).

// ruleGroup is the rules one port has in a chain that holds the rules of several ports,
// in order, under a key unique to the port (groupKey): the chain holds the groups in
// the order they came (ledger.countRules).
type ruleGroup struct {
	chain, key string
	rules      []BucketRule
}

// heldGroup is a rule group in chainRules, how many ports hold it (one, but for a port
// compiled again before its release within a change), and its place in the chain.
type heldGroup struct {
	rules []BucketRule
	n     int
	seq   uint64
}

// countRules adds (delta +1) or takes away (-1) groups in their chains, recording each
// chain's groups before its first change in log.groupsBefore (if tracked). A group
// that comes back within a change with the rules it had keeps its place.
func (l *ledger) countRules(log *changeLog, groups []ruleGroup, delta int) {
	for _, g := range groups {
		if log.tracked {
			if _, seen := log.groupsBefore[g.chain]; !seen {
				log.groupsBefore[g.chain] = maps.Clone(l.chainRules[g.chain])
			}
		}
		held := l.chainRules[g.chain]
		if held == nil {
			held = map[string]heldGroup{}
			l.chainRules[g.chain] = held
		}
		h := held[g.key]
		if delta > 0 && h.n <= 0 {
			h.rules = g.rules
			if was, ok := log.groupsBefore[g.chain][g.key]; ok && slices.EqualFunc(was.rules, g.rules, BucketRule.equal) {
				h.seq = was.seq
			} else {
				l.groupSeq++
				h.seq = l.groupSeq
			}
		}
		h.n += delta
		held[g.key] = h
		if h.n <= 0 {
			delete(held, g.key)
		}
		if len(held) == 0 {
			delete(l.chainRules, g.chain)
		}
	}
}

// rulesOf returns the rules of a chain of chainRules: its groups in the order they came.
func (l *ledger) rulesOf(chain string) []BucketRule {
	return groupRules(inOrder(l.chainRules[chain]))
}

// inOrder returns the groups of a chain in the order they came.
func inOrder(held map[string]heldGroup) []heldGroup {
	groups := slices.Collect(maps.Values(held))
	slices.SortFunc(groups, func(a, b heldGroup) int { return cmp.Compare(a.seq, b.seq) })
	return groups
}

// groupRules concatenates the rules of groups.
func groupRules(groups []heldGroup) []BucketRule {
	var rules []BucketRule
	for _, g := range groups {
		rules = append(rules, g.rules...)
	}
	return rules
}

// ruleChainChanges returns the chains of chainRules the change touched whose groups
// changed, to be written, and those it emptied, to be deleted; sorted by name. A chain
// that existed is written as a ChainEdit: the rules of the groups that went or changed
// (by position), and those of new or changed groups, appended (they came last).
func (l *ledger) ruleChainChanges(log *changeLog) (written []ChainRules, gone []string) {
	for _, ch := range slices.Sorted(maps.Keys(log.groupsBefore)) {
		was, now := log.groupsBefore[ch], l.chainRules[ch]
		switch {
		case len(now) == 0:
			if len(was) > 0 {
				gone = append(gone, ch)
			}
		case len(was) == 0:
			written = append(written, ChainRules{Name: ch, Bucket: l.rulesOf(ch)})
		default:
			if cr := groupEdit(ch, was, now); len(cr.Edit.Remove) > 0 || len(cr.Edit.Append) > 0 {
				written = append(written, cr)
			}
		}
	}
	return written, gone
}

// groupEdit is the change of a chain from groups was to groups now: the rules of
// groups that went or changed, at their positions in was's rules, and the rules of the
// groups that came or changed, which come after every kept one (countRules numbers
// them last).
func groupEdit(ch string, was, now map[string]heldGroup) ChainRules {
	seqs := func(groups map[string]heldGroup) map[uint64]bool {
		out := make(map[uint64]bool, len(groups))
		for _, g := range groups {
			out[g.seq] = true
		}
		return out
	}
	wasSeqs, nowSeqs := seqs(was), seqs(now)
	nowGroups := inOrder(now)
	edit := &ChainEdit{}
	for _, g := range inOrder(was) {
		for _, r := range g.rules {
			if !nowSeqs[g.seq] {
				edit.Remove = append(edit.Remove, PlacedRule{At: edit.Held, Rule: r})
			}
			edit.Held++
		}
	}
	for _, g := range nowGroups {
		if !wasSeqs[g.seq] {
			edit.Append = append(edit.Append, g.rules...)
		}
	}
	return ChainRules{Name: ch, Bucket: groupRules(nowGroups), MayExist: true, Edit: edit}
}

// ChainEdit is how a Diff changes a bucket chain the kernel holds, in place, instead of
// rewriting it: an Applier that can find rules in the kernel removes and appends just
// these, and the other rules keep their numgen inc counters (a rewritten rule's starts
// again, and a bucket holds the round-robin rules of ~40 Service ports).
type ChainEdit struct {
	// Held is the number of rules the chain holds in the kernel before the edit.
	Held int
	// Remove are the rules that go, with their positions among the Held ones, in order.
	Remove []PlacedRule
	// Append are the rules that come after those that stay: the last of the chain's.
	Append []BucketRule
}

// PlacedRule is a rule of a bucket chain and its position in the chain.
type PlacedRule struct {
	At   int
	Rule BucketRule
}

// appendOnly reports whether the chain is a bucket edited in place that only gains
// rules: nft appends them, and the other rules (and their numgen counters) stay. nft
// cannot find the handles of rules to delete, so it rewrites a chain that loses any.
func (ch ChainRules) appendOnly() bool { return ch.Edit != nil && len(ch.Edit.Remove) == 0 }

// BucketRule is one rule of a bucket chain, kept as its parts: the equality match of a
// port's cluster IP entry ("ip daddr 172.30.0.10 tcp dport 80"), then either the
// round-robin pick among picks endpoints ("numgen inc mod 3 vmap @round-robin-picks",
// portCompiler.roundRobinRule) or an affinity rule (affinityRule). It is written as nft
// text (String) and as netlink expressions (exprs; consistentHash's affinity picks
// excepted), and found in the kernel by its parts (foundIn).
type BucketRule struct {
	en entry
	// picks is a round-robin rule's modulus; 0 for an affinity rule.
	picks int
	// aff is an affinity rule's part after the entry match; nil for a round-robin rule.
	aff *affinityRule
}

// roundRobinRule is the round-robin bucket rule of entry en over n endpoints.
func roundRobinRule(en entry, n int) BucketRule { return BucketRule{en: en, picks: n} }

// affinityRules are the affinity bucket rules of entry en: each of rules after the
// entry's match.
func affinityRules(en entry, rules []*affinityRule) []BucketRule {
	out := make([]BucketRule, len(rules))
	for i, r := range rules {
		out[i] = BucketRule{en: en, aff: r}
	}
	return out
}

// equal reports whether r and o are the same rule, by their parts.
func (r BucketRule) equal(o BucketRule) bool {
	if r.en != o.en || r.picks != o.picks || (r.aff == nil) != (o.aff == nil) {
		return false
	}
	return r.aff == nil || r.aff.equal(o.aff)
}

// String returns the rule as nft text. A bucket written whole through nft has all its
// rules written again (~40 at 10,000 Services): one allocation a round-robin rule, and
// its pick's.
func (r BucketRule) String() string {
	ip := "ip"
	if r.en.addr.Is6() {
		ip = "ip6"
	}
	var rest, vmap string
	if r.picks > 0 {
		rest, vmap = pickExpr(LBRoundRobin, ip, r.picks), " vmap @"+mapRoundRobinPicks
	} else if r.aff != nil {
		rest = r.aff.String()
	}
	var scratch [64]byte
	addr := r.en.addr.AppendTo(scratch[:0])
	port := strconv.AppendUint(addr[len(addr):], uint64(r.en.port), 10)
	var b strings.Builder
	b.Grow(len(ip) + len(" daddr ") + len(addr) + 1 + len(r.en.proto) + len(" dport ") + len(port) + 1 + len(rest) + len(vmap))
	b.WriteString(ip)
	b.WriteString(" daddr ")
	b.Write(addr)
	b.WriteByte(' ')
	b.WriteString(string(r.en.proto))
	b.WriteString(" dport ")
	b.Write(port)
	b.WriteByte(' ')
	b.WriteString(rest)
	b.WriteString(vmap)
	return b.String()
}

// affinityRule is a rule of a ClientIP-affinity port (affinity.rules), kept as its
// parts: in a bucket after the port's entry match (BucketRule), or as a rule of the
// port's class chain. It sends a client to endpoint ep and remembers it in ep's set
// (refreshing its timeout): a remembered client, found by its source address in that
// set, or a new one the port's mode places there (pick).
type affinityRule struct {
	// ip is the table's family as nft names it: "ip" or "ip6".
	ip    string
	proto Protocol
	// set is ep's client set.
	set string
	ep  Endpoint
	// remembered: the rule takes the clients in set; else those pick places.
	remembered bool
	pick       newClientPick
}

// newClientPick is how an affinity rule places a new client in its port's mode: with
// mod 0 every client that comes this far (the last rule); else the mode's pick
// expression (pickExpr) mod mod, compared with value or, under consistentHash, with
// the endpoint's slots of the port's table.
type newClientPick struct {
	mode  LBMode
	mod   int
	value int
	slots []int
}

// equal reports whether a and o are the same rule, by their parts.
func (a *affinityRule) equal(o *affinityRule) bool {
	return a.ip == o.ip && a.proto == o.proto && a.set == o.set && a.ep == o.ep && a.remembered == o.remembered &&
		a.pick.mode == o.pick.mode && a.pick.mod == o.pick.mod && a.pick.value == o.pick.value && slices.Equal(a.pick.slots, o.pick.slots)
}

// String returns the rule as nft text: its match (the client set, or the new client's
// pick), then the update of ep's set and the DNAT to ep.
func (a *affinityRule) String() string {
	var b strings.Builder
	switch {
	case a.remembered:
		fmt.Fprintf(&b, "%s saddr @%s ", a.ip, a.set)
	case a.pick.mod == 0:
	case a.pick.mode == LBConsistentHash:
		b.WriteString(pickExpr(a.pick.mode, a.ip, a.pick.mod))
		b.WriteString(" { ")
		for i, slot := range a.pick.slots {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Itoa(slot))
		}
		b.WriteString(" } ")
	default:
		fmt.Fprintf(&b, "%s %d ", pickExpr(a.pick.mode, a.ip, a.pick.mod), a.pick.value)
	}
	fmt.Fprintf(&b, "meta l4proto %s update @%s { %s saddr } dnat %s to %s", a.proto, a.set, a.ip, a.ip, a.ep)
	return b.String()
}

// ruleTexts returns rules as nft text.
func ruleTexts[R fmt.Stringer](rules []R) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.String()
	}
	return out
}

// exprs returns the netlink expressions of the rule in a table of family fam, those nft
// 1.0.6 makes of its text (nft --debug=netlink), so that either writer leaves the same
// rule (TestNetlinkWritesRoundRobinBuckets and TestAffinityBucketThroughNetlink compare
// them in the kernel): the entry match, then the round-robin pick or the affinity
// rule's (affinityRule.exprs).
func (r BucketRule) exprs(fam nftables.TableFamily) ([]expr.Any, error) {
	if !r.encodable() {
		return nil, fmt.Errorf("rule %q: not a rule NetlinkWriter can encode", r)
	}
	if r.en.addr.Is4() != (fam == nftables.TableFamilyIPv4) {
		return nil, fmt.Errorf("rule %q: not of this table's family", r)
	}
	offset := uint32(16) // IPv4 header: daddr at 16
	if r.en.addr.Is6() {
		offset = 24 // IPv6 header: daddr at 24
	}
	addr, proto, port := r.matched()
	match := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(len(addr))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: proto},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port},
	}
	if r.aff != nil {
		return append(match, r.aff.exprs()...), nil
	}
	return append(match,
		&expr.Numgen{Register: 1, Modulus: uint32(r.picks), Type: unix.NFT_NG_INCREMENTAL},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: mapRoundRobinPicks},
	), nil
}

// encodable reports whether NetlinkWriter can encode the rule: a round-robin rule, or
// an affinity rule but for consistentHash's new-client picks, whose slots are an
// anonymous set (which only nft writes).
func (r BucketRule) encodable() bool {
	return r.picks > 0 || r.aff != nil && (r.aff.remembered || r.aff.pick.mode != LBConsistentHash || r.aff.pick.mod == 0)
}

// exprs returns the expressions nft 1.0.6 makes of the rule's text, after a bucket
// rule's entry match: the match of a remembered client (its source address in the
// set) or of a new one (numgen, or jhash for sourceHash, compared with the pick's
// value), then the update of the set with the client's address and the DNAT to ep.
// Not for consistentHash's picks (BucketRule.encodable).
func (a *affinityRule) exprs() []expr.Any {
	saddr, addrLen, natFamily := uint32(12), uint32(4), uint32(unix.NFPROTO_IPV4) // IPv4 header: saddr at 12
	if a.ep.IP.Is6() {
		saddr, addrLen, natFamily = 8, 16, unix.NFPROTO_IPV6 // IPv6 header: saddr at 8
	}
	client := func(reg uint32) expr.Any {
		return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: saddr, Len: addrLen}
	}
	value := &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, uint32(a.pick.value))}
	var out []expr.Any
	switch {
	case a.remembered:
		out = append(out, client(1), &expr.Lookup{SourceRegister: 1, SetName: a.set})
	case a.pick.mod == 0:
	case a.pick.mode == LBSourceHash:
		out = append(out, client(2),
			&expr.Hash{SourceRegister: 2, DestRegister: 1, Length: addrLen, Modulus: uint32(a.pick.mod), Seed: HashSeed, Type: expr.HashTypeJenkins},
			value)
	default:
		ng := uint32(unix.NFT_NG_RANDOM)
		if a.pick.mode == LBRoundRobin {
			ng = unix.NFT_NG_INCREMENTAL
		}
		out = append(out, &expr.Numgen{Register: 1, Modulus: uint32(a.pick.mod), Type: ng}, value)
	}
	return append(out,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumbers[a.proto]}},
		client(1),
		&expr.Dynset{SrcRegKey: 1, SetName: a.set, Operation: unix.NFT_DYNSET_OP_UPDATE},
		&expr.Immediate{Register: 1, Data: a.ep.IP.AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, a.ep.Port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true},
	)
}

// matched returns the values the rule's entry match compares, as the kernel holds them:
// the destination address, the protocol's number and the port, in network order.
func (r BucketRule) matched() (addr, proto, port []byte) {
	return r.en.addr.AsSlice(), []byte{protoNumbers[r.en.proto]}, binary.BigEndian.AppendUint16(nil, r.en.port)
}

// foundIn reports whether exprs, a rule the kernel holds, is r: every bucket rule
// starts with its entry match, whose three comparisons are expressions 1, 3 and 5; a
// round-robin rule is then its numgen inc and its map. (An affinity rule is known by
// its match alone: a port's rules in its bucket are together, and removed together.)
func (r BucketRule) foundIn(exprs []expr.Any) bool {
	if len(exprs) < 6 || (r.picks > 0 && len(exprs) != 8) {
		return false
	}
	addr, proto, port := r.matched()
	for i, want := range [][]byte{addr, proto, port} {
		c, ok := exprs[2*i+1].(*expr.Cmp)
		if !ok || c.Op != expr.CmpOpEq || !bytes.Equal(c.Data, want) {
			return false
		}
	}
	if r.picks == 0 {
		return true
	}
	ng, ok1 := exprs[6].(*expr.Numgen)
	lk, ok2 := exprs[7].(*expr.Lookup)
	return ok1 && ok2 && ng.Type == unix.NFT_NG_INCREMENTAL && ng.Modulus == uint32(r.picks) && lk.SetName == mapRoundRobinPicks
}

// netlinkEncodable reports whether NetlinkWriter can write chains: the rules each adds
// (an edit's Append, or all of a bucket written whole) are bucket rules it encodes
// (BucketRule.encodable); rules an edit removes need no encoding.
func netlinkEncodable(chains []ChainRules) bool {
	for _, ch := range chains {
		rules := ch.Bucket
		if ch.Edit != nil {
			rules = ch.Edit.Append
		} else if len(ch.Rules) > 0 || len(ch.Bucket) == 0 {
			return false
		}
		for _, r := range rules {
			if !r.encodable() {
				return false
			}
		}
	}
	return true
}

// ruleHandles returns the kernel's handles of the rules edit removes from chain: the
// kernel lists a chain's rules in order, and the chain is as the Syncer wrote it, so
// they are the rules at the edit's positions. A chain of another length, or a rule
// there that is not the expected one (foundIn), is an error (the Syncer then needs a
// full sync): deleting another port's rule would break that port.
func (w *NetlinkWriter) ruleHandles(conn *nftables.Conn, chain string, edit *ChainEdit) ([]uint64, error) {
	inKernel, err := conn.GetRules(w.table, &nftables.Chain{Name: chain, Table: w.table})
	if err != nil {
		return nil, fmt.Errorf("listing chain %s of table %s: %w", chain, w.table.Name, err)
	}
	if len(inKernel) != edit.Held {
		return nil, fmt.Errorf("chain %s of table %s has %d rules; want %d", chain, w.table.Name, len(inKernel), edit.Held)
	}
	handles := make([]uint64, 0, len(edit.Remove))
	for _, rm := range edit.Remove {
		if !rm.Rule.foundIn(inKernel[rm.At].Exprs) {
			return nil, fmt.Errorf("chain %s of table %s: rule %d is not %q", chain, w.table.Name, rm.At, rm.Rule)
		}
		handles = append(handles, inKernel[rm.At].Handle)
	}
	return handles, nil
}
