package soak

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// renderedScript is the start of each family's part of `shardproxy render --instance
// team-a` for an instance with no Services: render adds the table even then.
const renderedScript = `add table ip shardproxy-team-a { comment "shardproxy instance team-a supervisor node-1:10256" ; }
add chain ip shardproxy-team-a filter-forward { type filter hook forward priority -34 ; }
add chain ip shardproxy-team-a services
add table ip6 shardproxy-team-a { comment "shardproxy instance team-a supervisor node-1:10256" ; }
add chain ip6 shardproxy-team-a filter-forward { type filter hook forward priority -34 ; }
add chain ip6 shardproxy-team-a services
`

// TestTableMissingOnBothSides: a checkpoint that finds a table neither in the kernel nor
// among render's compared nothing, and is a mismatch unless render serves nothing in
// that family (its script adds no table of it).
func TestTableMissingOnBothSides(t *testing.T) {
	if diff := cmp.Diff([]string{"shardproxy-team-a"}, declaredTables([]byte(renderedScript), "ip6")); diff != "" {
		t.Errorf("tables declared (-want +got):\n%s", diff)
	}
	ipOnly := strings.Join(strings.Split(renderedScript, "\n")[:3], "\n")
	table, err := ParseRuleset(listing([3]int{1, 2, 3}, elemA, 0, ruleDrop))
	if err != nil {
		t.Fatal(err)
	}
	present := listedTable{Rules: table, Present: true}
	// The soak lists "shardproxy-team-b" (a wrong name, say) while render adds
	// shardproxy-team-a: both sides list as missing.
	k := tableKey{"team-b", "ip6"}
	for _, tc := range []struct {
		name     string
		script   string
		want     listedTable
		got      listedTable
		mismatch string
	}{
		{name: "missing on both sides while render adds a table of the family is a mismatch", script: renderedScript,
			mismatch: "missing both in the kernel and in render's tables, yet render's script adds ip6 shardproxy-team-a"},
		{name: "missing on both sides when render adds no table of the family: the instance serves nothing there", script: ipOnly},
		{name: "the same table on both sides", script: renderedScript, want: present, got: present},
		{name: "missing in the kernel only", script: renderedScript, want: present, mismatch: "differences (- rendered only, + kernel only)"},
		{name: "missing in render only", script: renderedScript, got: present, mismatch: "differences (- rendered only, + kernel only)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := tableDiff(k, renderedTable{listedTable: tc.want, Declared: declaredTables([]byte(tc.script), k.family)}, tc.got, 12)
			switch {
			case tc.mismatch == "" && len(lines) > 0:
				t.Errorf("a mismatch:\n%s", strings.Join(lines, "\n"))
			case tc.mismatch != "" && (len(lines) == 0 || !strings.Contains(lines[0], tc.mismatch)):
				t.Errorf("differences %q, want one saying %q", lines, tc.mismatch)
			}
		})
	}
}
