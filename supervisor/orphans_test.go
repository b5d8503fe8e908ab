package supervisor

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// exists reports whether a fake table ("ip name") exists.
func (f *fakeTables) exists(key string) bool {
	f.mu.Lock()
	fk := f.fakes[key]
	f.mu.Unlock()
	if fk == nil {
		return false
	}
	fk.RLock()
	defer fk.RUnlock()
	return fk.Table != nil
}

// TestUnconfiguredInstanceTablesAreDeleted: once every instance has synced, the tables of
// an instance removed from this supervisor's configuration go; nothing else does, in
// particular no table that is named like an instance's but lacks shardproxy's ownership
// marker, another supervisor's with the same prefix (its marker names it), or one whose
// marker is an earlier version's (it names no supervisor: it may be another's).
func TestUnconfiguredInstanceTablesAreDeleted(t *testing.T) {
	const mine, other = " supervisor node-1:0", " supervisor node-1:10257" // the fixture's health port is 0
	f := startSupervisorWith(t, fixtureOptions{seed: []string{
		"ip shardproxy-team-c # shardproxy instance team-c" + mine, // a removed instance
		"ip6 shardproxy-team-c # shardproxy instance team-c" + mine,
		"ip6 shardproxy-old # shardproxy instance old" + mine, // another one, left in one family only
		"ip other-table", // not ours
		"ip shardproxyx-a # shardproxy instance a" + mine, // another prefix
		"ip shardproxy-Not_An_Instance # shardproxy instance Not_An_Instance" + mine,
		"ip shardproxy-team-a", // configured: kept and synced
		// Named like removed instances, but not this supervisor's: another component's
		// table, another supervisor's, an earlier version's, or one made by hand.
		"ip shardproxy-proxy",
		"ip6 shardproxy-foreign # kube-proxy rules",
		"ip shardproxy-swapped # shardproxy instance team-c" + mine, // another instance's marker
		"ip shardproxy-prefixed # shardproxy instance prefixed, or not",
		"ip shardproxy-neighbour # shardproxy instance neighbour" + other,
		"ip6 shardproxy-neighbour # shardproxy instance neighbour" + other,
		"ip shardproxy-legacy # shardproxy instance legacy",
	}})
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	for _, gone := range []string{"ip shardproxy-team-c", "ip6 shardproxy-team-c", "ip6 shardproxy-old"} {
		testutil.Eventually(t, waitTimeout, gone+" to be deleted", func() bool { return !f.tables.exists(gone) })
	}
	for _, kept := range []string{"ip other-table", "ip shardproxyx-a", "ip shardproxy-Not_An_Instance",
		"ip shardproxy-default", "ip6 shardproxy-default", "ip shardproxy-team-b", "ip6 shardproxy-team-b",
		"ip shardproxy-proxy", "ip6 shardproxy-foreign", "ip shardproxy-swapped", "ip shardproxy-prefixed",
		"ip shardproxy-neighbour", "ip6 shardproxy-neighbour", "ip shardproxy-legacy"} {
		if !f.tables.exists(kept) {
			t.Errorf("%s was deleted", kept)
		}
	}
	testutil.Eventually(t, waitTimeout, "team-a to serve its Service", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2") })
	for _, inst := range []string{"team-c", "proxy", "foreign", "swapped", "prefixed", "neighbour", "legacy"} {
		for _, fam := range []string{"IPv4", "IPv6"} {
			if got := metricValue(t, f.sup, `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{proxy_instance="`+inst+`",ip_family="`+fam+`"}`); got != "" {
				t.Errorf("cleanup failure counted for %s %s: %q", inst, fam, got)
			}
		}
	}
}

// TestConfiguredTableTakesThisSupervisorsMarker: a configured instance's table left with
// an earlier version's marker (a table's comment cannot change in place) is recreated at
// the instance's first full sync with this supervisor's marker, so that no other
// supervisor with the same prefix takes it for its own, nor this one for another's.
func TestConfiguredTableTakesThisSupervisorsMarker(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{seed: []string{"ip shardproxy-team-a # shardproxy instance team-a"}})
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	testutil.Eventually(t, waitTimeout, "team-a to serve its Service", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2") })
	dump := f.tables.dump("ip shardproxy-team-a")
	if want := `comment "shardproxy instance team-a supervisor node-1:0"`; !strings.Contains(dump, want) {
		t.Errorf("team-a's table lacks %s:\n%s", want, dump)
	}
	if strings.Contains(dump, "left-over") {
		t.Errorf("team-a's table was not recreated (the seed's chain is there):\n%s", dump)
	}
}

// TestUnconfiguredTablesWaitForEveryInstance: while an instance has not completed a full
// sync, a removed instance's tables stay: they may still serve the Services it is to
// take over.
func TestUnconfiguredTablesWaitForEveryInstance(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{failTable: "shardproxy-team-b", seed: []string{"ip shardproxy-team-c # shardproxy instance team-c"}})
	f.createService("x", "plain", "", "172.30.0.1")
	testutil.Eventually(t, waitTimeout, "default serves its Service", func() bool { return has(f.tables.dump("ip shardproxy-default"), "172.30.0.1") })
	testutil.Eventually(t, waitTimeout, "team-b fails twice", func() bool {
		v := metricValue(t, f.sup, `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{proxy_instance="team-b",ip_family="IPv4"}`)
		return v != "" && v != "0" && v != "1"
	})
	if !f.tables.exists("ip shardproxy-team-c") {
		t.Error("team-c's table was deleted before team-b ever synced")
	}
}

// TestUnconfiguredTableDeleteFailureIsCounted: a table that cannot be deleted counts in
// kube-proxy's nftables cleanup failures, labelled with the removed instance.
func TestUnconfiguredTableDeleteFailureIsCounted(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{failTable: "shardproxy-stuck", seed: []string{"ip shardproxy-stuck # shardproxy instance stuck supervisor node-1:0", "ip6 shardproxy-stuck # shardproxy instance stuck supervisor node-1:0"}})
	series := `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{proxy_instance="stuck",ip_family="%s"}`
	testutil.Eventually(t, waitTimeout, "both failures counted, one per family", func() bool {
		return metricValue(t, f.sup, fmt.Sprintf(series, "IPv4")) == "1" && metricValue(t, f.sup, fmt.Sprintf(series, "IPv6")) == "1"
	})
	if !f.tables.exists("ip shardproxy-stuck") {
		t.Error("the table that failed to delete is gone")
	}
}
