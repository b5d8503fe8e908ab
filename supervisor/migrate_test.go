package supervisor

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestMigrateMoveAndRollback drives `shardproxy migrate` against a supervisor: the node
// status reports the shadow once the instance programmed it, the move sets the label only
// then, and a rollback keeps the Service programmed until the shadow goes.
func TestMigrateMoveAndRollback(t *testing.T) {
	f := startSupervisor(t, "")
	ctx := context.Background()
	f.createService("shop", "cart", "legacy", "10.96.0.50")
	f.createService("shop", "web", "legacy", "10.96.0.51")
	teamA := "ip shardproxy-team-a"

	var out bytes.Buffer
	m := &migrate.Mover{Client: f.client, StatusNamespace: "shardproxy-system", Out: &out, BatchSize: 1,
		Timeout: 10 * time.Second, Poll: 20 * time.Millisecond, LegacyTimeout: 10 * time.Second}
	testutil.Eventually(t, waitTimeout, "the node status to be published", func() bool {
		st, err := migrate.ReadStatuses(ctx, f.client, "shardproxy-system")
		return err == nil && len(st) == 1 && st[0].Node == "node-1" && len(st[0].Instances) == 3
	})
	rep, err := m.Move(ctx, migrate.Selection{Namespace: "shop"}, "team-a")
	if err != nil {
		t.Fatalf("move: %v\n%s", err, out.String())
	}
	if rep.Moved != 2 || rep.Batches != 2 {
		t.Errorf("move report %+v, want 2 Services in 2 batches", rep)
	}
	for _, name := range []string{"cart", "web"} {
		svc, err := f.client.CoreV1().Services("shop").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc.Labels[selector.LabelServiceProxyName] != "team-a" || svc.Annotations[selector.AnnotationShadow] != "" {
			t.Errorf("%s after the move: labels %v annotations %v", name, svc.Labels, svc.Annotations)
		}
	}
	if d := f.tables.dump(teamA); !has(d, "10.96.0.50") || !has(d, "10.96.0.51") {
		t.Fatalf("team-a does not serve the moved Services:\n%s", d)
	}
	t.Logf("move:\n%s", out.String())

	out.Reset()
	rep, err = m.Rollback(ctx, migrate.Selection{Names: []string{"shop/cart"}}, "team-a", "")
	if err != nil || rep.Moved != 1 {
		t.Fatalf("rollback: %+v %v", rep, err)
	}
	testutil.Eventually(t, waitTimeout, "team-a to let go of the rolled-back Service", func() bool {
		return !has(f.tables.dump(teamA), "10.96.0.50")
	})
	if !has(f.tables.dump(teamA), "10.96.0.51") {
		t.Error("the rollback touched a Service it did not select")
	}
	svc, err := f.client.CoreV1().Services("shop").Get(ctx, "cart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, labeled := svc.Labels[selector.LabelServiceProxyName]; labeled || svc.Annotations[selector.AnnotationShadow] != "" {
		t.Errorf("after rollback: labels %v annotations %v", svc.Labels, svc.Annotations)
	}
	// The unlabeled Service now belongs to the default instance, as it would to a legacy
	// kube-proxy beside an install without one.
	testutil.Eventually(t, waitTimeout, "the default instance to take the rolled-back Service", func() bool {
		return has(f.tables.dump("ip shardproxy-default"), "10.96.0.50")
	})
}

