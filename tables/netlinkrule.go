package tables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

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
