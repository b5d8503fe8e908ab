package metrics

import (
	"slices"
	"strings"
	"testing"
	"time"

	basemetrics "k8s.io/component-base/metrics"
)

// upstreamKubeProxyLabels are the kube-proxy series of nftables mode and their labels,
// as upstream kube-proxy defines them in pkg/proxy/metrics, checked against
// k8s.io/kubernetes v1.36.3's pkg/proxy/metrics/metrics.go. The iptables- and ipvs-only series
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
var notExported = map[string]string{}

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
		m.ObserveConntrackReconcile(fam, time.Millisecond)
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

// upstreamBuckets are the upper bounds of upstream's histograms, written as
// pkg/proxy/metrics of k8s.io/kubernetes v1.36.3 writes them and computed by the same
// k8s.io/component-base/metrics helpers. (MergeBuckets starts from a 0 bound: upstream's
// network programming histogram has an le="0" bucket.)
var upstreamBuckets = map[string][]float64{
	"kubeproxy_sync_proxy_rules_duration_seconds":          basemetrics.ExponentialBuckets(0.001, 2, 15),
	"kubeproxy_sync_full_proxy_rules_duration_seconds":     basemetrics.ExponentialBuckets(0.001, 2, 15),
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":  basemetrics.ExponentialBuckets(0.001, 2, 15),
	"kubeproxy_conntrack_reconciler_sync_duration_seconds": basemetrics.ExponentialBuckets(0.001, 2, 15),
	"kubeproxy_network_programming_duration_seconds": basemetrics.MergeBuckets(
		basemetrics.LinearBuckets(0.25, 0.25, 2), // 0.25s, 0.50s
		basemetrics.LinearBuckets(1, 1, 59),      // 1s, 2s, 3s, ... 59s
		basemetrics.LinearBuckets(60, 5, 12),     // 60s, 65s, 70s, ... 115s
		basemetrics.LinearBuckets(120, 30, 7),    // 2min, 2.5min, 3min, ..., 5min
	),
}

// TestHistogramsHaveUpstreamBuckets: the histograms shardproxy shares with upstream
// bucket observations as upstream does, so dashboards' histogram_quantile agree.
func TestHistogramsHaveUpstreamBuckets(t *testing.T) {
	m := New()
	m.InitInstance("team-a")
	m.ObserveSync("team-a", IPv4, true, time.Millisecond)
	m.ObserveSync("team-a", IPv4, false, time.Millisecond)
	m.ObserveConntrackReconcile(IPv4, time.Millisecond)
	m.ObserveNetworkProgramming("team-a", IPv4, time.Second)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range fams {
		want, ok := upstreamBuckets[f.GetName()]
		if !ok || len(f.GetMetric()) == 0 {
			continue
		}
		seen[f.GetName()] = true
		var got []float64
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			got = append(got, b.GetUpperBound())
		}
		if !slices.EqualFunc(got, want, approx) {
			t.Errorf("%s buckets %v, want upstream's %v", f.GetName(), got, want)
		}
	}
	for name := range upstreamBuckets {
		if !seen[name] {
			t.Errorf("%s: no series observed", name)
		}
	}
}
