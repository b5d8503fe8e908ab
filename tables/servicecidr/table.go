// Package servicecidr writes the supervisor's node-wide table, one per node and family:
// it drops new connections to addresses inside the cluster's ServiceCIDRs that no proxy
// on the node translated, as upstream kube-proxy (nftables mode) drops traffic to
// unallocated cluster IPs. Without it such a packet (to a deleted Service, to an address
// never allocated, to a Service of a proxy name nothing on this node runs) leaves the node
// by its default route, where anything may answer.
//
// The drop runs after every nat chain of the node had its chance: on the forward and
// output hooks, as filter-type chains at Priority, after the DNAT of every instance,
// of a kube-proxy beside them (iptables-nft, nftables, iptables-legacy) and after the
// rejects of all of them (instances' filter chains at -35..-4, kube-proxy's at 0). A
// packet still addressed into a ServiceCIDR there was translated by nobody, whoever
// serves the address. It is dropped, not rejected, as upstream: no ICMP to send back
// for every probe of the range.
package servicecidr

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// Priority is the node table's base-chain priority on the forward and output hooks:
// filter + 10, after every nat chain (they run at the NAT hook, -100 on output; forward
// comes after prerouting's) and after every filter chain that rejects traffic to a
// Service without endpoints: the instances' (-35..-4) and kube-proxy's (0).
const Priority = 10

// OwnerComment is the node table's comment, shardproxy's ownership marker for it: the
// supervisor and `shardproxy cleanup` delete a table named TableName(prefix) only if it
// carries it.
const OwnerComment = "shardproxy node-wide rules"

// Names of the node table's objects.
const (
	// setServiceCIDRs holds the cluster's ServiceCIDRs of the table's family.
	setServiceCIDRs = "service-cidrs"
	// chainForward and chainOutput drop new connections still addressed into
	// setServiceCIDRs: from pods and outside (forward), from the node (output).
	chainForward = "drop-untranslated-forward"
	chainOutput  = "drop-untranslated-output"
)

// TableName is the node table's name under prefix, the same in both families:
// "<prefix>_node". Table prefixes and instance names are DNS-1123 labels, which have
// no '_', so it can never be an instance's table ("<prefix>-<instance>") nor another
// prefix's node table.
func TableName(prefix string) string { return prefix + "_node" }

// Owned reports whether t is the node table of prefix: its name and its marker.
func Owned(t tables.ListedTable, prefix string) bool {
	return t.Name == TableName(prefix) && t.Comment == OwnerComment
}

// Write replaces the content of one family's node table (nft is bound to it) with the
// drop of cidrs' addresses of that family, in one transaction: packets see the old set
// or the new one, never none. Prefixes of the other family are ignored.
func Write(ctx context.Context, nft knftables.Interface, fam tables.Family, cidrs []netip.Prefix) error {
	ipX, addrType := "ip", "ipv4_addr"
	if fam == tables.IPv6 {
		ipX, addrType = "ip6", "ipv6_addr"
	}
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{Comment: ptr(OwnerComment)})
	tx.Add(&knftables.Set{
		Name: setServiceCIDRs, Type: addrType, Flags: []knftables.SetFlag{knftables.IntervalFlag},
		Comment: ptr("the cluster's ServiceCIDRs"),
	})
	tx.Flush(&knftables.Set{Name: setServiceCIDRs})
	prio := knftables.BaseChainPriority(strconv.Itoa(Priority))
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{chainForward, knftables.ForwardHook}, {chainOutput, knftables.OutputHook}} {
		tx.Add(&knftables.Chain{Name: c.name, Type: ptr(knftables.FilterType), Hook: ptr(c.hook), Priority: &prio})
		tx.Flush(&knftables.Chain{Name: c.name})
		tx.Add(&knftables.Rule{
			Chain:   c.name,
			Rule:    knftables.Concat("ct state new", ipX, "daddr", "@", setServiceCIDRs, "counter drop"),
			Comment: ptr("no proxy on this node translated this Service CIDR address"),
		})
	}
	for _, p := range Collapse(cidrs) {
		if fam.Contains(p.Addr()) {
			tx.Add(&knftables.Element{Set: setServiceCIDRs, Key: []string{p.String()}})
		}
	}
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("writing the %s node table: %w", tables.KnftFamily(fam), err)
	}
	return nil
}

// Collapse returns cidrs masked, sorted, without duplicates and without the prefixes
// another one contains: an interval set refuses overlapping elements, and ServiceCIDRs
// may overlap (a wider range added to grow a cluster).
func Collapse(cidrs []netip.Prefix) []netip.Prefix {
	in := make([]netip.Prefix, 0, len(cidrs))
	for _, p := range cidrs {
		if p.IsValid() {
			in = append(in, p.Masked())
		}
	}
	// Widest first, so a prefix is checked against every wider one already kept.
	slices.SortFunc(in, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	var out []netip.Prefix
	for _, p := range in {
		if !slices.ContainsFunc(out, func(k netip.Prefix) bool { return k.Overlaps(p) }) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

func ptr[T any](v T) *T { return &v }
