package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// teamCInstance is the tenant TestLiveConfig adds, changes and removes.
const teamCInstance = `
- name: team-c
  proxyNames: [team-c]
  slot: 3
  minSyncPeriod: 100ms
  tenant:
    namespaces: [liveconfig-c]
`

// writeConfigAndWait applies a changed configuration file, failing the test if the
// supervisor does not.
func writeConfigAndWait(t *testing.T, e *env.Env, content string) {
	t.Helper()
	if err := e.ApplyConfig(context.Background(), content, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestLiveConfig adds a tenant's instance to the running supervisor by editing its
// configuration file, changes it (restarted alone), and removes it (its tables go),
// while clients connect in tight loops to a Service of every other instance and to the
// changed tenant's: none of the untouched tenants' connections fails, nor the changed
// tenant's across its restart.
func TestLiveConfig(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	servers(t, e, 8111, "tcp")
	original, err := os.ReadFile(e.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cur, _ := os.ReadFile(e.ConfigPath); string(cur) != string(original) {
			writeConfigAndWait(t, e, string(original))
		}
	})
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8111}}
	var loops []*env.Loop
	var owners []string
	for _, s := range []struct{ ns, proxyName string }{{"liveconfig", ""}, {"team-a", "team-a"}, {"team-b", "team-b"}} {
		var edits []env.ServiceSpec
		owner := "default"
		if s.proxyName != "" {
			edits, owner = append(edits, env.WithProxyName(s.proxyName)), s.proxyName
		}
		svc, err := e.CreateService(ctx, s.ns, "live-"+owner, ports, []env.Backend{env.Pod1v4, env.Remotev4}, edits...)
		if err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1", "remote")
		loops, owners = append(loops, e.StartLoop(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80)), append(owners, owner)
	}
	tenant, err := e.CreateService(ctx, "liveconfig-c", "web", ports, []env.Backend{env.Pod1v4, env.Remotev4}, env.WithProxyName("team-c"))
	if err != nil {
		t.Fatal(err)
	}
	tenantIP := tenant.Spec.ClusterIP

	// Add team-c: it starts and serves the Service labelled for it.
	start := time.Now()
	writeConfigAndWait(t, e, string(original)+strings.TrimPrefix(teamCInstance, "\n"))
	reach(t, e, e.TP.Pod2, "tcp", tenantIP, 80, "pod1", "remote")
	t.Logf("added team-c: its Service answered %v after the file changed", time.Since(start).Round(time.Millisecond))
	tenantLoop := e.StartLoop(e.TP.Pod2, "tcp", tenantIP, 80)

	// Change team-c (another minSyncPeriod): restarted alone, its rules stay meanwhile.
	time.Sleep(500 * time.Millisecond) // traffic before the change
	fullSyncs := func() float64 {
		m, err := e.Metrics(ctx)
		if err != nil {
			return -1
		}
		return m.Value("kubeproxy_sync_full_proxy_rules_duration_seconds", "proxy_instance", "team-c", "ip_family", "IPv4")
	}
	before := fullSyncs()
	changed := strings.Replace(teamCInstance, "minSyncPeriod: 100ms", "minSyncPeriod: 200ms", 1)
	writeConfigAndWait(t, e, string(original)+strings.TrimPrefix(changed, "\n"))
	testutil.Eventually(t, 30*time.Second, "the restarted team-c's first full sync", func() bool { return fullSyncs() > before })
	time.Sleep(500 * time.Millisecond) // traffic after it
	r := tenantLoop.Stop()
	fmt.Printf("e2e: live config: team-c's Service across its restart by a changed file: %v\n", r)
	if r.Failed != 0 || r.OK == 0 {
		t.Errorf("team-c's Service across its restart: %v; first failures: %v", r, r.Errors)
	}

	// Remove team-c: its tables go, its Service is no longer served here.
	writeConfigAndWait(t, e, string(original))
	testutil.Eventually(t, 30*time.Second, "team-c's tables deleted", func() bool {
		return !tableExists(e, "ip", "team-c") && !tableExists(e, "ip6", "team-c")
	})
	if _, err := e.TP.Dial(e.TP.Pod2, "tcp", tenantIP, 80); err == nil {
		t.Errorf("team-c's Service still answers after team-c was removed")
	}
	time.Sleep(500 * time.Millisecond)
	for i, l := range loops {
		r := l.Stop()
		fmt.Printf("e2e: live config: %s's Service while team-c was added, restarted and removed: %v\n", owners[i], r)
		if r.Failed != 0 || r.OK == 0 {
			t.Errorf("%s's Service during the live changes: %v; first failures: %v", owners[i], r, r.Errors)
		}
	}
	m, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := m.Value("shardproxy_config_reloads_total", "result", "applied"); v < 3 {
		t.Errorf("shardproxy_config_reloads_total{result=applied} = %v, want at least 3", v)
	}
	if m.Value("shardproxy_instance_up", "proxy_instance", "team-c") != 0 {
		t.Errorf("team-c's series outlive it")
	}
}
