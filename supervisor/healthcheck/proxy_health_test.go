package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/testutil"
)

var _ Clock = &testutil.Clock{}

func newFakeClock() *testutil.Clock {
	return testutil.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
}

// response is what a test sees of one HTTP response.
type response struct {
	code   int
	header http.Header
	body   []byte
}

// get fetches url over real HTTP, failing the test on transport errors.
func get(t *testing.T, url string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("building request for %s: %v", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body of %s: %v", url, err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: body}
}

// serveProxyHealth serves h on an ephemeral loopback port until the test ends, and returns
// its base URL.
func serveProxyHealth(t *testing.T, h *ProxyHealth) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listening: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- h.ServeListener(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeListener returned %v after cancel, want nil", err)
		}
	})
	return "http://" + l.Addr().String()
}

func decodeHealth(t *testing.T, r response) HealthResponse {
	t.Helper()
	var got HealthResponse
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
	return got
}

func TestProxyHealth(t *testing.T) {
	const timeout = time.Minute
	tests := []struct {
		name  string
		setup func(h *ProxyHealth, clock *testutil.Clock)
		// wantHealthz and wantLivez are the expected status codes.
		wantHealthz int
		wantLivez   int
		// wantInstances is each instance's expected healthy verdict in the /healthz body,
		// and in the /livez body unless wantLive is set.
		wantInstances map[string]bool
		wantLive      map[string]bool
		wantEligible  bool
	}{
		{
			name:          "no instances is healthy",
			setup:         func(*ProxyHealth, *testutil.Clock) {},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{},
			wantEligible:  true,
		},
		{
			name: "instance is healthy at start",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				clock.Step(StuckFactor*timeout - time.Second)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			// A periodic sync that hangs (nft never returns) queues nothing.
			name: "a sync loop that finishes no sync for twice the timeout is stuck, with nothing queued",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.Updated("team-a")
				clock.Step(StuckFactor * timeout)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusServiceUnavailable,
			wantInstances: map[string]bool{"team-a": false},
			wantEligible:  true,
		},
		{
			name: "a sync loop that keeps finishing syncs, failed ones too, is not stuck",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				clock.Step(StuckFactor*timeout - time.Second)
				h.SyncFinished("team-a")
				clock.Step(StuckFactor*timeout - time.Second)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "an instance restarted by the supervisor has a whole bound again",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				clock.Step(StuckFactor*timeout - time.Second)
				h.SetInstanceUp("team-a", true, "")
				clock.Step(StuckFactor*timeout - time.Second)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			// The kubelet restarting the pod would stop every other tenant's instance.
			name: "one stuck instance beside a healthy one fails neither healthz nor livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				clock.Step(timeout)
				h.Updated("team-a")
				clock.Step(timeout)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true, "team-b": false},
			wantEligible:  true,
		},
		{
			name: "queued update within the timeout is healthy",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				clock.Step(timeout - time.Second)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "queued update not applied within the timeout is unhealthy",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				clock.Step(timeout)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusServiceUnavailable,
			wantInstances: map[string]bool{"team-a": false},
			wantEligible:  true,
		},
		{
			name: "later queued updates do not reset the oldest",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				clock.Step(timeout / 2)
				h.QueuedUpdate("team-a")
				clock.Step(timeout / 2)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusServiceUnavailable,
			wantInstances: map[string]bool{"team-a": false},
			wantEligible:  true,
		},
		{
			name: "update applied after going stale is healthy again",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				clock.Step(2 * timeout)
				h.Updated("team-a")
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "sync error alone does not make the instance unhealthy",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.SetInstanceError("team-a", errors.New("nft: no such table"))
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "deleting node fails healthz but not livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.SetNodeDeleting(true)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  false,
		},
		{
			name: "node no longer deleting is eligible again",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.SetNodeDeleting(true)
				h.SetNodeDeleting(false)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			// Upstream's SyncNode: the autoscaler taints a node before removing it, and load
			// balancers should drain it meanwhile.
			name: "node tainted ToBeDeletedByClusterAutoscaler fails healthz but not livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.SetNodeToBeDeleted(true)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  false,
		},
		{
			name: "node whose autoscaler taint is removed is eligible again",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.SetNodeToBeDeleted(true)
				h.SetNodeToBeDeleted(false)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			// A load balancer reading /healthz would drain the node for every tenant, and a
			// kubelet reading /livez would restart every tenant's instance.
			name: "one stale instance beside a healthy one fails neither healthz nor livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.QueuedUpdate("team-a")
				h.QueuedUpdate("team-b")
				clock.Step(timeout / 2)
				h.Updated("team-a")
				clock.Step(timeout / 2)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true, "team-b": false},
			wantEligible:  true,
		},
		{
			name: "every instance stale fails the node",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.QueuedUpdate("team-a")
				h.QueuedUpdate("team-b")
				clock.Step(timeout)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusServiceUnavailable,
			wantInstances: map[string]bool{"team-a": false, "team-b": false},
			wantEligible:  true,
		},
		{
			// The supervisor restarts a down instance; a pod restart would stop the others.
			name: "down instance beside a healthy one fails neither healthz nor livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.SetInstanceUp("team-b", false, "crashed: exit status 2")
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true, "team-b": false},
			wantLive:      map[string]bool{"team-a": true, "team-b": true},
			wantEligible:  true,
		},
		{
			name: "every instance down fails healthz but not livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.SetInstanceUp("team-a", false, "crashed: exit status 2")
				h.SetInstanceUp("team-b", false, "backing off")
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": false, "team-b": false},
			wantLive:      map[string]bool{"team-a": true, "team-b": true},
			wantEligible:  true,
		},
		{
			name: "deleting node fails healthz although an instance is healthy",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.SetInstanceUp("team-b", false, "backing off")
				h.SetNodeDeleting(true)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true, "team-b": false},
			wantLive:      map[string]bool{"team-a": true, "team-b": true},
			wantEligible:  false,
		},
		{
			name: "down instance's stale queued update does not fail livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				h.SetInstanceUp("team-a", false, "backing off")
				clock.Step(2 * timeout)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": false},
			wantLive:      map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "instance back up has a full timeout for livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				h.SetInstanceUp("team-a", false, "backing off")
				clock.Step(2 * timeout)
				h.SetInstanceUp("team-a", true, "")
				clock.Step(timeout - time.Second)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": false},
			wantLive:      map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "instance back up fails livez once its queued update is stale again",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.QueuedUpdate("team-a")
				h.SetInstanceUp("team-a", false, "backing off")
				clock.Step(2 * timeout)
				h.SetInstanceUp("team-a", true, "")
				clock.Step(timeout)
			},
			wantHealthz:   http.StatusServiceUnavailable,
			wantLivez:     http.StatusServiceUnavailable,
			wantInstances: map[string]bool{"team-a": false},
			wantEligible:  true,
		},
		{
			name: "instance back up is healthy",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.SetInstanceUp("team-a", false, "restarting")
				h.SetInstanceUp("team-a", true, "")
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "removed instance no longer counts",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.QueuedUpdate("team-b")
				clock.Step(timeout)
				h.RemoveInstance("team-b")
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true},
			wantEligible:  true,
		},
		{
			name: "updates for an untracked instance are ignored",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.QueuedUpdate("gone")
				h.SetInstanceUp("gone", false, "stopped")
				clock.Step(timeout)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{},
			wantEligible:  true,
		},
		{
			name: "each instance has its own timeout",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("fast")
				h.QueuedUpdate("team-a")
				h.QueuedUpdate("fast")
				clock.Step(timeout / 2)
			},
			wantHealthz:   http.StatusOK,
			wantLivez:     http.StatusOK,
			wantInstances: map[string]bool{"team-a": true, "fast": false},
			wantEligible:  true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			h := NewProxyHealth(clock, func(instance string) time.Duration {
				if instance == "fast" {
					return timeout / 4
				}
				return timeout
			})
			tc.setup(h, clock)
			url := serveProxyHealth(t, h)

			for _, path := range []string{"/healthz", "/livez"} {
				want, wantInstances, verdict := tc.wantHealthz, tc.wantInstances, h.Healthy
				if path == "/livez" {
					want, verdict = tc.wantLivez, h.Live
					if tc.wantLive != nil {
						wantInstances = tc.wantLive
					}
				}
				r := get(t, url+path)
				if r.code != want {
					t.Errorf("GET %s: status %d, want %d; body %s", path, r.code, want, r.body)
				}
				checkJSONHeaders(t, r)
				got := decodeHealth(t, r)
				if !got.CurrentTime.Equal(clock.Now()) {
					t.Errorf("GET %s: currentTime %v, want %v", path, got.CurrentTime, clock.Now())
				}
				gotInstances := map[string]bool{}
				for name, inst := range got.Instances {
					gotInstances[name] = inst.Healthy
					if verdict(name) != inst.Healthy {
						t.Errorf("GET %s: the verdict on %q is %v, body says %v", path, name, verdict(name), inst.Healthy)
					}
				}
				if !reflect.DeepEqual(gotInstances, wantInstances) {
					t.Errorf("GET %s: instances healthy %v, want %v; body %s", path, gotInstances, wantInstances, r.body)
				}
				switch {
				case path == "/livez" && got.NodeEligible != nil:
					t.Errorf("GET /livez: has nodeEligible; body %s", r.body)
				case path == "/healthz" && (got.NodeEligible == nil || *got.NodeEligible != tc.wantEligible):
					t.Errorf("GET /healthz: nodeEligible missing or not %v; body %s", tc.wantEligible, r.body)
				}
			}
		})
	}
}

