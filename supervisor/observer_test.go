package supervisor

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestHealthReportsFamiliesOfSyncs: the families each instance's syncs program reach the
// upstream status of /healthz and /livez, healthy, and the node stays healthy.
func TestHealthReportsFamiliesOfSyncs(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("x", "plain", "", "172.30.0.1")
	testutil.Eventually(t, waitTimeout, "default programs its Service", func() bool { return has(f.tables.dump("ip shardproxy-default"), "172.30.0.1") })
	for _, path := range []string{"/healthz", "/livez"} {
		var body healthcheck.HealthResponse
		testutil.Eventually(t, waitTimeout, path+" reports both families", func() bool {
			if err := json.Unmarshal([]byte(get(t, f.sup, path)), &body); err != nil {
				t.Fatalf("decoding %s: %v", path, err)
			}
			return len(body.Status) == 2
		})
		for _, fam := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
			if st, ok := body.Status[fam]; !ok || !st.Healthy || st.LastUpdated.IsZero() {
				t.Errorf("GET %s: status of %s is %+v (present %v), want healthy with a sync time", path, fam, st, ok)
			}
		}
		if !body.Healthy {
			t.Errorf("GET %s: healthy is false", path)
		}
	}
}

// TestSyncSeriesPerFamily: a sync is observed in kube-proxy's per-family series of each
// family it programs, beside the instance, as upstream's per-family proxiers report.
func TestSyncSeriesPerFamily(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("x", "plain", "", "172.30.0.1")
	testutil.Eventually(t, waitTimeout, "default programs its Service", func() bool { return has(f.tables.dump("ip shardproxy-default"), "172.30.0.1") })
	for _, fam := range []string{"IPv4", "IPv6"} {
		labels := `{proxy_instance="default",ip_family="` + fam + `"}`
		for _, series := range []string{
			"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
			"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
			"kubeproxy_sync_proxy_rules_duration_seconds_count",
			"kubeproxy_sync_full_proxy_rules_duration_seconds_count",
		} {
			if got := metricValue(t, f.sup, series+labels); got == "" || got == "0" {
				t.Errorf("%s%s = %q, want observed", series, labels, got)
			}
		}
		series := `kubeproxy_sync_proxy_rules_no_local_endpoints_total{proxy_instance="default",ip_family="` + fam + `",traffic_policy="internal"}`
		if got := metricValue(t, f.sup, series); got != "0" {
			t.Errorf("%s = %q, want 0", series, got)
		}
	}
}
