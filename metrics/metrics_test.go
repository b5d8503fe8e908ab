package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// perInstanceNames lists every metric family that carries an instance label.
var perInstanceNames = []string{
	"kubeproxy_sync_proxy_rules_duration_seconds",
	"kubeproxy_sync_full_proxy_rules_duration_seconds",
	"kubeproxy_sync_partial_proxy_rules_duration_seconds",
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
	"kubeproxy_network_programming_duration_seconds",
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending",
	"kubeproxy_sync_proxy_rules_endpoint_changes_total",
	"kubeproxy_sync_proxy_rules_service_changes_pending",
	"kubeproxy_sync_proxy_rules_service_changes_total",
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total",
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
	"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
	"shardproxy_instance_up",
	"shardproxy_instance_stale",
	"shardproxy_instance_restarts_total",
	"shardproxy_instance_services",
	"shardproxy_instance_endpoints",
	"shardproxy_conntrack_deleted_entries_total",
	"shardproxy_conntrack_cleanup_failures_total",
	"shardproxy_guard_refusals_total",
	"shardproxy_sync_operations",
}

// nodeWideNames lists the metric families without an instance label.
var nodeWideNames = []string{
	"kubeproxy_proxy_healthz_total",
	"kubeproxy_proxy_livez_total",
	"kubeproxy_conntrack_reconciler_deleted_entries_total",
	"kubeproxy_conntrack_reconciler_sync_duration_seconds",
	"shardproxy_handovers_total",
	"shardproxy_build_info",
}

// exercise records one of everything for instance.
func exercise(m *Metrics, instance string) {
	m.ObserveSync(instance, IPv4, true, 20*time.Millisecond)
	m.ObserveSync(instance, IPv6, false, 2*time.Millisecond)
	m.ObserveSyncOperations(instance, true, 300)
	m.ObserveSyncOperations(instance, false, 5)
	m.SetLastSync(instance, IPv4, time.Unix(1700000000, 500_000_000))
	m.SetLastQueued(instance, IPv6, time.Unix(1700000001, 0))
	m.ObserveNetworkProgramming(instance, IPv4, 1500*time.Millisecond)
	m.SyncFailed(instance, IPv4)
	m.CleanupFailed(instance, IPv6)
	m.SetInstanceStale(instance, true)
	m.SetInstanceUp(instance, true)
	m.InstanceRestarted(instance)
	m.SetOwned(instance, 7, 21)
	m.ConntrackDeleted(instance, "IPv4", 3)
	m.ConntrackCleanupFailed(instance, IPv6)
	m.GuardRefused(instance, GuardAddress)
	m.SetPendingChanges(instance, 2, 4)
	m.AddChanges(instance, 5, 9)
	m.SetNoLocalEndpoints(instance, IPv4, 1, 2)
	m.SetNoLocalEndpoints(instance, IPv6, 0, 3)
}