// TestMigrateMoveTimesOutWithoutTarget: moving to a proxy name no node runs fails at once
// and leaves the Services untouched.
func TestMigrateMoveTimesOutWithoutTarget(t *testing.T) {
	f := startSupervisor(t, "")
	ctx := context.Background()
	f.createService("shop", "cart", "legacy", "10.96.0.50")
	m := &migrate.Mover{Client: f.client, StatusNamespace: "shardproxy-system", Timeout: time.Second, Poll: 20 * time.Millisecond}
	testutil.Eventually(t, waitTimeout, "the node status to be published", func() bool {
		st, err := migrate.ReadStatuses(ctx, f.client, "shardproxy-system")
		return err == nil && len(st) == 1
	})
	if _, err := m.Move(ctx, migrate.Selection{Namespace: "shop"}, "team-z"); err == nil {
		t.Fatal("a move to a proxy no node runs succeeded")
	}
	svc, err := f.client.CoreV1().Services("shop").Get(ctx, "cart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Labels[selector.LabelServiceProxyName] != "legacy" || svc.Annotations[selector.AnnotationShadow] != "" {
		t.Errorf("a failed move left labels %v annotations %v", svc.Labels, svc.Annotations)
	}
}

// TestNodeStatusReportsHandedBack: the node status lists a Service in shadow as handed
// back once the proxy its label names has programmed it on this node: a legacy
// kube-proxy (its rules, sending the cluster IP to endpoints, since the Service has a
// ready one: its "no endpoints" reject alone is kube-proxy before the EndpointSlices
// reach it), or the local instance that owns it.
func TestNodeStatusReportsHandedBack(t *testing.T) {
	var mu sync.Mutex
	rules := map[string]legacy.ServiceRules{}
	setRules := func(svc string, r legacy.ServiceRules) {
		mu.Lock()
		defer mu.Unlock()
		rules[svc] = r
	}
	f := startSupervisorWith(t, fixtureOptions{legacyRules: func(context.Context) (map[string]legacy.ServiceRules, error) {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(rules), nil
	}})
	ctx := context.Background()
	f.createService("shop", "cart", "legacy", "10.96.0.50")
	f.createService("shop", "web", "", "10.96.0.51")
	for _, name := range []string{"cart", "web"} {
		svc, err := f.client.CoreV1().Services("shop").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Annotations = map[string]string{selector.AnnotationShadow: "team-a"}
		if _, err := f.client.CoreV1().Services("shop").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	status := func() migrate.InstanceStatus {
		st, err := migrate.ReadStatuses(ctx, f.client, "shardproxy-system")
		if err != nil || len(st) != 1 {
			return migrate.InstanceStatus{}
		}
		return st[0].Instances["team-a"]
	}
	testutil.Eventually(t, waitTimeout, "both shadows, web handed back to its local owner (default)", func() bool {
		is := status()
		return slices.Equal(is.Shadow, []string{"shop/cart", "shop/web"}) && slices.Equal(is.HandedBack, []string{"shop/web"})
	})
	setRules("shop/cart", legacy.ServiceRules{NoEndpoints: true})
	if is := f.sup.nodeStatus(f.sup.dispatcher).Instances["team-a"]; slices.Contains(is.HandedBack, "shop/cart") {
		t.Fatalf("a legacy reject counted as programmed although the Service has a ready endpoint: %+v", is)
	}
	setRules("shop/cart", legacy.ServiceRules{Endpoints: true})
	testutil.Eventually(t, waitTimeout, "cart handed back to the legacy proxy", func() bool {
		return slices.Equal(status().HandedBack, []string{"shop/cart", "shop/web"})
	})
}

// TestLegacyRulesReadSparingly: while a rollback waits, the node status (polled every
// 500 ms) reads kube-proxy's rules at most once per legacyReadEvery, since
// iptables-save of a large ruleset is costly.
func TestLegacyRulesReadSparingly(t *testing.T) {
	reads := 0
	s := &Supervisor{deps: Deps{LegacyRules: func(context.Context) (map[string]legacy.ServiceRules, error) {
		reads++
		return map[string]legacy.ServiceRules{"shop/cart": {Endpoints: true}}, nil
	}}}
	for range 10 {
		if got := s.readLegacyRules(); !got["shop/cart"].Endpoints {
			t.Fatalf("read %v", got)
		}
	}
	if reads != 1 {
		t.Errorf("10 node statuses in a row read the rules %d times, want 1", reads)
	}
}
