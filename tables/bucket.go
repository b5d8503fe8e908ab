package tables

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
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
//     of the port's own (portCompiler.groupKey).
//   - The ledger holds a chain's groups with a sequence number each (heldGroup.seq,
//     countRules): the chain's rules are its groups in the order they came (rulesOf),
//     and a group that comes back within a change with the same rules keeps its place.
//   - A partial sync writes a bucket that existed as a delta (groupDelta): the rules
//     of the groups that went or changed, by position in what the kernel holds, and
//     those of the groups that came or changed, appended, since they come last.
//   - nft cannot find rules to delete, so it rewrites a bucket that loses rules and
//     appends to one that only gains them (ChainRules.appendOnly), keeping the other
//     rules' numgen counters; NetlinkWriter deletes the lost rules by handle
//     (ruleHandles, after checking that the kernel's rules are the expected ones) and
//     encodes the appended round-robin rules itself (ruleExprs).

// ruleGroup is the rules one port has in a chain that holds the rules of several ports,
// in order, under a key unique to the port (groupKey): the chain holds the groups in
// the order they came (ledger.countRules).
type ruleGroup struct {
	chain, key string
	rules      []string
}

// heldGroup is a rule group in chainRules, how many ports hold it (one, but for a port
// compiled again before its release within a change), and its place in the chain.
type heldGroup struct {
	rules []string
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
			if was, ok := log.groupsBefore[g.chain][g.key]; ok && slices.Equal(was.rules, g.rules) {
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
func (l *ledger) rulesOf(chain string) []string {
	return groupRules(inOrder(l.chainRules[chain]))
}

// inOrder returns the groups of a chain in the order they came.
func inOrder(held map[string]heldGroup) []heldGroup {
	groups := slices.Collect(maps.Values(held))
	slices.SortFunc(groups, func(a, b heldGroup) int { return cmp.Compare(a.seq, b.seq) })
	return groups
}

// groupRules concatenates the rules of groups.
func groupRules(groups []heldGroup) []string {
	var rules []string
	for _, g := range groups {
		rules = append(rules, g.rules...)
	}
	return rules
}

// ruleChainChanges returns the chains of chainRules the change touched whose groups
// changed, to be written, and those it emptied, to be deleted; sorted by name. A chain
// that existed is written as a delta: the rules of the groups that went or changed
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
			written = append(written, ChainRules{Name: ch, Rules: l.rulesOf(ch)})
		default:
			if cr := groupDelta(ch, was, now); cr.Removed != nil || cr.Appended != nil {
				written = append(written, cr)
			}
		}
	}
	return written, gone
}

// groupDelta is the change of a chain from groups was to groups now: the positions
// (in was's rules) of the rules of groups that went or changed, and the rules of the
// groups that came or changed, which come after every kept one (countRules numbers
// them last).
func groupDelta(ch string, was, now map[string]heldGroup) ChainRules {
	seqs := func(groups map[string]heldGroup) map[uint64]bool {
		out := make(map[uint64]bool, len(groups))
		for _, g := range groups {
			out[g.seq] = true
		}
		return out
	}
	wasSeqs, nowSeqs := seqs(was), seqs(now)
	nowGroups := inOrder(now)
	cr := ChainRules{Name: ch, Rules: groupRules(nowGroups), MayExist: true, Delta: true}
	for _, g := range inOrder(was) {
		for _, r := range g.rules {
			if !nowSeqs[g.seq] {
				cr.RemovedAt, cr.Removed = append(cr.RemovedAt, cr.Had), append(cr.Removed, r)
			}
			cr.Had++
		}
	}
	for _, g := range nowGroups {
		if !wasSeqs[g.seq] {
			cr.Appended = append(cr.Appended, g.rules...)
		}
	}
	return cr
}

// appendOnly reports whether the chain, a bucket written as a delta, only gains rules:
// nft appends them, and the other rules (and their numgen counters) stay. nft cannot
// find the handles of rules to delete, so it rewrites a chain that loses any.
func (ch ChainRules) appendOnly() bool { return ch.Delta && len(ch.RemovedAt) == 0 }

// roundRobinRuleRE is the one rule shape NetlinkWriter encodes itself: a round-robin
// bucket rule (portCompiler.roundRobinRule). A roundRobin Service coming or changing
// its endpoint count adds its rule to its bucket; through nft that was ~60 ms at 10,000
// Services (nft dumps the node's chains and sets first), over netlink two messages.
var roundRobinRuleRE = regexp.MustCompile(`^(ip6?) daddr (\S+) (tcp|udp|sctp) dport (\d+) numgen inc mod (\d+) vmap @(\S+)$`)

// netlinkEncodable reports whether NetlinkWriter can write chains: the rules each adds
// (a Delta's Appended, or all of a round-robin bucket written whole) are round-robin
// bucket rules; rules a Delta removes need no encoding.
func netlinkEncodable(chains []ChainRules) bool {
	for _, ch := range chains {
		rules := ch.Appended
		if !ch.Delta {
			if !strings.HasPrefix(ch.Name, roundRobinBucketPrefix) || len(ch.Rules) == 0 {
				return false
			}
			rules = ch.Rules
		}
		for _, r := range rules {
			if !roundRobinRuleRE.MatchString(r) {
				return false
			}
		}
	}
	return true
}