func TestValues(t *testing.T) {
	m := New()
	exercise(m, "team-a")
	m.SetInstanceUp("team-b", false)
	m.Handover("team-a", "team-b")
	m.Handover("team-a", "team-b")
	m.HealthzResult(200)
	m.HealthzResult(503)
	m.HealthzResult(200)
	m.LivezResult(200)
	m.ConntrackDeleted("team-b", "IPv4", 4)
	m.ConntrackDeleted("team-b", "IPv6", 1)

	tests := []struct {
		name string
		got  float64
		want float64
	}{
		{"last sync keeps sub-second precision", testutil.ToFloat64(m.lastSync.WithLabelValues("team-a", IPv4)), 1700000000.5},
		{"last queued", testutil.ToFloat64(m.lastQueued.WithLabelValues("team-a", IPv6)), 1700000001},
		{"sync failures", testutil.ToFloat64(m.syncFailures.WithLabelValues("team-a", IPv4)), 1},
		{"sync failures of the other family", testutil.ToFloat64(m.syncFailures.WithLabelValues("team-a", IPv6)), 0},
		{"cleanup failures", testutil.ToFloat64(m.cleanupFailures.WithLabelValues("team-a", IPv6)), 1},
		{"instance up", testutil.ToFloat64(m.instanceUp.WithLabelValues("team-a")), 1},
		{"instance down", testutil.ToFloat64(m.instanceUp.WithLabelValues("team-b")), 0},
		{"restarts", testutil.ToFloat64(m.instanceRestarts.WithLabelValues("team-a")), 1},
		{"owned services", testutil.ToFloat64(m.instanceServices.WithLabelValues("team-a")), 7},
		{"owned endpoints", testutil.ToFloat64(m.instanceEndpoints.WithLabelValues("team-a")), 21},
		{"per-instance conntrack", testutil.ToFloat64(m.conntrackDeleted.WithLabelValues("team-b")), 5},
		{"reconciler conntrack sums instances per family", testutil.ToFloat64(m.conntrackReconcilerDeleted.WithLabelValues("IPv4")), 7},
		{"reconciler conntrack IPv6", testutil.ToFloat64(m.conntrackReconcilerDeleted.WithLabelValues("IPv6")), 1},
		{"conntrack cleanup failures", testutil.ToFloat64(m.conntrackFailures.WithLabelValues("team-a", IPv6)), 1},
		{"conntrack cleanup failures of the other family", testutil.ToFloat64(m.conntrackFailures.WithLabelValues("team-a", IPv4)), 0},
		{"address guard refusals", testutil.ToFloat64(m.guardRefusals.WithLabelValues("team-a", GuardAddress)), 1},
		{"namespace guard refusals", testutil.ToFloat64(m.guardRefusals.WithLabelValues("team-a", GuardNamespace)), 0},
		{"pending services", testutil.ToFloat64(m.serviceChangesPending.WithLabelValues("team-a")), 2},
		{"pending endpoints", testutil.ToFloat64(m.endpointChangesPending.WithLabelValues("team-a")), 4},
		{"service changes", testutil.ToFloat64(m.serviceChangesTotal.WithLabelValues("team-a")), 5},
		{"endpoint changes", testutil.ToFloat64(m.endpointChangesTotal.WithLabelValues("team-a")), 9},
		{"no local endpoints internal", testutil.ToFloat64(m.noLocalEndpoints.WithLabelValues("team-a", IPv4, "internal")), 1},
		{"no local endpoints external", testutil.ToFloat64(m.noLocalEndpoints.WithLabelValues("team-a", IPv4, "external")), 2},
		{"no local endpoints external IPv6", testutil.ToFloat64(m.noLocalEndpoints.WithLabelValues("team-a", IPv6, "external")), 3},
		{"handovers", testutil.ToFloat64(m.handovers.WithLabelValues("team-a", "team-b")), 2},
		{"healthz 200", testutil.ToFloat64(m.healthz.WithLabelValues("200")), 2},
		{"healthz 503", testutil.ToFloat64(m.healthz.WithLabelValues("503")), 1},
		{"livez 200", testutil.ToFloat64(m.livez.WithLabelValues("200")), 1},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestObserveSyncSplitsFullAndPartial(t *testing.T) {
	m := New()
	m.ObserveSync("team-a", IPv4, true, 20*time.Millisecond)
	m.ObserveSync("team-a", IPv4, false, 2*time.Millisecond)
	m.ObserveSync("team-a", IPv4, false, 3*time.Millisecond)
	m.ObserveSync("team-a", IPv6, false, 4*time.Millisecond)
	m.ObserveSyncOperations("team-a", true, 300)
	m.ObserveSyncOperations("team-a", false, 5)
	m.ObserveSyncOperations("team-a", false, 6)

	tests := []struct {
		name      string
		family    string
		labels    map[string]string
		wantCount uint64
		wantSum   float64
	}{
		{"every sync feeds the overall histogram", "kubeproxy_sync_proxy_rules_duration_seconds",
			map[string]string{"proxy_instance": "team-a", "ip_family": "IPv4"}, 3, 0.025},
		{"full syncs", "kubeproxy_sync_full_proxy_rules_duration_seconds",
			map[string]string{"proxy_instance": "team-a", "ip_family": "IPv4"}, 1, 0.020},
		{"partial syncs", "kubeproxy_sync_partial_proxy_rules_duration_seconds",
			map[string]string{"proxy_instance": "team-a", "ip_family": "IPv4"}, 2, 0.005},
		{"each family apart", "kubeproxy_sync_proxy_rules_duration_seconds",
			map[string]string{"proxy_instance": "team-a", "ip_family": "IPv6"}, 1, 0.004},
		{"full operations", "shardproxy_sync_operations",
			map[string]string{"proxy_instance": "team-a", "kind": "full"}, 1, 300},
		{"partial operations", "shardproxy_sync_operations",
			map[string]string{"proxy_instance": "team-a", "kind": "partial"}, 2, 11},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := findHistogram(t, m, tc.family, tc.labels)
			if got := h.GetSampleCount(); got != tc.wantCount {
				t.Errorf("count: got %d, want %d", got, tc.wantCount)
			}
			if got := h.GetSampleSum(); !approx(got, tc.wantSum) {
				t.Errorf("sum: got %v, want %v", got, tc.wantSum)
			}
		})
	}
}

