// Package tablestest holds helpers for tests of code that writes a node's nftables
// through the tables package's seams (open a table, list the tables of a family).
package tablestest

import (
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// Key names a fake table in a map of fakes: "<knftables family> <table name>", e.g.
// "ip6 shardproxy-a".
func Key(fam tables.Family, table string) string {
	return fmt.Sprintf("%s %s", tables.KnftFamily(fam), table)
}

// Listed is the ListTables seam over a map of fakes keyed by Key: the tables of family
// fam that exist (a Fake whose table was created), with their comments, sorted by name.
// The caller holds whatever lock guards the map.
func Listed(fakes map[string]*knftables.Fake, fam tables.Family) []tables.ListedTable {
	var out []tables.ListedTable
	for key, fk := range fakes {
		family, name, _ := strings.Cut(key, " ")
		if family != string(tables.KnftFamily(fam)) {
			continue
		}
		fk.RLock()
		if fk.Table != nil {
			lt := tables.ListedTable{Name: name}
			if fk.Table.Comment != nil {
				lt.Comment = *fk.Table.Comment
			}
			out = append(out, lt)
		}
		fk.RUnlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