// ruleExprs compiles a rule of the shape of roundRobinRuleRE for a table of family fam
// into the expressions nft 1.0.6 makes of it (nft --debug=netlink), so that either
// writer leaves the same rule (TestNetlinkWritesRoundRobinBuckets compares them in the
// kernel).
func ruleExprs(fam nftables.TableFamily, rule string) ([]expr.Any, error) {
	m := roundRobinRuleRE.FindStringSubmatch(rule)
	if m == nil {
		return nil, fmt.Errorf("rule %q: not a rule NetlinkWriter can encode", rule)
	}
	addr, err := netip.ParseAddr(m[2])
	if err != nil {
		return nil, fmt.Errorf("rule %q: %w", rule, err)
	}
	wantFam, offset := nftables.TableFamilyIPv4, uint32(16) // IPv4 header: daddr at 16
	if m[1] == "ip6" {
		wantFam, offset = nftables.TableFamilyIPv6, 24 // IPv6 header: daddr at 24
	}
	if fam != wantFam || (m[1] == "ip") != addr.Is4() {
		return nil, fmt.Errorf("rule %q: not of this table's family", rule)
	}
	port, err := strconv.ParseUint(m[4], 10, 16)
	if err != nil {
		return nil, fmt.Errorf("rule %q: port: %w", rule, err)
	}
	mod, err := strconv.ParseUint(m[5], 10, 32)
	if err != nil || mod == 0 {
		return nil, fmt.Errorf("rule %q: bad modulus", rule)
	}
	proto := map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[m[3]]
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(addr.BitLen() / 8)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr.AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(port))},
		&expr.Numgen{Register: 1, Modulus: uint32(mod), Type: unix.NFT_NG_INCREMENTAL},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m[6]},
	}, nil
}

// ruleHandles returns the kernel's handles of the rules ch lost: the kernel lists a
// chain's rules in order, and the chain is as the Syncer wrote it, so they are the
// rules at ch.RemovedAt. A chain of another length, a rule there that does not match
// the expected rule's cluster IP, protocol and port, or (for a round-robin rule) its
// modulus and map, is an error (the Syncer then needs a full sync): deleting another
// port's rule would break that port.
func (w *NetlinkWriter) ruleHandles(conn *nftables.Conn, ch ChainRules) ([]uint64, error) {
	inKernel, err := conn.GetRules(w.table, &nftables.Chain{Name: ch.Name, Table: w.table})
	if err != nil {
		return nil, fmt.Errorf("listing chain %s of table %s: %w", ch.Name, w.table.Name, err)
	}
	if len(inKernel) != ch.Had {
		return nil, fmt.Errorf("chain %s of table %s has %d rules; want %d", ch.Name, w.table.Name, len(inKernel), ch.Had)
	}
	handles := make([]uint64, 0, len(ch.RemovedAt))
	for k, i := range ch.RemovedAt {
		if want, ok := textEntryMatch(ch.Removed[k]); !ok || want != exprsEntryMatch(inKernel[i].Exprs) {
			return nil, fmt.Errorf("chain %s of table %s: rule %d does not match as %q", ch.Name, w.table.Name, i, ch.Removed[k])
		}
		if exprs, err := ruleExprs(w.table.Family, ch.Removed[k]); err == nil {
			want, _ := ruleKey(exprs)
			if got, _ := ruleKey(inKernel[i].Exprs); got != want {
				return nil, fmt.Errorf("chain %s of table %s: rule %d is not %q", ch.Name, w.table.Name, i, ch.Removed[k])
			}
		}
		handles = append(handles, inKernel[i].Handle)
	}
	return handles, nil
}

// entryMatchRE is the start of every bucket rule (compiler.entryMatch).
var entryMatchRE = regexp.MustCompile(`^ip6? daddr (\S+) (tcp|udp|sctp) dport (\d+) `)

// textEntryMatch returns the values a bucket rule's entry match compares, as
// exprsEntryMatch reads them from the kernel's rule; ok is false for another rule.
func textEntryMatch(rule string) (string, bool) {
	m := entryMatchRE.FindStringSubmatch(rule)
	if m == nil {
		return "", false
	}
	addr, err := netip.ParseAddr(m[1])
	port, err2 := strconv.ParseUint(m[3], 10, 16)
	if err != nil || err2 != nil {
		return "", false
	}
	proto := map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[m[2]]
	return fmt.Sprintf("%x/%x/%x", addr.AsSlice(), []byte{proto}, binary.BigEndian.AppendUint16(nil, uint16(port))), true
}

// exprsEntryMatch returns the values the first three comparisons of a rule compare
// (a bucket rule's destination address, protocol and port), or "".
func exprsEntryMatch(exprs []expr.Any) string {
	var parts []string
	for _, i := range []int{1, 3, 5} {
		if i >= len(exprs) {
			return ""
		}
		c, ok := exprs[i].(*expr.Cmp)
		if !ok || c.Op != expr.CmpOpEq {
			return ""
		}
		parts = append(parts, fmt.Sprintf("%x", c.Data))
	}
	return strings.Join(parts, "/")
}

// ruleKey identifies a rule of the shape ruleExprs makes by the values it compares and
// its modulus and map; ok is false for any other rule.
func ruleKey(exprs []expr.Any) (key string, ok bool) {
	if len(exprs) != 8 {
		return "", false
	}
	var parts []string
	for _, i := range []int{1, 3, 5} {
		c, ok := exprs[i].(*expr.Cmp)
		if !ok || c.Op != expr.CmpOpEq {
			return "", false
		}
		parts = append(parts, fmt.Sprintf("%x", c.Data))
	}
	ng, ok1 := exprs[6].(*expr.Numgen)
	lk, ok2 := exprs[7].(*expr.Lookup)
	if !ok1 || !ok2 || ng.Type != unix.NFT_NG_INCREMENTAL {
		return "", false
	}
	return fmt.Sprintf("%s/%d/%s", strings.Join(parts, "/"), ng.Modulus, lk.SetName), true
}
