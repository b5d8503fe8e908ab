package supervisor

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestServerRetriesAHeldPort: the metrics address is held by another process (kube-proxy
// during a switch) when the supervisor starts. The supervisor keeps trying with backoff;
// meanwhile /status names the problem, /readyz (the pod's readiness probe) fails while
// /healthz (load balancers) does not, and the Node gets one Warning event. Once the port
// is free the supervisor serves its metrics there and /readyz passes.
func TestServerRetriesAHeldPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	f := startSupervisorWith(t, fixtureOptions{metricsBindAddress: addr})

	testutil.Eventually(t, waitTimeout, "/status reports the held metrics port", func() bool {
		st := get(t, f.sup, "/status")
		return strings.Contains(st, `"metrics":"listening on `+addr) && strings.Contains(st, "address already in use")
	})
	if code, body := probe(f.sup, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"notListening":["metrics"]`) {
		t.Errorf("/readyz while the port is held: %d %s, want 503 naming metrics", code, body)
	}
	if code, _ := probe(f.sup, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while the metrics port is held: %d, want 200 (load balancers must not drain the node for it)", code)
	}
	testutil.Eventually(t, waitTimeout, "a Node event", func() bool {
		return strings.Contains(f.rec.all(), "node Warning FailedToStartMetricServer: metrics server: listening on "+addr)
	})

	held.Close()
	testutil.Eventually(t, waitTimeout, "the supervisor serves metrics on the freed port", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), "shardproxy_build_info")
	})
	if code, body := probe(f.sup, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once listening: %d %s", code, body)
	}
	if st := get(t, f.sup, "/status"); strings.Contains(st, "listenErrors") {
		t.Errorf("/status still lists listen errors: %s", st)
	}
	if n := strings.Count(f.rec.all(), "FailedToStartMetricServer"); n != 1 {
		t.Errorf("%d FailedToStartMetricServer events, want one for the episode", n)
	}
}

// probe runs a GET of path against the health handler, from loopback.
func probe(s *Supervisor, path string) (int, string) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = "127.0.0.1:40000"
	s.countedHealth().ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}
