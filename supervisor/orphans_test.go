package supervisor

import (
	"fmt"
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
// an instance removed from the configuration go; nothing else does, in particular no
// table that is named like an instance's but lacks shardproxy's ownership marker.
func TestUnconfiguredInstanceTablesAreDeleted(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{seed: []string{
		"ip shardproxy-team-c # shardproxy instance team-c", // a removed instance
		"ip6 shardproxy-team-c # shardproxy instance team-c",
		"ip6 shardproxy-old # shardproxy instance old", // another one, left in one family only
		"ip other-table", // not ours
		"ip shardproxyx-a # shardproxy instance a", // another prefix
		"ip shardproxy-Not_An_Instance # shardproxy instance Not_An_Instance",
		"ip shardproxy-team-a", // configured: kept and synced
		// Named like removed instances, but not shardproxy's: another component's
		// table, or another supervisor's under another marker, or one made by hand.
		"ip shardproxy-proxy",
		"ip6 shardproxy-foreign # kube-proxy rules",
		"ip shardproxy-swapped # shardproxy instance team-c", // another instance's marker
		"ip shardproxy-prefixed # shardproxy instance prefixed, or not",
	}})
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	for _, gone := range []string{"ip shardproxy-team-c", "ip6 shardproxy-team-c", "ip6 shardproxy-old"} {
		testutil.Eventually(t, waitTimeout, gone+" to be deleted", func() bool { return !f.tables.exists(gone) })
	}
	for _, kept := range []string{"ip other-table", "ip shardproxyx-a", "ip shardproxy-Not_An_Instance",
		"ip shardproxy-default", "ip6 shardproxy-default", "ip shardproxy-team-b", "ip6 shardproxy-team-b",
		"ip shardproxy-proxy", "ip6 shardproxy-foreign", "ip shardproxy-swapped", "ip shardproxy-prefixed"} {
		if !f.tables.exists(kept) {
			t.Errorf("%s was deleted", kept)
		}
	}
	testutil.Eventually(t, waitTimeout, "team-a to serve its Service", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2") })
	for _, inst := range []string{"team-c", "proxy", "foreign", "swapped", "prefixed"} {
		for _, fam := range []string{"IPv4", "IPv6"} {
			if got := metricValue(t, f.sup, `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{proxy_instance="`+inst+`",ip_family="`+fam+`"}`); got != "" {
				t.Errorf("cleanup failure counted for %s %s: %q", inst, fam, got)
			}
		}
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
	f := startSupervisorWith(t, fixtureOptions{failTable: "shardproxy-stuck", seed: []string{"ip shardproxy-stuck # shardproxy instance stuck", "ip6 shardproxy-stuck # shardproxy instance stuck"}})
	series := `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{proxy_instance="stuck",ip_family="%s"}`
	testutil.Eventually(t, waitTimeout, "both failures counted, one per family", func() bool {
		return metricValue(t, f.sup, fmt.Sprintf(series, "IPv4")) == "1" && metricValue(t, f.sup, fmt.Sprintf(series, "IPv6")) == "1"
	})
	if !f.tables.exists("ip shardproxy-stuck") {
		t.Error("the table that failed to delete is gone")
	}
}
