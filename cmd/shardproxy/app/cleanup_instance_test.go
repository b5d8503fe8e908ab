package app

import (
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestCleanupUnconfiguredInstanceInNamespace runs `shardproxy cleanup --instance` for real
// in a node namespace: an instance no longer in the configuration (or with no
// configuration at all, given the table prefix) loses its ip and ip6 tables, nothing else
// does, a name with no tables fails, and so does one whose table is named like ours but
// lacks shardproxy's ownership marker (its comment), which stays.
func TestCleanupUnconfiguredInstanceInNamespace(t *testing.T) {
	testutil.RequireTools(t, "nft")
	tp := netns.New(t)
	if err := tp.NFT(tp.Node, strings.Join([]string{
		`add table ip shardproxy-old { comment "shardproxy instance old" ; }`, "add chain ip shardproxy-old services",
		`add table ip6 shardproxy-old { comment "shardproxy instance old" ; }`,
		"add table ip shardproxy-team-a", // configured
		"add table ip other",
		`add table ip sp2-x { comment "shardproxy instance x" ; }`,
		`add table ip6 shardproxy-x { comment "shardproxy instance x" ; }`, // another instance's, under the default prefix
		"add table ip kube-proxy",                                          // upstream's, no marker
		`add table ip6 kube-proxy { comment "rules for Kubernetes Services" ; }`,
		`add table ip shardproxy_node { comment "shardproxy node-wide rules" ; }`, // the supervisor's node table
		`add table ip6 shardproxy_node { comment "shardproxy node-wide rules" ; }`,
	}, "\n")+"\n"); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (string, string, int) { return runCLIIn(t, tp, tp.Node, args...) }
	tablesLeft := func() string {
		out, err := tp.Exec(tp.Node, "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	out, errOut, code := cli("cleanup", "--config", "testdata/config.yaml", "--instance", "old")
	if code != 0 || !strings.Contains(out, "deleted table ip shardproxy-old") || !strings.Contains(out, "deleted table ip6 shardproxy-old") {
		t.Fatalf("cleanup of a removed instance: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	left := tablesLeft()
	if strings.Contains(left, "shardproxy-old") {
		t.Errorf("the removed instance's tables are still there:\n%s", left)
	}
	for _, kept := range []string{"table ip shardproxy-team-a", "table ip other", "table ip sp2-x", "table ip6 shardproxy-x"} {
		if !strings.Contains(left, kept) {
			t.Errorf("%s was deleted:\n%s", kept, left)
		}
	}

	out, errOut, code = cli("cleanup", "--table-prefix", "sp2", "--instance", "x")
	if code != 0 || !strings.Contains(out, "deleted table ip sp2-x") {
		t.Fatalf("cleanup without a configuration: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	left = tablesLeft()
	if strings.Contains(left, "sp2-x") || !strings.Contains(left, "table ip6 shardproxy-x") {
		t.Errorf("after cleaning up sp2-x:\n%s", left)
	}

	_, errOut, code = cli("cleanup", "--table-prefix", "kube", "--instance", "proxy")
	for _, fam := range []string{"ip", "ip6"} {
		if code == 0 || !strings.Contains(errOut, "table "+fam+" kube-proxy is not shardproxy's") {
			t.Errorf("cleanup of kube-proxy's tables: exit %d, stderr %q; want a refusal for %s", code, errOut, fam)
		}
	}
	if left := tablesLeft(); !strings.Contains(left, "table ip kube-proxy") || !strings.Contains(left, "table ip6 kube-proxy") {
		t.Errorf("kube-proxy's tables were deleted:\n%s", left)
	}

	_, errOut, code = cli("cleanup", "--config", "testdata/config.yaml", "--instance", "old")
	if code == 0 || !strings.Contains(errOut, `no instance "old" in testdata/config.yaml: no table ip or ip6 shardproxy-old on this node, nothing to delete`) {
		t.Errorf("second cleanup of the removed instance: exit %d, stderr %q; want a failure naming it", code, errOut)
	}

	out, errOut, code = cli("cleanup", "--config", "testdata/config.yaml", "--instance", "team-a")
	if code != 0 || !strings.Contains(out, "deleted table ip shardproxy-team-a (if it existed)") {
		t.Fatalf("cleanup of a configured instance: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if left := tablesLeft(); strings.Contains(left, "shardproxy-team-a") || !strings.Contains(left, "table ip other") ||
		!strings.Contains(left, "table ip shardproxy_node") {
		t.Errorf("after cleaning up team-a (the node table stays while other instances may run):\n%s", left)
	}

	out, errOut, code = cli("cleanup", "--config", "testdata/config.yaml")
	if code != 0 || !strings.Contains(out, "deleted table ip shardproxy_node") || !strings.Contains(out, "deleted table ip6 shardproxy_node") {
		t.Fatalf("cleanup of the whole configuration: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if left := tablesLeft(); strings.Contains(left, "shardproxy_node") || !strings.Contains(left, "table ip other") {
		t.Errorf("after cleaning up the whole configuration:\n%s", left)
	}
}

// TestCleanupAllInNamespace runs `shardproxy cleanup --all` (what deploy/cleanup runs on
// every node at an uninstall) for real in a node namespace: every table carrying
// shardproxy's ownership marker under the prefix goes, in both families, whichever
// supervisor it names (or none, an earlier version's); a table named
// like ours without the marker, other components' tables (upstream's kube-proxy, an
// iptables-nft table, an inet table under our prefix) and another prefix's stay, rule for
// rule; a second run finds nothing and succeeds.
func TestCleanupAllInNamespace(t *testing.T) {
	testutil.RequireTools(t, "nft")
	tp := netns.New(t)
	if err := tp.NFT(tp.Node, strings.Join([]string{
		`add table ip shardproxy-team-a { comment "shardproxy instance team-a" ; }`,
		"add chain ip shardproxy-team-a nat-prerouting { type nat hook prerouting priority -67 ; }",
		`add table ip6 shardproxy-team-a { comment "shardproxy instance team-a" ; }`,
		`add table ip shardproxy-removed { comment "shardproxy instance removed" ; }`,
		// Markers naming a supervisor, this one's or another's with the same prefix.
		`add table ip shardproxy-mine { comment "shardproxy instance mine supervisor node-1:10256" ; }`,
		`add table ip6 shardproxy-theirs { comment "shardproxy instance theirs supervisor node-1:10266" ; }`,
		`add table ip6 shardproxy_node { comment "shardproxy node-wide rules" ; }`, // the supervisor's node table
		"add table ip shardproxy-ghost", // our name, no marker: someone else's
		`add table ip sp2-x { comment "shardproxy instance x" ; }`,
		`add table inet shardproxy-team-a { comment "shardproxy instance team-a" ; }`, // not a family we write
		"add table ip kube-proxy",
		"add chain ip kube-proxy services { type nat hook prerouting priority -100 ; }",
		"add rule ip kube-proxy services ip daddr 10.96.0.10 tcp dport 53 dnat to 10.244.0.5",
		"add table ip filter", // iptables-nft's
		"add chain ip filter INPUT { type filter hook input priority 0 ; }",
		"add rule ip filter INPUT counter accept",
	}, "\n")+"\n"); err != nil {
		t.Fatal(err)
	}
	ruleset := func() string {
		out, err := tp.Exec(tp.Node, "nft", "list", "ruleset")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	table := func(fam, name string) string {
		out, _ := tp.Exec(tp.Node, "nft", "list", "table", fam, name)
		return out
	}
	kept := map[string]string{}
	for _, ft := range [][2]string{{"ip", "shardproxy-ghost"}, {"ip", "sp2-x"}, {"inet", "shardproxy-team-a"}, {"ip", "kube-proxy"}, {"ip", "filter"}} {
		kept[ft[0]+" "+ft[1]] = table(ft[0], ft[1])
	}

	out, errOut, code := runCLIIn(t, tp, tp.Node, "cleanup", "--all")
	if code != 0 {
		t.Fatalf("cleanup --all: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	for _, want := range []string{"deleted table ip shardproxy-team-a", "deleted table ip6 shardproxy-team-a", "deleted table ip shardproxy-removed",
		"deleted table ip6 shardproxy_node", `left table ip shardproxy-ghost: not shardproxy's`, "deleted table ip shardproxy-mine",
		"deleted table ip6 shardproxy-theirs", "6 shardproxy tables deleted (prefix shardproxy)"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	left := ruleset()
	for _, gone := range []string{"table ip shardproxy-team-a", "table ip6 shardproxy-team-a", "table ip shardproxy-removed", "table ip6 shardproxy_node",
		"table ip shardproxy-mine", "table ip6 shardproxy-theirs"} {
		if strings.Contains(left, gone+" ") {
			t.Errorf("%s is still there", gone)
		}
	}
	for name, before := range kept {
		fam, tbl, _ := strings.Cut(name, " ")
		if after := table(fam, tbl); after == "" || after != before {
			t.Errorf("table %s changed:\nbefore:\n%s\nafter:\n%s", name, before, after)
		}
	}

	out, errOut, code = runCLIIn(t, tp, tp.Node, "cleanup", "--all")
	if code != 0 || !strings.Contains(out, "0 shardproxy tables deleted") {
		t.Errorf("second cleanup --all: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if after := ruleset(); after != left {
		t.Errorf("the second run changed the ruleset:\nbefore:\n%s\nafter:\n%s", left, after)
	}
}
