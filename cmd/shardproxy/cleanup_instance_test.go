package main

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
	if left := tablesLeft(); strings.Contains(left, "shardproxy-team-a") || !strings.Contains(left, "table ip other") {
		t.Errorf("after cleaning up team-a:\n%s", left)
	}
}
