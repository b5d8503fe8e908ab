package tables

import (
	"context"
	"fmt"
	"strings"

	gnftables "github.com/google/nftables"
	"sigs.k8s.io/knftables"
)

// TableName is the name of an instance's tables, the same in both families:
// "<prefix>-<instance>". It is the one place that spells the name; InstanceOfTable reads
// it back.
func TableName(prefix, instance string) string {
	return prefix + "-" + instance
}

// InstanceOfTable is the inverse of TableName: the instance a table named table belongs
// to under prefix, and whether the name has that prefix at all. The instance part is
// returned as it is; whether it is a valid instance name is for the caller to decide.
func InstanceOfTable(prefix, table string) (instance string, ok bool) {
	return strings.CutPrefix(table, prefix+"-")
}

// KnftFamily is the knftables family of a table family.
func KnftFamily(f Family) knftables.Family {
	if f == IPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// NewNFT opens one nftables table of the host (of the network namespace the process is
// in) through knftables: the one constructor every real instance, probe, cleanup and
// benchmark uses. The constructor checks that nft is installed and new enough. Listing
// goes over netlink (knftables.UseNetlink) rather than through `nft list`, which would
// print and parse the whole table.
func NewNFT(fam Family, table string) (knftables.Interface, error) {
	nft, err := knftables.New(KnftFamily(fam), table, knftables.UseNetlink)
	if err != nil {
		return nil, fmt.Errorf("nftables for table %s %s: %w", KnftFamily(fam), table, err)
	}
	return nft, nil
}

// ListTables lists the names of the nftables tables of one family in this network
// namespace. knftables works on one known table only, so this asks the kernel over
// netlink; `nft list tables` would read every rule and element of every table first
// (seconds on a node with 10,000 Services).
func ListTables(_ context.Context, fam Family) ([]string, error) {
	family := gnftables.TableFamilyIPv4
	if fam == IPv6 {
		family = gnftables.TableFamilyIPv6
	}
	conn, err := gnftables.New()
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", KnftFamily(fam), err)
	}
	defer conn.CloseLasting()
	list, err := conn.ListTablesOfFamily(family)
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", KnftFamily(fam), err)
	}
	names := make([]string, 0, len(list))
	for _, t := range list {
		names = append(names, t.Name)
	}
	return names, nil
}