func checkJSONHeaders(t *testing.T, r response) {
	t.Helper()
	if got := r.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q, want application/json", got)
	}
	if got := r.header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q, want nosniff", got)
	}
}

func TestProxyHealthBody(t *testing.T) {
	clock := newFakeClock()
	h := NewProxyHealth(clock, nil)
	h.AddInstance("team-a")
	h.AddInstance("team-b")
	h.Updated("team-b", corev1.IPv4Protocol, corev1.IPv6Protocol)
	syncedB := clock.Now()
	h.QueuedUpdate("team-b")
	queuedB := clock.Now()
	h.SetInstanceError("team-b", errors.New("nft: transaction failed"))
	h.SetInstanceUp("team-b", false, "panic: boom\ngoroutine 1 [running]")
	clock.Step(time.Second)
	h.Updated("team-a", corev1.IPv4Protocol)
	syncedA := clock.Now()
	h.QueuedUpdate("team-a")
	queuedA := clock.Now()
	clock.Step(DefaultHealthTimeout)
	url := serveProxyHealth(t, h)

	r := get(t, url+"/healthz")
	if r.code != http.StatusServiceUnavailable {
		t.Fatalf("status %d with no healthy instance, want 503", r.code)
	}
	// The field names are the contract with probes and operators, so check them on the
	// raw JSON rather than through the Go types.
	var raw map[string]any
	if err := json.Unmarshal(r.body, &raw); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
	for _, key := range []string{"lastUpdated", "currentTime", "nodeEligible", "healthy", "status", "instances"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("body has no %q: %s", key, r.body)
		}
	}
	if !strings.Contains(string(r.body), `"team-b":{"healthy":false`) {
		t.Errorf("body does not name team-b as unhealthy: %s", r.body)
	}
	// /healthz is served on every address: errors and stacks stay on /status.
	for _, secret := range []string{"lastError", "downReason", "transaction failed", "panic", "goroutine"} {
		if strings.Contains(string(r.body), secret) {
			t.Errorf("/healthz body holds %q: %s", secret, r.body)
		}
	}

	got := decodeHealth(t, r)
	want := HealthResponse{
		// Unhealthy: the newest sync of any instance, as upstream v1.36.
		LastUpdated:  syncedA,
		CurrentTime:  clock.Now(),
		NodeEligible: got.NodeEligible,
		// A family is as old as its stalest instance and healthy when all its instances are.
		Status: map[corev1.IPFamily]FamilyHealth{
			corev1.IPv4Protocol: {LastUpdated: syncedB},
			corev1.IPv6Protocol: {LastUpdated: syncedB},
		},
		Instances: map[string]InstanceHealth{
			"team-a": {LastUpdated: syncedA, LastQueued: queuedA, Up: true},
			"team-b": {LastUpdated: syncedB, LastQueued: queuedB},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("body\n got %+v\nwant %+v", got, want)
	}

	h.Updated("team-a")
	r = get(t, url+"/healthz")
	got = decodeHealth(t, r)
	if r.code != http.StatusOK || !got.LastUpdated.Equal(clock.Now()) || !got.Healthy {
		t.Errorf("with team-a healthy again: status %d, lastUpdated %v, healthy %v; want 200, the current time %v as upstream, true",
			r.code, got.LastUpdated, got.Healthy, clock.Now())
	}
	// team-b, down, still programs both families: neither is healthy, and IPv4's oldest
	// sync is still team-b's.
	wantStatus := map[corev1.IPFamily]FamilyHealth{
		corev1.IPv4Protocol: {LastUpdated: syncedB},
		corev1.IPv6Protocol: {LastUpdated: syncedB},
	}
	if !reflect.DeepEqual(got.Status, wantStatus) {
		t.Errorf("status\n got %+v\nwant %+v", got.Status, wantStatus)
	}
	if got.Instances["team-b"].Healthy {
		t.Errorf("team-b shows healthy: %s", r.body)
	}
}

