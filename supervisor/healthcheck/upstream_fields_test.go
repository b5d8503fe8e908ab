package healthcheck

import (
	"encoding/json"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// upstreamHealthFields are the top-level keys of upstream kube-proxy's /healthz body and
// upstreamFamilyFields those of each entry of its "status", taken from
// kubernetes/kubernetes pkg/proxy/healthcheck/proxy_health.go (types ProxyHealth and
// ProxierHealth) as of commit 81810de635aa, the v1.33+ shape the issue names for v1.36;
// checking the v1.36.3 tag itself is left to an e2e test against the real kube-proxy.
// /livez has the same keys but nodeEligible. status is keyed by IP family ("IPv4",
// "IPv6") and, as upstream, absent before the first sync.
var (
	upstreamHealthFields = []string{"lastUpdated", "currentTime", "nodeEligible", "healthy", "status"}
	upstreamFamilyFields = []string{"lastUpdated", "healthy"}
)

// ourHealthFields are the keys shardproxy adds beside upstream's.
var ourHealthFields = []string{"instances"}

// TestHealthBodiesHaveUpstreamFields decodes /healthz and /livez as a client written for
// upstream kube-proxy would, and fails on any of upstream's keys that is missing or
// renamed, of a wrong JSON type, or on a key that is neither upstream's nor ours.
func TestHealthBodiesHaveUpstreamFields(t *testing.T) {
	clock := newFakeClock()
	h := NewProxyHealth(clock, nil)
	h.AddInstance("team-a")
	h.AddInstance("team-b")
	h.Updated("team-a", corev1.IPv4Protocol, corev1.IPv6Protocol)
	h.Updated("team-b", corev1.IPv4Protocol)
	url := serveProxyHealth(t, h)

	for _, path := range []string{"/healthz", "/livez"} {
		t.Run(path, func(t *testing.T) {
			r := get(t, url+path)
			if r.code != http.StatusOK {
				t.Fatalf("status %d, body %s", r.code, r.body)
			}
			var body map[string]json.RawMessage
			if err := json.Unmarshal(r.body, &body); err != nil {
				t.Fatalf("decoding %s: %v", r.body, err)
			}
			want := slices.Concat(upstreamHealthFields, ourHealthFields)
			if path == "/livez" {
				want = slices.DeleteFunc(want, func(k string) bool { return k == "nodeEligible" })
			}
			checkKeys(t, "body", body, want)
			for _, key := range []string{"lastUpdated", "currentTime"} {
				checkTime(t, key, body[key])
			}
			for _, key := range []string{"healthy", "nodeEligible"} {
				if raw, ok := body[key]; ok {
					checkBool(t, key, raw)
				}
			}
			var status map[string]map[string]json.RawMessage
			if err := json.Unmarshal(body["status"], &status); err != nil {
				t.Fatalf("status is not an object of objects: %s: %v", body["status"], err)
			}
			if got := slices.Sorted(maps.Keys(status)); !slices.Equal(got, []string{"IPv4", "IPv6"}) {
				t.Errorf("status families %v, want [IPv4 IPv6]", got)
			}
			for fam, fields := range status {
				checkKeys(t, "status."+fam, fields, upstreamFamilyFields)
				checkTime(t, "status."+fam+".lastUpdated", fields["lastUpdated"])
				checkBool(t, "status."+fam+".healthy", fields["healthy"])
			}
		})
	}
}

// checkKeys fails t unless obj has exactly the keys want.
func checkKeys[V any](t *testing.T, what string, obj map[string]V, want []string) {
	t.Helper()
	for _, key := range want {
		if _, ok := obj[key]; !ok {
			t.Errorf("%s has no %q (upstream's keys: %v)", what, key, want)
		}
	}
	for key := range obj {
		if !slices.Contains(want, key) {
			t.Errorf("%s has %q, which is not among %v", what, key, want)
		}
	}
}

func checkTime(t *testing.T, what string, raw json.RawMessage) {
	t.Helper()
	var ts time.Time
	if err := json.Unmarshal(raw, &ts); err != nil {
		t.Errorf("%s is not an RFC 3339 time: %s: %v", what, raw, err)
	}
}

func checkBool(t *testing.T, what string, raw json.RawMessage) {
	t.Helper()
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Errorf("%s is not a boolean: %s: %v", what, raw, err)
	}
}

