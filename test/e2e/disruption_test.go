package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// tableHas reports whether instance's ip table holds addr (as a map or set element).
func tableHas(e *env.Env, instance, addr string) bool {
	out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", "shardproxy-"+instance)
	return err == nil && strings.Contains(out, addr+" ")
}

// tableExists reports whether the table family/shardproxy-instance exists in the node.
func tableExists(e *env.Env, family, instance string) bool {
	_, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", family, "shardproxy-"+instance)
	return err == nil
}

// TestHandover relabels a Service between instances while clients open connections to it
// in a tight loop, from a pod to its ClusterIP and from outside to its NodePort. The new
// owner programs it before the old one lets go, so no connection fails.
func TestHandover(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	servers(t, e, 8105, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8105}}
	svc, err := e.CreateService(ctx, "handover", "moving", ports, []env.Backend{env.Pod1v4, env.Remotev4},
		env.WithProxyName("team-a"), env.WithType(corev1.ServiceTypeNodePort))
	if err != nil {
		t.Fatal(err)
	}
	ip, np := svc.Spec.ClusterIP, int(svc.Spec.Ports[0].NodePort)
	reach(t, e, e.TP.Pod2, "tcp", ip, 80, "pod1", "remote")
	reach(t, e, e.TP.Client, "tcp", netns.NodeIPv4, np, "pod1", "remote")

	podLoop := e.StartLoop(e.TP.Pod2, "tcp", ip, 80)
	extLoop := e.StartLoop(e.TP.Client, "tcp", netns.NodeIPv4, np)
	moves := []struct{ label, owner string }{
		{"team-b", "team-b"}, {"", "default"}, {"team-a", "team-a"}, {"team-b", "team-b"},
	}
	prev := "team-a"
	for _, mv := range moves {
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		if err := e.Relabel(ctx, "handover", "moving", mv.label); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 40*time.Second, fmt.Sprintf("%s to own %s and %s to let go", mv.owner, ip, prev), func() bool {
			return tableHas(e, mv.owner, ip) && !tableHas(e, prev, ip)
		})
		t.Logf("moved %s -> %s in %v", prev, mv.owner, time.Since(start).Round(time.Millisecond))
		prev = mv.owner
	}
	time.Sleep(500 * time.Millisecond)
	pod, ext := podLoop.Stop(), extLoop.Stop()
	fmt.Printf("e2e: handover (4 relabels team-a -> team-b -> default -> team-a -> team-b): pod->ClusterIP %v; client->NodePort %v\n", pod, ext)
	for what, r := range map[string]env.LoopResult{"pod -> ClusterIP": pod, "client -> NodePort": ext} {
		if r.Failed != 0 || r.OK == 0 {
			t.Errorf("%s during handover: %v; first failures: %v", what, r, r.Errors)
		}
	}
	m, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := m.Value("shardproxy_handovers_total", "from", "team-a", "to", "team-b"); v < 1 {
		t.Errorf("shardproxy_handovers_total{from=team-a,to=team-b} = %v", v)
	}
}

// TestRestart kills the supervisor (SIGKILL, then SIGTERM) and starts it again while
// clients open connections: the rules stay in the kernel while no supervisor runs, and the
// new one takes the tables over in one transaction.
func TestRestart(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	servers(t, e, 8106, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8106}}
	var loops []*env.Loop
	var names []string
	for _, inst := range []string{"team-a", "default"} {
		var edits []env.ServiceSpec
		if inst != "default" {
			edits = append(edits, env.WithProxyName(inst))
		}
		svc, err := e.CreateService(ctx, "restart", "web-"+inst, ports, []env.Backend{env.Pod1v4, env.Remotev4}, edits...)
		if err != nil {
			t.Fatal(err)
		}
		reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1", "remote")
		loops = append(loops, e.StartLoop(e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80))
		names = append(names, inst)
	}
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		time.Sleep(500 * time.Millisecond)
		if err := e.StopSupervisor(sig); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // traffic with no supervisor at all
		start := time.Now()
		if err := e.StartSupervisor(); err != nil {
			t.Fatal(err)
		}
		if err := e.WaitHealthy(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		t.Logf("%v: back to healthy %v after the start", sig, time.Since(start).Round(time.Millisecond))
	}
	time.Sleep(500 * time.Millisecond)
	for i, l := range loops {
		r := l.Stop()
		fmt.Printf("e2e: restart (kill -9, then SIGTERM, each with 1s down): %s's Service: %v\n", names[i], r)
		if r.Failed != 0 || r.OK == 0 {
			t.Errorf("%s's Service across restarts: %v; first failures: %v", names[i], r, r.Errors)
		}
	}
	// The restarted supervisor programs new Services.
	svc, err := e.CreateService(ctx, "restart", "after", ports, []env.Backend{env.Pod2v4}, env.WithProxyName("team-b"))
	if err != nil {
		t.Fatal(err)
	}
	reach(t, e, e.TP.Pod1, "tcp", svc.Spec.ClusterIP, 80, "pod2")
}

