package supervisor

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
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

// TestAutoscalerTaintDrainsTheNode: the cluster autoscaler taints a Node
// ToBeDeletedByClusterAutoscaler before it removes it. As upstream's, /healthz then
// answers 503 with nodeEligible false, so load balancers drain the node, while /livez
// stays 200 (nothing for the kubelet to restart); the taint removed (the scale-down
// cancelled), the node is eligible again.
func TestAutoscalerTaintDrainsTheNode(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{})
	ctx := context.Background()
	setTaints := func(taints []corev1.Taint) {
		t.Helper()
		node, err := f.client.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Spec.Taints = taints
		if _, err := f.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, waitTimeout, "/healthz 200 before the taint", func() bool {
		code, _ := probe(f.sup, "/healthz")
		return code == http.StatusOK
	})

	// Another taint does not make the node ineligible.
	setTaints([]corev1.Taint{{Key: "DeletionCandidateOfClusterAutoscaler", Effect: corev1.TaintEffectPreferNoSchedule}})
	setTaints([]corev1.Taint{
		{Key: "DeletionCandidateOfClusterAutoscaler", Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: healthcheck.ToBeDeletedTaint, Value: "1764400000", Effect: corev1.TaintEffectNoSchedule},
	})
	testutil.Eventually(t, waitTimeout, "/healthz 503 with the autoscaler's taint", func() bool {
		code, body := probe(f.sup, "/healthz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"nodeEligible":false`)
	})
	if code, body := probe(f.sup, "/livez"); code != http.StatusOK {
		t.Errorf("/livez with the autoscaler's taint: %d %s, want 200", code, body)
	}
	if st := get(t, f.sup, "/status"); !strings.Contains(st, `"nodeToBeDeleted":true`) {
		t.Errorf("/status does not say the node is to be deleted: %s", st)
	}

	setTaints(nil)
	testutil.Eventually(t, waitTimeout, "/healthz 200 once the taint is gone", func() bool {
		code, body := probe(f.sup, "/healthz")
		return code == http.StatusOK && strings.Contains(body, `"nodeEligible":true`)
	})
}
