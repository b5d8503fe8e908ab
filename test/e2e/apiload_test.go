package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/migrate"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// idleWindow is how long TestAPIRequestsWhenIdle watches the supervisor's requests.
// client-go reopens each watch every 5 to 10 minutes, so a window this short sees
// mostly none; what it must never see is a write.
const idleWindow = 30 * time.Second

// TestAPIRequestsWhenIdle measures the real binary's steady-state load on the
// apiserver (issue 16 item 6), from its own rest_client_requests_total: with every
// instance synced and nothing changing, and no migration running, a node writes nothing
// but its status's last-sync refresh every migrate.SyncResolution (no heartbeat, no
// event) and reads only to reopen its watches and before that refresh. At 5,000 nodes
// every request per node per minute is 83 per second on the apiserver.
func TestAPIRequestsWhenIdle(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	if err := e.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Steady state begins once the node status carries every instance's first sync: the
	// instances finish their first syncs moments apart, and each one's first LastSync is a
	// status write of start-up, not of idleness.
	testutil.Eventually(t, time.Minute, "the node status lists every instance's first sync", func() bool {
		return firstSyncsPublished(ctx, e)
	})
	before := requestsByMethod(ctx, t, e)
	if before[http.MethodGet] == 0 {
		t.Fatalf("rest_client_requests_total counts no GET since start: the client's transport is not instrumented (%v)", before)
	}
	start := time.Now()
	time.Sleep(idleWindow) // a measurement window, not a wait for a condition
	after := requestsByMethod(ctx, t, e)
	elapsed := time.Since(start)

	perMinute := func(n float64) float64 { return n / elapsed.Minutes() }
	// A healthy node rewrites its status when its published last sync, rounded to
	// migrate.SyncResolution (5 min, at a phase of the node's own), moves: at most one
	// update (and the GET before it) in a window shorter than that.
	refreshes := float64(elapsed/migrate.SyncResolution + 1)
	var reads, writes float64
	for method, n := range after {
		d := n - before[method]
		if method == http.MethodGet {
			reads += d
			continue
		}
		writes += d
		if allowed := map[string]float64{http.MethodPut: refreshes}[method]; d > allowed {
			t.Errorf("%s: %v requests in %v of idle (want at most %v: no heartbeat without a migration but the status's %v last-sync refresh, no event without a change)",
				method, d, elapsed.Round(time.Second), allowed, migrate.SyncResolution)
		}
	}
	// The supervisor holds at most 8 watches (Services and EndpointSlices twice when
	// scoped, Node, ServiceCIDR, IPAddress, status); each reopens at most once a window.
	if reads > 8+refreshes {
		t.Errorf("%v GETs in %v of idle, want at most one reopened watch each (8) and the status refresh's (%v)", reads, elapsed.Round(time.Second), refreshes)
	}
	t.Logf("idle for %v: %v reads, %v writes (%.2f requests/minute/node; %.1f/s on the apiserver at 5,000 nodes); since start %v",
		elapsed.Round(time.Second), reads, writes, perMinute(reads+writes), perMinute(reads+writes)*5000/60, after)
}

// firstSyncsPublished reports whether this node's status ConfigMap lists every
// instance, each with a LastSync.
func firstSyncsPublished(ctx context.Context, e *env.Env) bool {
	cm, err := e.Client.CoreV1().ConfigMaps("shardproxy-system").Get(ctx, migrate.ConfigMapName(env.NodeName), metav1.GetOptions{})
	if err != nil {
		return false
	}
	var st migrate.NodeStatus
	if json.Unmarshal([]byte(cm.Data[migrate.StatusKey]), &st) != nil || len(st.Instances) == 0 {
		return false
	}
	for _, inst := range st.Instances {
		if inst.LastSync.IsZero() {
			return false
		}
	}
	return true
}

// requestsByMethod reads the supervisor's rest_client_requests_total, summed by method.
func requestsByMethod(ctx context.Context, t *testing.T, e *env.Env) map[string]float64 {
	t.Helper()
	m, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, met := range m["rest_client_requests_total"].GetMetric() {
		for _, l := range met.GetLabel() {
			if l.GetName() == "method" {
				out[l.GetValue()] += met.GetCounter().GetValue()
			}
		}
	}
	return out
}