func TestProxyHealthStatus(t *testing.T) {
	clock := newFakeClock()
	h := NewProxyHealth(clock, nil)
	h.AddInstance("team-a")
	h.AddInstance("team-b")
	h.SetInstanceCounts("team-a", 12, 40)
	h.Updated("team-a")
	synced := clock.Now()
	h.SetInstanceCounts("team-b", 3, 7)
	h.SetInstanceError("team-b", errors.New("nft: transaction failed"))
	h.SetInstanceUp("team-b", false, "crashed")
	h.SetNodeDeleting(true)
	clock.Step(time.Second)
	url := serveProxyHealth(t, h)

	r := get(t, url+"/status")
	if r.code != http.StatusOK {
		t.Errorf("status %d, want 200", r.code)
	}
	checkJSONHeaders(t, r)
	var got StatusResponse
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
	want := StatusResponse{
		CurrentTime:  clock.Now(),
		NodeDeleting: true,
		Instances: map[string]InstanceStatus{
			"team-a": {
				InstanceHealth: InstanceHealth{Healthy: true, LastUpdated: synced, Up: true},
				Services:       12,
				Endpoints:      40,
			},
			"team-b": {
				LastError:  "nft: transaction failed",
				DownReason: "crashed",
				Services:   3,
				Endpoints:  7,
			},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("/status\n got %+v\nwant %+v", got, want)
	}

	h.SetInstanceError("team-b", nil)
	got = StatusResponse{}
	if err := json.Unmarshal(get(t, url+"/status").body, &got); err != nil {
		t.Fatal(err)
	}
	if e := got.Instances["team-b"].LastError; e != "" {
		t.Errorf("lastError after clearing is %q, want empty", e)
	}
}

func TestProxyHealthHealthyUnknownInstance(t *testing.T) {
	h := NewProxyHealth(newFakeClock(), nil)
	if h.Healthy("nobody") {
		t.Errorf("Healthy of an untracked instance is true, want false")
	}
	if h.Live("nobody") {
		t.Errorf("Live of an untracked instance is true, want false")
	}
}

func TestProxyHealthServe(t *testing.T) {
	t.Run("bind failure is returned at once", func(t *testing.T) {
		held, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		h := NewProxyHealth(nil, nil)
		// A context that never ends: the call must return on its own.
		if err := h.Serve(t.Context(), held.Addr().String()); err == nil {
			t.Errorf("Serve on a taken address returned nil, want an error")
		}
	})
	t.Run("returns nil when the context ends", func(t *testing.T) {
		h := NewProxyHealth(nil, nil)
		ctx, cancel := context.WithCancel(t.Context())
		served := make(chan error, 1)
		go func() { served <- h.Serve(ctx, "127.0.0.1:0") }()
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve returned %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Serve did not return after the context ended")
		}
	})
}