// TestBucketsMatchUpstream: every upper bound of the histograms, the shared ones as
// upstream kube-proxy defines them (upstreamBuckets), shardproxy's own as written here.
func TestBucketsMatchUpstream(t *testing.T) {
	m := New()
	m.InitInstance("team-a")
	m.ObserveNetworkProgramming("team-a", IPv4, time.Second)

	tests := []struct {
		family string
		labels map[string]string
		want   []float64
	}{
		{"kubeproxy_sync_proxy_rules_duration_seconds", map[string]string{"proxy_instance": "team-a", "ip_family": "IPv4"},
			upstreamBuckets["kubeproxy_sync_proxy_rules_duration_seconds"]},
		{"kubeproxy_network_programming_duration_seconds", map[string]string{"proxy_instance": "team-a", "ip_family": "IPv4"},
			upstreamBuckets["kubeproxy_network_programming_duration_seconds"]},
		{"shardproxy_sync_operations", map[string]string{"proxy_instance": "team-a", "kind": "full"},
			[]float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}},
	}
	for _, tc := range tests {
		t.Run(tc.family, func(t *testing.T) {
			if len(tc.want) == 0 {
				t.Fatal("no bounds to compare with")
			}
			var got []float64
			for _, b := range findHistogram(t, m, tc.family, tc.labels).GetBucket() {
				got = append(got, b.GetUpperBound())
			}
			first := -1
			for i := range max(len(got), len(tc.want)) {
				if i >= len(got) || i >= len(tc.want) || !approx(got[i], tc.want[i]) {
					first = i
					break
				}
			}
			if first >= 0 {
				t.Errorf("bounds differ from bucket %d on:\n got %v\nwant %v", first, got, tc.want)
			}
		})
	}
}

func TestNegativeCountsAreIgnored(t *testing.T) {
	m := New()
	m.AddChanges("team-a", -1, -2)
	m.ConntrackDeleted("team-a", "IPv4", -3)
	if got := testutil.ToFloat64(m.serviceChangesTotal.WithLabelValues("team-a")); got != 0 {
		t.Errorf("service changes: got %v, want 0", got)
	}
	if got := testutil.ToFloat64(m.conntrackDeleted.WithLabelValues("team-a")); got != 0 {
		t.Errorf("conntrack deleted: got %v, want 0", got)
	}
}

