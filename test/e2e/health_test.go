package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestHealthCheckNodePort: a LoadBalancer Service with externalTrafficPolicy Local gets an
// HTTP server on its healthCheckNodePort, reachable from outside like a cloud load
// balancer's probe, answering 200 while the node has a local endpoint and 503 otherwise.
func TestHealthCheckNodePort(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns, name = "health", "local-lb"
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8102}}
	svc, err := e.CreateService(ctx, ns, name, ports, []env.Backend{env.Pod1v4, env.Remotev4},
		env.WithProxyName("team-a"), env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalLocal())
	if err != nil {
		t.Fatal(err)
	}
	hc := int(svc.Spec.HealthCheckNodePort)
	if hc == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort")
	}
	url := fmt.Sprintf("http://%s:%d/", netns.NodeIPv4, hc)
	probe := func(wantCode, wantLocal int) {
		t.Helper()
		var last string
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			code, body, err := e.HTTPGetFrom(ctx, e.TP.Client, url)
			last = fmt.Sprintf("%d %s %v", code, body, err)
			var got struct {
				Service struct {
					Namespace, Name string
				}
				LocalEndpoints      int
				ServiceProxyHealthy bool
			}
			if err == nil && json.Unmarshal([]byte(body), &got) == nil && code == wantCode && got.LocalEndpoints == wantLocal {
				if got.Service.Namespace != ns || got.Service.Name != name || !got.ServiceProxyHealthy {
					t.Fatalf("health check body %s: want service %s/%s and serviceProxyHealthy", body, ns, name)
				}
				t.Logf("GET %s from the client: %d %s", url, code, body)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("GET %s: want %d with %d local endpoints, last: %s", url, wantCode, wantLocal, last)
	}
	probe(http.StatusOK, 1)
	if err := e.SetEndpoints(ctx, ns, name, ports, []env.Backend{env.Remotev4}); err != nil {
		t.Fatal(err)
	}
	probe(http.StatusServiceUnavailable, 0)
	if err := e.SetEndpoints(ctx, ns, name, ports, []env.Backend{env.Pod1v4, env.Pod2v4, env.Remotev4}); err != nil {
		t.Fatal(err)
	}
	probe(http.StatusOK, 2)

	// The Service goes away: so does its server.
	if err := e.DeleteService(ctx, ns, name); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the health-check port to close", func() bool {
		_, _, err := e.HTTPGetFrom(ctx, e.TP.Client, url)
		return err != nil
	})
}

// TestSupervisorEndpoints: /healthz and /livez on the healthz port from anywhere, /status
// only from the node itself (loopback), and the kube-proxy metric names with an instance
// label on /metrics.
func TestSupervisorEndpoints(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8103}}
	if _, err := e.CreateService(ctx, "endpoints", "counted", ports, []env.Backend{env.Pod1v4, env.Pod2v4, env.Remotev4},
		env.WithProxyName("team-b")); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://%s:%d", netns.NodeIPv4, env.HealthzPort)
	for _, path := range []string{"/healthz", "/livez"} {
		code, body, err := e.HTTPGetFrom(ctx, e.TP.Client, base+path)
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET %s: %d %s %v", path, code, body, err)
		}
		var h healthcheck.HealthResponse
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			t.Fatalf("GET %s: %v in %s", path, err, body)
		}
		for _, inst := range []string{"default", "team-a", "team-b"} {
			if st, ok := h.Instances[inst]; !ok || !st.Healthy || !st.Up {
				t.Errorf("GET %s: instance %s is %+v, want healthy and up", path, inst, st)
			}
		}
		if path == "/healthz" && (h.NodeEligible == nil || !*h.NodeEligible) {
			t.Errorf("GET /healthz: nodeEligible %v, want true", h.NodeEligible)
		}
		t.Logf("GET %s: %d, instances %d", path, code, len(h.Instances))
	}

	// /status, with errors and stacks, answers the node itself only.
	code, body, err := e.HTTPGetFrom(ctx, e.TP.Client, base+"/status")
	if err != nil || code != http.StatusForbidden || strings.Contains(body, "instances") {
		t.Errorf("GET /status from the client: %d %q %v, want 403 without the status", code, body, err)
	}
	var status healthcheck.StatusResponse
	testutil.Eventually(t, 20*time.Second, "/status on loopback to count team-b's Service", func() bool {
		code, body, err := e.HTTPGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/status", env.HealthzPort))
		if err != nil || code != http.StatusOK || json.Unmarshal([]byte(body), &status) != nil {
			return false
		}
		return status.Instances["team-b"].Services >= 1 && status.Instances["team-b"].Endpoints >= 3
	})
	t.Logf("/status: team-b %d services, %d endpoints", status.Instances["team-b"].Services, status.Instances["team-b"].Endpoints)

	m, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, inst := range []string{"default", "team-a", "team-b"} {
		if v := m.Value("shardproxy_instance_up", "proxy_instance", inst); v != 1 {
			t.Errorf("shardproxy_instance_up{proxy_instance=%q} = %v, want 1", inst, v)
		}
		if v := m.Value("kubeproxy_sync_proxy_rules_duration_seconds", "proxy_instance", inst); v < 1 {
			t.Errorf("kubeproxy_sync_proxy_rules_duration_seconds{proxy_instance=%q} has %v samples, want syncs", inst, v)
		}
	}
	for _, name := range []string{
		"kubeproxy_sync_full_proxy_rules_duration_seconds", "kubeproxy_sync_partial_proxy_rules_duration_seconds",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_network_programming_duration_seconds",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total", "kubeproxy_sync_proxy_rules_service_changes_total",
		"shardproxy_instance_services", "shardproxy_instance_endpoints",
	} {
		if !m.Has(name) {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if v := m.Value("shardproxy_instance_services", "proxy_instance", "team-b"); v < 1 {
		t.Errorf("shardproxy_instance_services{proxy_instance=team-b} = %v", v)
	}
	// The metrics port is not exposed beyond the node by default configs; here it binds
	// 0.0.0.0 inside the node namespace, reached from the node itself.
}