// TestProxyHealthDownInstanceBodies checks both bodies still show a down instance as down,
// with its reason and pending update, although /livez passes.
func TestProxyHealthDownInstanceBodies(t *testing.T) {
	clock := newFakeClock()
	h := NewProxyHealth(clock, nil)
	h.AddInstance("team-a")
	h.QueuedUpdate("team-a")
	queued := clock.Now()
	h.SetInstanceUp("team-a", false, "panic: boom")
	clock.Step(2 * DefaultHealthTimeout)
	url := serveProxyHealth(t, h)

	for _, tc := range []struct {
		path     string
		wantCode int
		healthy  bool
	}{
		{path: "/healthz", wantCode: http.StatusServiceUnavailable},
		{path: "/livez", wantCode: http.StatusOK, healthy: true},
	} {
		r := get(t, url+tc.path)
		if r.code != tc.wantCode {
			t.Errorf("GET %s: status %d, want %d; body %s", tc.path, r.code, tc.wantCode, r.body)
		}
		want := InstanceHealth{Healthy: tc.healthy, LastQueued: queued}
		if got := decodeHealth(t, r).Instances["team-a"]; !reflect.DeepEqual(got, want) {
			t.Errorf("GET %s: team-a\n got %+v\nwant %+v", tc.path, got, want)
		}
		if strings.Contains(string(r.body), "boom") {
			t.Errorf("GET %s: body holds the down reason: %s", tc.path, r.body)
		}
	}
	var status StatusResponse
	if err := json.Unmarshal(get(t, url+"/status").body, &status); err != nil {
		t.Fatal(err)
	}
	if got := status.Instances["team-a"].DownReason; got != "panic: boom" {
		t.Errorf("/status downReason %q, want the reason", got)
	}
}

