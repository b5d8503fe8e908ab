package coexist

import (
	"context"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// testScopedWatch: the supervisor here runs no default instance, so it watches only the
// Services (and their EndpointSlices) labelled for team-a or team-b or shadowed for them
// (supervisor/scope.go). A Service handed between the two instances stays in the watch
// and no connection fails; relabelled to a proxy this node does not run, it leaves the
// watch and every table of the node; labelled back, it returns with its endpoints.
func testScopedWatch(t *testing.T) {
	e, _ := environment(t)
	servers(t, e)
	if log := e.SupervisorLog(); !strings.Contains(log, `"Watches connected"`) ||
		!strings.Contains(log, "service.kubernetes.io/service-proxy-name in (team-a,team-b)") {
		t.Errorf("the supervisor does not log a watch scoped to its proxy names:\n%s", tail(log, 30))
	}
	ip := service(t, e, "scoped", "team-a")
	name := "scoped"
	if mode == modeNFTables {
		name += "-nft"
	}
	reach(t, e, e.TP.Pod2, ip)

	l := startLoad(e, "a Service handed team-a -> team-b -> team-a -> team-b -> team-a in the scoped watch", e.TP.Pod2, ip)
	for _, to := range []string{"team-b", "team-a", "team-b", "team-a"} {
		// Connections before and after each move, not only across it.
		before := l.ok.Load()
		testutil.Eventually(t, waitTimeout, "20 connections", func() bool { return l.ok.Load() >= before+20 })
		relabel(t, e, name, to)
		testutil.Eventually(t, waitTimeout, to+" to own "+ip, func() bool { return tableHolds(e, "shardproxy-"+to, ip) })
	}
	before := l.ok.Load()
	testutil.Eventually(t, waitTimeout, "20 connections", func() bool { return l.ok.Load() >= before+20 })
	if _, failed := l.finish(t); failed != 0 {
		t.Errorf("%d connections failed while the Service moved between instances", failed)
	}

	relabel(t, e, name, "not-on-this-node")
	testutil.Eventually(t, waitTimeout, ip+" to leave every table of the node", func() bool {
		out, err := e.TP.ListRuleset(e.TP.Node)
		return err == nil && !strings.Contains(out, ip+" ")
	})
	relabel(t, e, name, "team-a")
	reach(t, e, e.TP.Pod2, ip) // both endpoints: the slices came back into the watch too
	if !tableHolds(e, "shardproxy-team-a", ip) {
		t.Errorf("%s is back, but not in team-a's table", ip)
	}
	// Leaving the watches, the Service and its slices were each read once (RBAC: get).
	if log := e.SupervisorLog(); strings.Contains(log, "Reading an object that left a watch") {
		t.Errorf("the supervisor could not read an object that left its watches:\n%s", tail(log, 30))
	}
}

func relabel(t *testing.T, e *env.Env, name, proxyName string) {
	t.Helper()
	if err := e.Relabel(context.Background(), "coexist", name, proxyName); err != nil {
		t.Fatal(err)
	}
}

// tableHolds reports whether the node's ip table holds addr.
func tableHolds(e *env.Env, table, addr string) bool {
	out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", table)
	return err == nil && strings.Contains(out, addr+" ")
}