// TestHealthFamiliesAndVerdict: the upstream fields' values over several instances. The
// top-level healthy keeps the node-wide rule (/healthz: some instance healthy; /livez:
// every instance live), nodeEligible stays apart from it, and a family is healthy when
// every instance that programs it is, with the oldest of their syncs.
func TestHealthFamiliesAndVerdict(t *testing.T) {
	const (
		v4 = corev1.IPv4Protocol
		v6 = corev1.IPv6Protocol
	)
	start := newFakeClock().Now()
	at := func(d time.Duration) time.Time { return start.Add(d) }
	tests := []struct {
		name  string
		setup func(h *ProxyHealth, clock *testutil.Clock)
		// For /healthz, then /livez: the status code, healthy, status; lastUpdated is
		// the current time on a 200 and wantLastUpdated otherwise.
		wantCode        [2]int
		wantHealthy     [2]bool
		wantStatus      [2]map[corev1.IPFamily]FamilyHealth
		wantLastUpdated time.Time
		wantEligible    bool
	}{
		{
			name:         "before any sync there is no status",
			setup:        func(h *ProxyHealth, _ *testutil.Clock) { h.AddInstance("team-a") },
			wantCode:     [2]int{200, 200},
			wantHealthy:  [2]bool{true, true},
			wantEligible: true,
		},
		{
			name: "a family is as old as its stalest instance",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.Updated("team-a", v4, v6)
				clock.Step(time.Second)
				h.Updated("team-b", v4)
			},
			wantCode:    [2]int{200, 200},
			wantHealthy: [2]bool{true, true},
			wantStatus: [2]map[corev1.IPFamily]FamilyHealth{
				{v4: {LastUpdated: at(0), Healthy: true}, v6: {LastUpdated: at(0), Healthy: true}},
				{v4: {LastUpdated: at(0), Healthy: true}, v6: {LastUpdated: at(0), Healthy: true}},
			},
			wantEligible: true,
		},
		{
			name: "a stale instance fails its families, neither /healthz nor /livez",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("v4-only")
				h.Updated("team-a", v4, v6)
				h.Updated("v4-only", v4)
				h.QueuedUpdate("v4-only")
				clock.Step(DefaultHealthTimeout)
				h.Updated("team-a", v4, v6)
			},
			wantCode:    [2]int{200, 200},
			wantHealthy: [2]bool{true, true},
			wantStatus: [2]map[corev1.IPFamily]FamilyHealth{
				{v4: {LastUpdated: at(0)}, v6: {LastUpdated: at(DefaultHealthTimeout), Healthy: true}},
				{v4: {LastUpdated: at(0)}, v6: {LastUpdated: at(DefaultHealthTimeout), Healthy: true}},
			},
			wantLastUpdated: at(DefaultHealthTimeout),
			wantEligible:    true,
		},
		{
			name: "no healthy instance fails /healthz; lastUpdated is the newest sync",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.AddInstance("team-b")
				h.Updated("team-a", v4)
				h.QueuedUpdate("team-a")
				clock.Step(time.Second)
				h.Updated("team-b", v4)
				h.QueuedUpdate("team-b")
				clock.Step(DefaultHealthTimeout)
			},
			wantCode:    [2]int{503, 503},
			wantHealthy: [2]bool{false, false},
			wantStatus: [2]map[corev1.IPFamily]FamilyHealth{
				{v4: {LastUpdated: at(0)}},
				{v4: {LastUpdated: at(0)}},
			},
			wantLastUpdated: at(time.Second),
			wantEligible:    true,
		},
		{
			name: "a deleting node fails /healthz with healthy instances",
			setup: func(h *ProxyHealth, clock *testutil.Clock) {
				h.AddInstance("team-a")
				h.Updated("team-a", v4)
				clock.Step(time.Second)
				h.SetNodeDeleting(true)
			},
			wantCode:    [2]int{503, 200},
			wantHealthy: [2]bool{true, true},
			wantStatus: [2]map[corev1.IPFamily]FamilyHealth{
				{v4: {LastUpdated: at(0), Healthy: true}},
				{v4: {LastUpdated: at(0), Healthy: true}},
			},
			wantLastUpdated: at(0),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			h := NewProxyHealth(clock, nil)
			tc.setup(h, clock)
			url := serveProxyHealth(t, h)
			for i, path := range []string{"/healthz", "/livez"} {
				r := get(t, url+path)
				got := decodeHealth(t, r)
				if r.code != tc.wantCode[i] || got.Healthy != tc.wantHealthy[i] {
					t.Errorf("GET %s: status %d, healthy %v; want %d, %v; body %s", path, r.code, got.Healthy, tc.wantCode[i], tc.wantHealthy[i], r.body)
				}
				if !reflect.DeepEqual(got.Status, tc.wantStatus[i]) {
					t.Errorf("GET %s: status\n got %+v\nwant %+v", path, got.Status, tc.wantStatus[i])
				}
				wantLast := tc.wantLastUpdated
				if r.code == http.StatusOK {
					wantLast = clock.Now()
				}
				if !got.LastUpdated.Equal(wantLast) {
					t.Errorf("GET %s: lastUpdated %v, want %v", path, got.LastUpdated, wantLast)
				}
				if path == "/healthz" && (got.NodeEligible == nil || *got.NodeEligible != tc.wantEligible) {
					t.Errorf("GET /healthz: nodeEligible %v, want %v", got.NodeEligible, tc.wantEligible)
				}
			}
		})
	}
}
