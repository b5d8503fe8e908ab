package tables

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
)

// TestListTablesReadsOwnershipMarker lists a real kernel's tables over netlink with their
// comments, and cleans up the way the supervisor does for its removed instances (every
// table that OwnedInstance names and that is not configured): only a table carrying
// shardproxy's marker for its own name goes. A table merely named <prefix>-<name>, or
// marked for another name, or upstream kube-proxy's, stays.
func TestListTablesReadsOwnershipMarker(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t)
	ctx := context.Background()
	for _, fam := range []Family{IPv4, IPv6} {
		cfg := testConfig(fam)
		cfg.Instance = "team-a" // configured, and synced for real: the skeleton's marker
		if _, err := kernelSyncer(t, ns, cfg).Full(ctx, featureServices(fam)); err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
	}
	for _, cmd := range []string{
		`add table ip shardproxy-old { comment "shardproxy instance old" ; }`, // a removed instance: goes
		`add table ip6 shardproxy-old { comment "shardproxy instance old" ; }`,
		`add table ip shardproxy-x`, // named like one, no marker
		`add table ip6 shardproxy-y { comment "rules of another component" ; }`,
		`add table ip shardproxy-z { comment "shardproxy instance team-a" ; }`, // another name's marker
		`add table ip shardproxy-w { comment "shardproxy instance w, says someone" ; }`,
		`add table ip kube-proxy`,
		`add table ip6 kube-proxy { comment "rules for Kubernetes Services" ; }`,
	} {
		nftIn(t, ns, strings.Fields(cmd)...)
	}

	want := map[Family]map[string]string{
		IPv4: {
			"shardproxy-team-a": "shardproxy instance team-a", "shardproxy-old": "shardproxy instance old",
			"shardproxy-x": "", "shardproxy-z": "shardproxy instance team-a",
			"shardproxy-w": "shardproxy instance w, says someone", "kube-proxy": "",
		},
		IPv6: {
			"shardproxy-team-a": "shardproxy instance team-a", "shardproxy-old": "shardproxy instance old",
			"shardproxy-y": "rules of another component", "kube-proxy": "rules for Kubernetes Services",
		},
	}
	for _, fam := range []Family{IPv4, IPv6} {
		var listed []ListedTable
		var err error
		inNetns(t, ns, func() { listed, err = ListTables(ctx, fam) })
		if err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
		got := map[string]string{}
		for _, lt := range listed {
			got[lt.Name] = lt.Comment
		}
		if !maps.Equal(got, want[fam]) {
			t.Errorf("%s: listed %v, want %v", fam, got, want[fam])
		}
		for _, lt := range listed {
			inst, ok := lt.OwnedInstance("shardproxy")
			if !ok || inst == "team-a" {
				continue
			}
			if err := DeleteTable(ctx, kernelNFT(t, ns, fam, lt.Name)); err != nil {
				t.Fatalf("%s: deleting %s: %v", fam, lt.Name, err)
			}
		}
	}
	left := nftIn(t, ns, "list", "tables")
	for _, kept := range []string{"table ip shardproxy-team-a", "table ip6 shardproxy-team-a", "table ip shardproxy-x",
		"table ip6 shardproxy-y", "table ip shardproxy-z", "table ip shardproxy-w", "table ip kube-proxy", "table ip6 kube-proxy"} {
		if !slices.Contains(strings.Split(strings.TrimSpace(left), "\n"), kept) {
			t.Errorf("%s was deleted:\n%s", kept, left)
		}
	}
	if strings.Contains(left, "shardproxy-old") {
		t.Errorf("the removed instance's marked tables survived:\n%s", left)
	}
}

// TestOwner: a table is an instance's only with the instance's name under the prefix
// and the marker for that same name, naming the supervisor that owns it, or none for an
// earlier version's marker.
func TestOwner(t *testing.T) {
	tests := []struct {
		name, table, comment string
		wantInst, wantSup    string
		wantOK               bool
	}{
		{"earlier version's marker", "shardproxy-team-a", "shardproxy instance team-a", "team-a", "", true},
		{"a supervisor's marker", "shardproxy-team-a", "shardproxy instance team-a supervisor node-1:10256", "team-a", "node-1:10256", true},
		{"marker as OwnerComment writes it", "shardproxy-team-a", OwnerComment("team-a", "n:1"), "team-a", "n:1", true},
		{"no comment", "shardproxy-team-a", "", "", "", false},
		{"another component's comment", "shardproxy-team-a", "kube-proxy rules", "", "", false},
		{"another instance's marker", "shardproxy-team-a", "shardproxy instance team-b", "", "", false},
		{"another instance's marker with a supervisor", "shardproxy-team-a", "shardproxy instance team-ab supervisor x", "", "", false},
		{"marker with more after it", "shardproxy-team-a", "shardproxy instance team-a (copy)", "", "", false},
		{"supervisor word without a name", "shardproxy-team-a", "shardproxy instance team-a supervisor ", "", "", false},
		{"another prefix", "kube-proxy", "shardproxy instance proxy", "", "", false},
		{"prefix without the dash", "shardproxyteam-a", "shardproxy instance team-a", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lt := ListedTable{Name: tc.table, Comment: tc.comment}
			inst, sup, ok := lt.Owner("shardproxy")
			if inst != tc.wantInst || sup != tc.wantSup || ok != tc.wantOK {
				t.Errorf("Owner = %q, %q, %v; want %q, %q, %v", inst, sup, ok, tc.wantInst, tc.wantSup, tc.wantOK)
			}
			if inst, ok := lt.OwnedInstance("shardproxy"); inst != tc.wantInst || ok != tc.wantOK {
				t.Errorf("OwnedInstance = %q, %v; want %q, %v (any supervisor's)", inst, ok, tc.wantInst, tc.wantOK)
			}
		})
	}
}

// TestUdataComment: a table's user data is whatever its writer put there; a malformed
// record yields no comment rather than a panic or a misread.
func TestUdataComment(t *testing.T) {
	tests := []struct {
		name  string
		udata []byte
		want  string
	}{
		{"none", nil, ""},
		{"comment as nft writes it", append([]byte{0, 5}, "abcd\x00"...), "abcd"},
		{"comment without a NUL", append([]byte{0, 4}, "abcd"...), "abcd"},
		{"after another record", append([]byte{1, 2, 9, 9, 0, 3}, "ab\x00"...), "ab"},
		{"only another record", []byte{1, 2, 9, 9}, ""},
		{"length beyond the data", append([]byte{0, 200}, "abcd"...), ""},
		{"other record's length beyond the data", []byte{1, 9, 0, 3, 'a'}, ""},
		{"one byte", []byte{0}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := udataComment(tc.udata); got != tc.want {
				t.Errorf("udataComment(%v) = %q, want %q", tc.udata, got, tc.want)
			}
		})
	}
}