// TestProxyHealthStatusOnlyOnLoopback: /status, with its errors and stacks, answers only
// clients on loopback; /healthz and /livez answer everyone, without them.
func TestProxyHealthStatusOnlyOnLoopback(t *testing.T) {
	h := NewProxyHealth(newFakeClock(), nil)
	h.AddInstance("team-a")
	h.SetInstanceError("team-a", errors.New("nft: secret detail"))
	h.SetInstanceUp("team-a", false, "panic: boom\ngoroutine 7 [running]")
	tests := []struct {
		client     string
		wantStatus int
	}{
		{"127.0.0.1:40000", http.StatusOK},
		{"127.3.2.1:40000", http.StatusOK},
		{"[::1]:40000", http.StatusOK},
		{"[::ffff:127.0.0.1]:40000", http.StatusOK},
		{"10.0.0.7:40000", http.StatusForbidden},
		{"192.168.1.10:40000", http.StatusForbidden},
		{"[fd00::7]:40000", http.StatusForbidden},
		{"[::ffff:10.0.0.7]:40000", http.StatusForbidden},
		{"0.0.0.0:40000", http.StatusForbidden},
		{"not-an-address", http.StatusForbidden},
		{"", http.StatusForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.client, func(t *testing.T) {
			get := func(path string) *httptest.ResponseRecorder {
				req := httptest.NewRequest(http.MethodGet, path, nil)
				req.RemoteAddr = tc.client
				// A client may claim anything in headers; only the peer address counts.
				req.Header.Set("X-Forwarded-For", "127.0.0.1")
				req.Header.Set("X-Real-Ip", "127.0.0.1")
				w := httptest.NewRecorder()
				h.Handler().ServeHTTP(w, req)
				return w
			}
			r := get("/status")
			if r.Code != tc.wantStatus {
				t.Fatalf("GET /status from %s: %d, want %d; body %s", tc.client, r.Code, tc.wantStatus, r.Body)
			}
			if tc.wantStatus == http.StatusOK {
				if !strings.Contains(r.Body.String(), "secret detail") || !strings.Contains(r.Body.String(), "goroutine 7") {
					t.Errorf("GET /status from %s: no details in %s", tc.client, r.Body)
				}
			} else if strings.Contains(r.Body.String(), "secret") || strings.Contains(r.Body.String(), "goroutine") {
				t.Errorf("GET /status from %s: refused, but the body holds details: %s", tc.client, r.Body)
			}
			for _, path := range []string{"/healthz", "/livez"} {
				r := get(path)
				if r.Code != http.StatusServiceUnavailable && r.Code != http.StatusOK {
					t.Errorf("GET %s from %s: %d", path, tc.client, r.Code)
				}
				if b := r.Body.String(); strings.Contains(b, "secret") || strings.Contains(b, "goroutine") || !strings.Contains(b, `"team-a"`) {
					t.Errorf("GET %s from %s: %s", path, tc.client, b)
				}
			}
		})
	}
}

// TestIdle: how long an up instance's sync loop has finished no sync, which the
// supervisor restarts a stuck instance on; zero while it is down or not tracked.
func TestIdle(t *testing.T) {
	tests := []struct {
		name  string
		setup func(h *ProxyHealth, clock *testutil.Clock)
		want  time.Duration
	}{
		{"since it was added", func(h *ProxyHealth, clock *testutil.Clock) { clock.Step(time.Minute) }, time.Minute},
		{"since its last sync, failed or not", func(h *ProxyHealth, clock *testutil.Clock) {
			clock.Step(time.Minute)
			h.SyncFinished("team-a")
			clock.Step(time.Second)
		}, time.Second},
		{"since it came back up", func(h *ProxyHealth, clock *testutil.Clock) {
			clock.Step(time.Minute)
			h.SetInstanceUp("team-a", false, "crashed")
			h.SetInstanceUp("team-a", true, "")
			clock.Step(time.Second)
		}, time.Second},
		{"zero while down", func(h *ProxyHealth, clock *testutil.Clock) {
			h.SetInstanceUp("team-a", false, "crashed")
			clock.Step(time.Hour)
		}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			h := NewProxyHealth(clock, nil)
			h.AddInstance("team-a")
			tc.setup(h, clock)
			if got := h.Idle("team-a"); got != tc.want {
				t.Errorf("Idle = %v, want %v", got, tc.want)
			}
			if got := h.Idle("nobody"); got != 0 {
				t.Errorf("Idle of an untracked instance = %v, want 0", got)
			}
		})
	}
}