// TestTableDeletedFromOutside deletes team-a's table behind the supervisor's back: team-a
// rebuilds it within seconds, and the other instances neither resync nor fail.
func TestTableDeletedFromOutside(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	servers(t, e, 8107, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8107}}
	victim, err := e.CreateService(ctx, "tabledel", "victim", ports, []env.Backend{env.Pod1v4}, env.WithProxyName("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	bystander, err := e.CreateService(ctx, "tabledel", "bystander", ports, []env.Backend{env.Pod1v4}, env.WithProxyName("team-b"))
	if err != nil {
		t.Fatal(err)
	}
	reach(t, e, e.TP.Pod2, "tcp", victim.Spec.ClusterIP, 80, "pod1")
	reach(t, e, e.TP.Pod2, "tcp", bystander.Spec.ClusterIP, 80, "pod1")
	// Every pending sync finishes before the baseline, so that none is counted as caused
	// by the deletion.
	testutil.Eventually(t, 20*time.Second, "every instance to have applied every queued update", func() bool { return e.Idle(ctx) })
	before, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	loop := e.StartLoop(e.TP.Pod2, "tcp", bystander.Spec.ClusterIP, 80)

	start := time.Now()
	if _, err := e.TP.Exec(e.TP.Node, "nft", "delete", "table", "ip", "shardproxy-team-a"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "team-a's table to come back", func() bool {
		return tableHas(e, "team-a", victim.Spec.ClusterIP)
	})
	recovered := time.Since(start)
	reach(t, e, e.TP.Pod2, "tcp", victim.Spec.ClusterIP, 80, "pod1")
	served := time.Since(start)
	time.Sleep(300 * time.Millisecond)
	r := loop.Stop()
	after, err := e.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("e2e: table deleted from outside: team-a's table back in %v, its Service served again after %v; team-b's Service meanwhile: %v\n",
		recovered.Round(time.Millisecond), served.Round(time.Millisecond), r)
	if recovered > 5*time.Second {
		t.Errorf("team-a's table took %v to come back, want within seconds", recovered)
	}
	if r.Failed != 0 {
		t.Errorf("team-b's Service failed while team-a's table was gone: %v %v", r, r.Errors)
	}
	for _, inst := range []string{"default", "team-b"} {
		for _, name := range []string{
			"kubeproxy_sync_full_proxy_rules_duration_seconds",
			"kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
			"shardproxy_instance_restarts_total",
		} {
			if b, a := before.Value(name, "proxy_instance", inst), after.Value(name, "proxy_instance", inst); a != b {
				t.Errorf("%s{proxy_instance=%q} went from %v to %v: another instance was disturbed", name, inst, b, a)
			}
		}
	}
	if b, a := before.Value("kubeproxy_sync_full_proxy_rules_duration_seconds", "proxy_instance", "team-a"),
		after.Value("kubeproxy_sync_full_proxy_rules_duration_seconds", "proxy_instance", "team-a"); a <= b {
		t.Errorf("team-a did no full sync (%v -> %v) to rebuild its table", b, a)
	}
}

// TestCleanupInstance: with the supervisor stopped (SIGTERM leaves the rules in place and
// traffic keeps flowing), `shardproxy cleanup --instance team-a` deletes team-a's two
// tables and nothing else; the next start rebuilds them.
func TestCleanupInstance(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	servers(t, e, 8108, "tcp")
	ports := []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8108}}
	svc, err := e.CreateService(ctx, "cleanup", "web", ports, []env.Backend{env.Pod1v4}, env.WithProxyName("team-b"))
	if err != nil {
		t.Fatal(err)
	}
	reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1")
	// A table of someone else's, which no cleanup may touch.
	if err := e.TP.NFT(e.TP.Node, "add table inet not-ours\nadd chain inet not-ours c"); err != nil {
		t.Fatal(err)
	}
	defer e.TP.Exec(e.TP.Node, "nft", "delete", "table", "inet", "not-ours")

	if err := e.StopSupervisor(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if restarted {
			return
		}
		if err := e.StartSupervisor(); err != nil {
			t.Error(err)
		}
		if err := e.WaitHealthy(ctx, time.Minute); err != nil {
			t.Error(err)
		}
	}()
	for _, inst := range []string{"default", "team-a", "team-b"} {
		for _, fam := range []string{"ip", "ip6"} {
			if !tableExists(e, fam, inst) {
				t.Fatalf("after SIGTERM %s %s's table is gone; it must stay", fam, inst)
			}
		}
	}
	reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1")

	out, err := e.CLI("cleanup", "--config", e.ConfigPath, "--instance", "team-a")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("shardproxy cleanup --instance team-a: %s", strings.TrimSpace(out))
	for _, inst := range []string{"default", "team-a", "team-b"} {
		for _, fam := range []string{"ip", "ip6"} {
			if got, want := tableExists(e, fam, inst), inst != "team-a"; got != want {
				t.Errorf("after cleanup --instance team-a: %s table of %s exists=%v, want %v", fam, inst, got, want)
			}
		}
	}
	if _, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "inet", "not-ours"); err != nil {
		t.Errorf("cleanup touched a table that is not ours: %v", err)
	}
	reach(t, e, e.TP.Pod2, "tcp", svc.Spec.ClusterIP, 80, "pod1")

	restarted = true
	if err := e.StartSupervisor(); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "team-a's tables to be rebuilt", func() bool {
		return tableExists(e, "ip", "team-a") && tableExists(e, "ip6", "team-a")
	})
}
