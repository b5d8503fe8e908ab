package metrics

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// upstreamKubeProxyLabels are the kube-proxy series of nftables mode and their labels,
// as upstream kube-proxy defines them in pkg/proxy/metrics, taken from the Kubernetes
// metrics reference of v1.34 (the newest release this list was checked against; the
// issue asks for v1.36's, which an e2e test against the real kube-proxy v1.36.3 should
// confirm). The iptables- and ipvs-only series
// (kubeproxy_sync_proxy_rules_iptables_*, kubeproxy_iptables_*) are left out: shardproxy
// runs nftables only.
var upstreamKubeProxyLabels = map[string][]string{
	"kubeproxy_sync_proxy_rules_duration_seconds":                {"ip_family"},
	"kubeproxy_sync_full_proxy_rules_duration_seconds":           {"ip_family"},
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":        {"ip_family"},
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds":          {"ip_family"},
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds":   {"ip_family"},
	"kubeproxy_network_programming_duration_seconds":             {"ip_family"},
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":    {"ip_family"},
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": {"ip_family"},
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total":        {"ip_family", "traffic_policy"},
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending":        {},
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":          {},
	"kubeproxy_sync_proxy_rules_service_changes_pending":         {},
	"kubeproxy_sync_proxy_rules_service_changes_total":           {},
	"kubeproxy_proxy_healthz_total":                              {"code"},
	"kubeproxy_proxy_livez_total":                                {"code"},
	"kubeproxy_conntrack_reconciler_deleted_entries_total":       {"ip_family"},
	"kubeproxy_conntrack_reconciler_sync_duration_seconds":       {"ip_family"},
}

// notExported are upstream's series above that shardproxy does not export, and why.
var notExported = map[string]string{
	"kubeproxy_conntrack_reconciler_sync_duration_seconds": "not implemented yet: the conntrack cleanup (supervisor/conntrack) has no duration histogram",
}

// TestKubeProxySeriesHaveUpstreamLabels: every kubeproxy_* series shardproxy exports is
// one of upstream's, with upstream's labels, plus "instance" on those shardproxy keeps per
// instance; each of upstream's is exported unless listed in notExported.
func TestKubeProxySeriesHaveUpstreamLabels(t *testing.T) {
	m := New()
	m.InitInstance("team-a")
	for _, fam := range []string{IPv4, IPv6} {
		m.SetLastSync("team-a", fam, time.Now())
		m.SetLastQueued("team-a", fam, time.Now())
		m.ConntrackDeleted("team-a", fam, 1)
	}
	m.HealthzResult(200)
	m.LivezResult(200)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][][]string{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "kubeproxy_") {
			continue
		}
		for _, metric := range f.GetMetric() {
			var labels []string
			for _, l := range metric.GetLabel() {
				labels = append(labels, l.GetName())
			}
			slices.Sort(labels)
			if !slices.ContainsFunc(got[f.GetName()], func(l []string) bool { return slices.Equal(l, labels) }) {
				got[f.GetName()] = append(got[f.GetName()], labels)
			}
		}
	}
	for name, labelSets := range got {
		upstream, ok := upstreamKubeProxyLabels[name]
		if !ok {
			t.Errorf("%s is not one of upstream kube-proxy's series", name)
			continue
		}
		want := slices.Clone(upstream)
		if slices.Contains(perInstanceNames, name) {
			want = append(want, labelInstance)
		}
		slices.Sort(want)
		for _, labels := range labelSets {
			if !slices.Equal(labels, want) {
				t.Errorf("%s has labels %v, want %v (upstream's %v)", name, labels, want, upstream)
			}
		}
	}
	for name := range upstreamKubeProxyLabels {
		if _, ok := got[name]; !ok && notExported[name] == "" {
			t.Errorf("upstream's %s is not exported", name)
		}
	}
}