func TestLint(t *testing.T) {
	m := New()
	exercise(m, "team-a")
	m.Handover("team-a", "team-b")
	m.HealthzResult(200)
	m.LivezResult(200)
	m.ObserveConntrackReconcile(IPv4, time.Millisecond)
	problems, err := testutil.GatherAndLint(m.Registry(), append(perInstanceNames, nodeWideNames...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// Upstream's name, kept for dashboards, is a gauge with a _total
		// suffix; that is the one deviation we accept.
		if p.Metric == "kubeproxy_sync_proxy_rules_no_local_endpoints_total" {
			continue
		}
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestHandlerServesEveryMetric(t *testing.T) {
	m := New()
	exercise(m, "team-a")
	m.SetBuildInfo("v0.3.0")
	m.Handover("team-a", "team-b")
	m.HealthzResult(200)
	m.LivezResult(200)

	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: got %d, want 200", resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)

	for _, name := range perInstanceNames {
		if !hasSeries(text, name, `proxy_instance="team-a"`) {
			t.Errorf("no %s series with proxy_instance=\"team-a\" in scrape", name)
		}
	}
	for _, want := range []string{
		`kubeproxy_proxy_healthz_total{code="200"} 1`,
		`kubeproxy_proxy_livez_total{code="200"} 1`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 3`,
		`shardproxy_handovers_total{from="team-a",to="team-b"} 1`,
		`shardproxy_build_info{go_version="` + runtime.Version() + `",version="v0.3.0"} 1`,
		"go_goroutines ",
		"process_start_time_seconds ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestInitInstanceCreatesZeroSeries(t *testing.T) {
	m := New()
	m.InitInstance("team-a")
	for _, name := range perInstanceNames {
		if strings.HasPrefix(name, "kubeproxy_sync_proxy_rules_last_") {
			continue // timestamps are only set by real events
		}
		if n := countSeries(t, m, name, "team-a"); n == 0 {
			t.Errorf("%s: no series for team-a after InitInstance", name)
		}
	}
	if n := testutil.CollectAndCount(m.syncFailures); n != 2 {
		t.Errorf("sync failures: %d series, want one per family", n)
	}
	for _, fam := range []string{IPv4, IPv6} {
		if got := testutil.ToFloat64(m.syncFailures.WithLabelValues("team-a", fam)); got != 0 {
			t.Errorf("sync failures %s: got %v, want 0", fam, got)
		}
	}
}

func TestForgetInstance(t *testing.T) {
	m := New()
	exercise(m, "team-a")
	exercise(m, "team-b")
	m.Handover("team-a", "team-b")
	m.Handover("team-b", "team-c")
	m.Handover("team-c", "team-a")
	m.HealthzResult(200)

	m.ForgetInstance("team-a")

	for _, name := range perInstanceNames {
		if n := countSeries(t, m, name, "team-a"); n != 0 {
			t.Errorf("%s: %d series of team-a left after ForgetInstance", name, n)
		}
		if n := countSeries(t, m, name, "team-b"); n == 0 {
			t.Errorf("%s: team-b's series were removed too", name)
		}
	}
	if got := testutil.CollectAndCount(m.handovers); got != 1 {
		t.Errorf("handover series: got %d, want only team-b -> team-c", got)
	}
	if got := testutil.ToFloat64(m.handovers.WithLabelValues("team-b", "team-c")); got != 1 {
		t.Errorf("team-b -> team-c handovers: got %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.healthz.WithLabelValues("200")); got != 1 {
		t.Errorf("node-wide healthz: got %v, want 1 (kept)", got)
	}
	if got := testutil.ToFloat64(m.conntrackReconcilerDeleted.WithLabelValues("IPv4")); got != 6 {
		t.Errorf("node-wide conntrack: got %v, want 6 (kept)", got)
	}
}

func TestRegistriesAreIndependent(t *testing.T) {
	// A second New must not panic on duplicate registration.
	a, b := New(), New()
	a.SyncFailed("team-a", IPv4)
	a.SyncFailed("team-a", IPv4)
	b.SyncFailed("team-a", IPv4)

	if got := testutil.ToFloat64(a.syncFailures.WithLabelValues("team-a", IPv4)); got != 2 {
		t.Errorf("a: got %v, want 2", got)
	}
	if got := testutil.ToFloat64(b.syncFailures.WithLabelValues("team-a", IPv4)); got != 1 {
		t.Errorf("b: got %v, want 1", got)
	}
	if a.Registry() == b.Registry() {
		t.Error("both Metrics share one registry")
	}
	if n := countSeries(t, b, "shardproxy_instance_up", "team-a"); n != 0 {
		t.Errorf("b has %d instance_up series it never set", n)
	}
}

// findHistogram gathers m and returns the histogram of family whose labels
// are exactly labels.
func findHistogram(t *testing.T, m *Metrics, family string, labels map[string]string) *dto.Histogram {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, metric := range mf.GetMetric() {
			if labelsEqual(metric.GetLabel(), labels) {
				return metric.GetHistogram()
			}
		}
	}
	t.Fatalf("no %s series with labels %v", family, labels)
	return nil
}

// countSeries returns how many series of family carry proxy_instance=instance.
func countSeries(t *testing.T, m *Metrics, family, instance string) int {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == labelInstance && l.GetValue() == instance {
					n++
				}
			}
		}
	}
	return n
}

func labelsEqual(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

// hasSeries reports whether the text exposition has a sample of name, or of
// its histogram _bucket/_sum/_count, whose labels include label.
func hasSeries(text, name, label string) bool {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, _, ok := strings.Cut(line, "{")
		if !ok {
			continue
		}
		if series != name && series != name+"_bucket" && series != name+"_sum" && series != name+"_count" {
			continue
		}
		if strings.Contains(line, label) {
			return true
		}
	}
	return false
}

func approx(a, b float64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d < 1e-9*(1+b)
}

// TestNoSeriesCarriesATargetLabel: Prometheus sets "instance" and "job" on every series
// it scrapes; a series carrying either lands as exported_instance / exported_job under
// the default honor_labels: false, or overwrites the target with honor_labels: true, so
// dashboards and alerts written for kube-proxy (by instance) would break.
func TestNoSeriesCarriesATargetLabel(t *testing.T) {
	m := New()
	exercise(m, "team-a")
	m.Handover("team-a", "team-b")
	m.HealthzResult(200)
	m.SetBuildInfo("v0.3.0")
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "instance" || l.GetName() == "job" {
					t.Errorf("%s carries the label %q, which Prometheus reserves for the scrape target", mf.GetName(), l.GetName())
				}
			}
		}
	}
}

// TestSetBuildInfoKeepsOneSeries: a second call replaces the series rather than adding one.
func TestSetBuildInfoKeepsOneSeries(t *testing.T) {
	m := New()
	m.SetBuildInfo("v0.1.0")
	m.SetBuildInfo("v0.2.0")
	if n := testutil.CollectAndCount(m.buildInfo); n != 1 {
		t.Errorf("shardproxy_build_info has %d series, want 1", n)
	}
}
