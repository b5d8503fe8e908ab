package supervisor

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

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

// oneInstanceYAML is a node with only a default instance.
const oneInstanceYAML = `
apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: node-1
instances:
- name: default
  default: true
  slot: 0
  minSyncPeriod: 0s
  syncPeriod: 30s
`

// TestFullSyncHookCoversConntrackCleanup: Deps.FullSync is held over a full sync and
// the conntrack cleanup that follows it (which compares every Service's ports after a
// first sync, at the memory peak), and every start is ended.
func TestFullSyncHookCoversConntrackCleanup(t *testing.T) {
	var (
		mu      sync.Mutex
		windows [][2]int // conntrack calls at each hook's start and end
		open    int
	)
	var f *fixture
	calls := func() int { return len(f.ct.Calls()) }
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "172.30.0.9", ClusterIPs: []string{"172.30.0.9"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	f = startSupervisorWith(t, fixtureOptions{configYAML: oneInstanceYAML, objects: []runtime.Object{svc},
		fullSync: func() func() {
			mu.Lock()
			defer mu.Unlock()
			open++
			i := len(windows)
			windows = append(windows, [2]int{calls(), -1})
			return func() {
				mu.Lock()
				defer mu.Unlock()
				open--
				windows[i][1] = calls()
			}
		}})
	testutil.Eventually(t, waitTimeout, "a conntrack cleanup inside a full sync's hook", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(windows, func(w [2]int) bool { return w[1] > w[0] })
	})
	testutil.Eventually(t, waitTimeout, "every hook ended", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return open == 0
	})
}
