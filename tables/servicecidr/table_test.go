package servicecidr

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/tablestest"
	"github.com/shardproxy/shardproxy/test/testutil"
)

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(s))
	for _, c := range s {
		out = append(out, netip.MustParsePrefix(c))
	}
	return out
}

func TestCollapse(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{name: "nothing", in: nil, want: nil},
		{name: "one range", in: []string{"10.96.0.0/16"}, want: []string{"10.96.0.0/16"}},
		{name: "unmasked range is masked", in: []string{"10.96.3.4/16"}, want: []string{"10.96.0.0/16"}},
		{name: "duplicates go", in: []string{"10.96.0.0/16", "10.96.0.0/16"}, want: []string{"10.96.0.0/16"}},
		{name: "a range inside a wider one goes", in: []string{"10.96.0.0/24", "10.96.0.0/12"}, want: []string{"10.96.0.0/12"}},
		{name: "disjoint ranges stay, sorted", in: []string{"fd00:96::/112", "10.97.0.0/16", "10.96.0.0/16"},
			want: []string{"10.96.0.0/16", "10.97.0.0/16", "fd00:96::/112"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Collapse(prefixes(tc.in...))
			if !slices.Equal(got, prefixes(tc.want...)) {
				t.Errorf("Collapse(%v) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// TestWriteGolden pins the node table's shape: two filter chains at Priority on forward
// and output dropping new connections into the family's ServiceCIDRs, the ownership
// comment, and only the family's ranges.
func TestWriteGolden(t *testing.T) {
	tests := []struct {
		fam   tables.Family
		cidrs []string
		want  string
	}{
		{fam: tables.IPv4, cidrs: []string{"10.96.0.0/16", "fd00:96::/112", "10.96.0.0/24"}, want: `
add table ip shardproxy_node { comment "shardproxy node-wide rules" ; }
add chain ip shardproxy_node drop-untranslated-forward { type filter hook forward priority 10 ; }
add chain ip shardproxy_node drop-untranslated-output { type filter hook output priority 10 ; }
add set ip shardproxy_node service-cidrs { type ipv4_addr ; flags interval ; comment "the cluster's ServiceCIDRs" ; }
add rule ip shardproxy_node drop-untranslated-forward ct state new ip daddr @service-cidrs counter drop comment "no proxy on this node translated this Service CIDR address"
add rule ip shardproxy_node drop-untranslated-output ct state new ip daddr @service-cidrs counter drop comment "no proxy on this node translated this Service CIDR address"
add element ip shardproxy_node service-cidrs { 10.96.0.0/16 }
`},
		{fam: tables.IPv6, cidrs: []string{"10.96.0.0/16", "fd00:96::/112"}, want: `
add table ip6 shardproxy_node { comment "shardproxy node-wide rules" ; }
add chain ip6 shardproxy_node drop-untranslated-forward { type filter hook forward priority 10 ; }
add chain ip6 shardproxy_node drop-untranslated-output { type filter hook output priority 10 ; }
add set ip6 shardproxy_node service-cidrs { type ipv6_addr ; flags interval ; comment "the cluster's ServiceCIDRs" ; }
add rule ip6 shardproxy_node drop-untranslated-forward ct state new ip6 daddr @service-cidrs counter drop comment "no proxy on this node translated this Service CIDR address"
add rule ip6 shardproxy_node drop-untranslated-output ct state new ip6 daddr @service-cidrs counter drop comment "no proxy on this node translated this Service CIDR address"
add element ip6 shardproxy_node service-cidrs { fd00:96::/112 }
`},
	}
	for _, tc := range tests {
		t.Run(tc.fam.String(), func(t *testing.T) {
			nft := knftables.NewFake(tables.KnftFamily(tc.fam), TableName("shardproxy"))
			// Written twice: the second write replaces, it does not add.
			for range 2 {
				if err := Write(context.Background(), nft, tc.fam, prefixes(tc.cidrs...)); err != nil {
					t.Fatal(err)
				}
			}
			if got, want := sortedLines(nft.Dump()), sortedLines(tc.want); !slices.Equal(got, want) {
				t.Errorf("dump:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(lines)
	return lines
}

// fakeHost is a node's nftables for the Keeper: one Fake per table, listable, and
// transactions that fail while failing is set.
type fakeHost struct {
	mu      sync.Mutex
	fakes   map[string]*knftables.Fake
	failing bool
	writes  int
}

func key(fam tables.Family, table string) string { return tablestest.Key(fam, table) }

func (h *fakeHost) open(fam tables.Family, table string) (knftables.Interface, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fakes[key(fam, table)] == nil {
		h.fakes[key(fam, table)] = knftables.NewFake(tables.KnftFamily(fam), table)
	}
	return &countingFake{Fake: h.fakes[key(fam, table)], host: h}, nil
}

type countingFake struct {
	*knftables.Fake
	host *fakeHost
}

func (c *countingFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	c.host.mu.Lock()
	failing := c.host.failing
	c.host.writes++
	c.host.mu.Unlock()
	if failing {
		return errors.New("nft: simulated failure")
	}
	return c.Fake.Run(ctx, tx)
}

func (h *fakeHost) list(_ context.Context, fam tables.Family) ([]tables.ListedTable, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return tablestest.Listed(h.fakes, fam), nil
}

// elements returns the ServiceCIDRs a family's node table holds, "" without the table.
func (h *fakeHost) elements(fam tables.Family) string {
	h.mu.Lock()
	fk := h.fakes[key(fam, TableName("shardproxy"))]
	h.mu.Unlock()
	if fk == nil {
		return "<no table>"
	}
	fk.RLock()
	defer fk.RUnlock()
	if fk.Table == nil {
		return "<no table>"
	}
	var out []string
	for _, e := range fk.Table.Sets[setServiceCIDRs].Elements {
		out = append(out, e.Key...)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func (h *fakeHost) deleteTable(t *testing.T, fam tables.Family) {
	t.Helper()
	nft, _ := h.open(fam, TableName("shardproxy"))
	if err := tables.DeleteTable(context.Background(), nft); err != nil {
		t.Fatal(err)
	}
}

// TestKeeper drives a Keeper by hand through the events of a node: the CIDRs change,
// the table is deleted from outside, a write fails.
func TestKeeper(t *testing.T) {
	host := &fakeHost{fakes: map[string]*knftables.Fake{}}
	var mu sync.Mutex
	cidrs := prefixes("10.96.0.0/16", "fd00:96::/112")
	k := NewKeeper(Options{TablePrefix: "shardproxy", NFT: host.open, ListTables: host.list, Logger: klog.Background(),
		CIDRs: func() []netip.Prefix { mu.Lock(); defer mu.Unlock(); return slices.Clone(cidrs) }})
	setCIDRs := func(s ...string) { mu.Lock(); defer mu.Unlock(); cidrs = prefixes(s...) }
	ctx := context.Background()
	check := func(step, want4, want6 string) {
		t.Helper()
		if got := host.elements(tables.IPv4); got != want4 {
			t.Errorf("%s: IPv4 table holds %s, want %s", step, got, want4)
		}
		if got := host.elements(tables.IPv6); got != want6 {
			t.Errorf("%s: IPv6 table holds %s, want %s", step, got, want6)
		}
	}

	k.Sync(ctx)
	check("first sync", "10.96.0.0/16", "fd00:96::/112")
	writes := host.writes
	k.Sync(ctx)
	if host.writes != writes {
		t.Errorf("a sync without changes wrote %d transactions, want none", host.writes-writes)
	}

	setCIDRs("10.96.0.0/16", "10.100.0.0/16", "fd00:96::/112")
	k.Sync(ctx)
	check("a ServiceCIDR added", "10.100.0.0/16,10.96.0.0/16", "fd00:96::/112")

	host.deleteTable(t, tables.IPv6)
	k.Sync(ctx)
	check("IPv6 table deleted from outside", "10.100.0.0/16,10.96.0.0/16", "fd00:96::/112")

	host.failing = true
	setCIDRs("10.100.0.0/16", "fd00:96::/112")
	k.Sync(ctx)
	check("write failed", "10.100.0.0/16,10.96.0.0/16", "fd00:96::/112")
	host.failing = false
	k.Sync(ctx)
	check("retried after the failure", "10.100.0.0/16", "fd00:96::/112")
}

// TestKeeperRunFollowsChanged: Run writes at start and after Changed, without waiting
// for its periodic check.
func TestKeeperRunFollowsChanged(t *testing.T) {
	host := &fakeHost{fakes: map[string]*knftables.Fake{}}
	var mu sync.Mutex
	cidrs := prefixes("10.96.0.0/16")
	k := NewKeeper(Options{TablePrefix: "shardproxy", NFT: host.open, ListTables: host.list, Logger: klog.Background(),
		CIDRs: func() []netip.Prefix { mu.Lock(); defer mu.Unlock(); return slices.Clone(cidrs) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx, time.Hour) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, 5*time.Second, "the first write", func() bool { return host.elements(tables.IPv4) == "10.96.0.0/16" })
	mu.Lock()
	cidrs = prefixes("10.96.0.0/12")
	mu.Unlock()
	k.Changed()
	testutil.Eventually(t, 5*time.Second, "the write after Changed", func() bool { return host.elements(tables.IPv4) == "10.96.0.0/12" })
}

// TestRemove deletes only node tables carrying the marker.
func TestRemove(t *testing.T) {
	host := &fakeHost{fakes: map[string]*knftables.Fake{}}
	nft, _ := host.open(tables.IPv4, TableName("shardproxy"))
	if err := Write(context.Background(), nft, tables.IPv4, prefixes("10.96.0.0/16")); err != nil {
		t.Fatal(err)
	}
	// Someone else's table with the same name in ip6.
	other, _ := host.open(tables.IPv6, TableName("shardproxy"))
	tx := other.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := other.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	deleted, err := Remove(context.Background(), "shardproxy", host.open, host.list)
	if !slices.Equal(deleted, []tables.Family{tables.IPv4}) {
		t.Errorf("deleted %v, want IPv4 only", deleted)
	}
	if err == nil || !strings.Contains(err.Error(), "ip6 shardproxy_node is not shardproxy's") {
		t.Errorf("err = %v, want one naming the unmarked ip6 table", err)
	}
	if got := host.elements(tables.IPv4); got != "<no table>" {
		t.Errorf("IPv4 node table still holds %s", got)
	}
	if _, err := Remove(context.Background(), "shardproxy-other", host.open, host.list); err != nil {
		t.Errorf("removing a prefix without tables: %v", err)
	}
}
