package coexist

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// teamC is the tenant testLiveConfigRescopes adds beside kube-proxy.
const teamC = `- name: team-c
  proxyNames: [team-c]
  slot: 3
  minSyncPeriod: 100ms
  tenant: {namespaces: [coexist]}
`

// testLiveConfigRescopes: beside kube-proxy the supervisor watches only its proxy
// names' Services. A tenant's instance added to its file on the fly widens the watches
// to the tenant's name and serves its Service; removed, its tables go and the watches
// narrow again; team-a's Service and kube-proxy's serve throughout with no failure.
func testLiveConfigRescopes(t *testing.T) {
	e, _ := environment(t)
	ctx := context.Background()
	servers(t, e)
	original, err := os.ReadFile(e.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cur, _ := os.ReadFile(e.ConfigPath); string(cur) != string(original) {
			if err := e.ApplyConfig(ctx, string(original), waitTimeout); err != nil {
				t.Error(err)
			}
		}
	})
	teamAIP, kubeProxyIP := service(t, e, "live-a", "team-a"), service(t, e, "live-kp", "")
	reach(t, e, e.TP.Pod2, teamAIP)
	reach(t, e, e.TP.Pod2, kubeProxyIP)
	loads := []*load{startLoad(e, "team-a's Service while team-c comes and goes", e.TP.Pod2, teamAIP),
		startLoad(e, "kube-proxy's Service while team-c comes and goes", e.TP.Pod2, kubeProxyIP)}
	tenantIP := service(t, e, "live-c", "team-c")

	start := time.Now()
	if err := e.ApplyConfig(ctx, string(original)+teamC, waitTimeout); err != nil {
		t.Fatal(err)
	}
	reach(t, e, e.TP.Pod2, tenantIP) // both endpoints: its slices came with it
	t.Logf("team-c added: its Service answered %v after the file changed", time.Since(start).Round(time.Millisecond))
	if log := e.SupervisorLog(); !strings.Contains(log, `"Watches rescoped"`) || !strings.Contains(log, "service-proxy-name in (team-a,team-b,team-c)") {
		t.Errorf("the supervisor does not log its watches widened to team-c:\n%s", tail(log, 30))
	}

	if err := e.ApplyConfig(ctx, string(original), waitTimeout); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "team-c's tables deleted and "+tenantIP+" gone from the node", func() bool {
		out, err := e.TP.ListRuleset(e.TP.Node)
		return err == nil && !strings.Contains(out, "shardproxy-team-c") && !strings.Contains(out, tenantIP+" ")
	})
	for _, l := range loads {
		before := l.ok.Load()
		testutil.Eventually(t, waitTimeout, "20 connections after the change", func() bool { return l.ok.Load() >= before+20 })
		if _, failed := l.finish(t); failed != 0 {
			t.Errorf("%d connections failed", failed)
		}
	}
}
