package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
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

// TestKubeProxyInterfaces reads, from the real binary, what tools written for kube-proxy
// read, as they read it: /healthz and /livez with upstream v1.36's keys (and our
// instances beside them), /metrics series with upstream's label sets (ip_family, and our
// proxy_instance beside it), and health-check node ports with upstream's body and header,
// listening where upstream's do: on the Node's primary IPs (the instances'
// nodePortAddresses default), in the Service's IP families only; every other address of
// the node refuses.
func TestKubeProxyInterfaces(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	const ns = "health"
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8104}}
	lb := []env.ServiceSpec{env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalLocal()}
	dual, err := e.CreateService(ctx, ns, "dual-lb", ports, []env.Backend{env.Pod1v4, env.Pod1v6},
		append(lb, env.WithProxyName("team-a"), env.WithDualStack())...)
	if err != nil {
		t.Fatal(err)
	}
	v4, err := e.CreateService(ctx, ns, "v4-lb", ports, []env.Backend{env.Pod1v4}, append(lb, env.WithProxyName("team-b"))...)
	if err != nil {
		t.Fatal(err)
	}
	hostPort := func(ip string, port int32) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }
	for _, c := range []struct {
		svc      *corev1.Service
		answer   []string // node addresses probed from the client
		refuse   []string // probed from the client
		refuseN2 []string // node addresses probed from node2
	}{
		{dual, []string{netns.NodeIPv4, netns.NodeIPv6}, nil, []string{netns.NodeClusterIPv4, netns.NodeClusterIPv6}},
		{v4, []string{netns.NodeIPv4}, []string{netns.NodeIPv6}, []string{netns.NodeClusterIPv4, netns.NodeClusterIPv6}},
	} {
		port := c.svc.Spec.HealthCheckNodePort
		for _, ip := range c.answer {
			addr := hostPort(ip, port)
			var hdr http.Header
			var body map[string]json.RawMessage
			// Weighted as upstream: by the local endpoints, one (a dual-stack pod counts once).
			testutil.Eventually(t, 20*time.Second, c.svc.Name+"'s health check on "+addr+" with its endpoint", func() bool {
				var err error
				hdr, body, err = getJSON(ctx, e, e.TP.Client, "http://"+addr+"/")
				return err == nil && hdr.Get("X-Load-Balancing-Endpoint-Weight") == "1"
			})
			checkJSONKeys(t, c.svc.Name+" health check body", body, "service", "localEndpoints", "serviceProxyHealthy")
			var svc map[string]json.RawMessage
			if err := json.Unmarshal(body["service"], &svc); err != nil {
				t.Errorf("%s: service %s: %v", addr, body["service"], err)
			}
			checkJSONKeys(t, c.svc.Name+" health check service", svc, "namespace", "name")
		}
		for _, probe := range []struct {
			from  string
			addrs []string
		}{{e.TP.Client, c.refuse}, {e.TP.Node2, c.refuseN2}} {
			for _, ip := range probe.addrs {
				_, err := e.TP.Dialer(probe.from)(ctx, "tcp", hostPort(ip, port))
				if !netns.IsRefused(err) {
					t.Errorf("%s's health check on %s (outside its nodePortAddresses or families): %v, want refused", c.svc.Name, hostPort(ip, port), err)
				}
			}
		}
		t.Logf("%s: health check %d answers on %v, refuses on %v", c.svc.Name, port, c.answer, append(c.refuse, c.refuseN2...))
	}

	// /healthz and /livez, from the client, as a load balancer or the kubelet reads them.
	base := fmt.Sprintf("http://%s", hostPort(netns.NodeIPv4, env.HealthzPort))
	for path, keys := range map[string][]string{
		"/healthz": {"lastUpdated", "currentTime", "nodeEligible", "healthy", "status", "instances"},
		"/livez":   {"lastUpdated", "currentTime", "healthy", "status", "instances"},
	} {
		_, body, err := getJSON(ctx, e, e.TP.Client, base+path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		checkJSONKeys(t, path, body, keys...)
		var status map[string]map[string]json.RawMessage
		if err := json.Unmarshal(body["status"], &status); err != nil {
			t.Fatalf("%s status %s: %v", path, body["status"], err)
		}
		for _, fam := range []string{"IPv4", "IPv6"} {
			checkJSONKeys(t, path+" status."+fam, status[fam], "lastUpdated", "healthy")
		}
	}

	// /metrics: upstream's series carry upstream's label sets (ip_family, traffic_policy),
	// with our proxy_instance beside them.
	m, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, labels := range map[string][]string{
		"kubeproxy_sync_proxy_rules_duration_seconds":                {"ip_family", "proxy_instance"},
		"kubeproxy_sync_full_proxy_rules_duration_seconds":           {"ip_family", "proxy_instance"},
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":          {"ip_family", "proxy_instance"},
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":    {"ip_family", "proxy_instance"},
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total":        {"ip_family", "proxy_instance", "traffic_policy"},
		"kubeproxy_sync_proxy_rules_service_changes_total":           {"proxy_instance"},
		"kubeproxy_proxy_healthz_total":                              {"code"},
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds":   {"ip_family", "proxy_instance"},
		"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": {"ip_family", "proxy_instance"},
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":        {"proxy_instance"},
	} {
		fam, ok := m[name]
		if !ok || len(fam.GetMetric()) == 0 {
			t.Errorf("/metrics: no %s", name)
			continue
		}
		for _, met := range fam.GetMetric() {
			var got []string
			for _, lp := range met.GetLabel() {
				got = append(got, lp.GetName())
			}
			slices.Sort(got)
			if want := slices.Sorted(slices.Values(labels)); !slices.Equal(got, want) {
				t.Errorf("/metrics: %s has labels %v, want %v", name, got, want)
				break
			}
		}
	}
	for _, name := range []string{"kubeproxy_proxy_healthz_total", "kubeproxy_proxy_livez_total"} {
		if m.Value(name, "code", "200") < 1 {
			t.Errorf("/metrics: %s{code=200} not counted after our GETs", name)
		}
	}
	fmt.Printf("e2e: kube-proxy interfaces: /healthz /livez keys, /metrics labels, health-check node ports on the primary IPs of the Service's families only\n")
}

// getJSON GETs url from namespace ns and decodes a JSON object body, whatever the status.
func getJSON(ctx context.Context, e *env.Env, ns, url string) (http.Header, map[string]json.RawMessage, error) {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: e.TP.Dialer(ns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var body map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, nil, fmt.Errorf("decoding %s: %w", url, err)
	}
	return resp.Header, body, nil
}

// checkJSONKeys fails on a missing key and on one that is not listed.
func checkJSONKeys(t *testing.T, what string, body map[string]json.RawMessage, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := body[k]; !ok {
			t.Errorf("%s: no key %q in %v", what, k, slices.Collect(maps.Keys(body)))
		}
	}
	for k := range body {
		if !slices.Contains(keys, k) {
			t.Errorf("%s: unexpected key %q", what, k)
		}
	}
}
