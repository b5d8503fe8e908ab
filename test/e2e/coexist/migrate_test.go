package coexist

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// testMigrateMoveAndRollback moves Services from the real kube-proxy to team-a with
// `shardproxy migrate move` and back with `migrate rollback`, each Service under a client
// loop, and counts the failed connections (target 0). The move waits for the node status
// to confirm team-a programmed them in shadow before the label changes; the rollback has
// team-a step back to a shadow first (freeing the health-check node port, which kube-proxy
// only tries to bind when it syncs), and keeps team-a's copy until kube-proxy has its
// rules again.
func testMigrateMoveAndRollback(t *testing.T) {
	e, kp := environment(t)
	ctx := context.Background()
	servers(t, e)
	names := []string{"mig-1", "mig-2", "mig-3"}
	ips := map[string]string{}
	var args []string
	for _, n := range names {
		ips[n] = service(t, e, n, "")
		reach(t, e, e.TP.Pod2, ips[n])
		args = append(args, "coexist/"+passName(n))
	}
	// A LoadBalancer Service with Local policy: its health-check node port moves too.
	lbName := passName("mig-lb")
	lb, err := e.CreateService(ctx, "coexist", lbName, tcp80, []env.Backend{env.Pod1v4, env.Remotev4},
		env.WithType(corev1.ServiceTypeLoadBalancer), env.WithExternalLocal())
	if err != nil {
		t.Fatal(err)
	}
	names = append(names, lbName)
	ips[lbName] = lb.Spec.ClusterIP
	args = append(args, "coexist/"+lbName)
	reach(t, e, e.TP.Pod2, lb.Spec.ClusterIP)
	hcPort := int(lb.Spec.HealthCheckNodePort)
	testutil.Eventually(t, waitTimeout, "kube-proxy to serve the health-check node port", func() bool { return hcHolder(e, hcPort) == "kube-proxy" })
	kc := e.CP.Kubeconfig
	migrate := func(sub string, flags ...string) string {
		t.Helper()
		began := time.Now()
		out, err := e.CLI(append(append([]string{"migrate", sub, "--kubeconfig", kc}, flags...), args...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		// Wall-clock times, to line the phases up with the daemons' logs.
		t.Logf("shardproxy migrate %s (%s to %s):\n%s", sub, began.Format("15:04:05.000"), time.Now().Format("15:04:05.000"), out)
		return out
	}

	plan := migrate("plan")
	for _, arg := range args {
		if !strings.Contains(plan, arg) || !strings.Contains(plan, "legacy (unlabeled)") {
			t.Errorf("plan does not list %s as served by the legacy proxy:\n%s", arg, plan)
		}
	}

	var loads []*load
	for _, n := range names {
		loads = append(loads, startLoad(e, "pod2 -> "+n, e.TP.Pod2, ips[n]))
	}
	finished := false
	t.Cleanup(func() {
		if !finished { // stopped early (t.Fatal): still stop the loops and report them
			for _, l := range loads {
				l.finish(t)
			}
		}
	})
	var all []string
	for _, ip := range ips {
		all = append(all, ip)
	}
	capt := startCapture(t, e, all)
	time.Sleep(time.Second)

	start := time.Now()
	migrate("move", "--to", "team-a", "--batch-size", "2")
	moved := time.Since(start)
	for _, arg := range args {
		svc, err := e.Client.CoreV1().Services("coexist").Get(ctx, strings.TrimPrefix(arg, "coexist/"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc.Labels[selector.LabelServiceProxyName] != "team-a" || svc.Annotations[selector.AnnotationShadow] != "" {
			t.Errorf("%s after the move: labels %v, annotations %v", arg, svc.Labels, svc.Annotations)
		}
	}
	testutil.Eventually(t, waitTimeout, "kube-proxy to let go and team-a to own them", func() bool {
		rules := strings.Join(kubeProxyRules(t, e), "\n")
		for _, ip := range ips {
			if strings.Contains(rules, ip) || !teamAHas(e, ip) {
				return false
			}
		}
		return true
	})
	testutil.Eventually(t, waitTimeout, "shardproxy to take over the health-check node port", func() bool { return hcHolder(e, hcPort) == "shardproxy" })
	time.Sleep(time.Second)

	start = time.Now()
	rollback := migrate("rollback", "--from", "team-a", "--legacy-timeout", "2m")
	rolledBack := time.Since(start)
	if !strings.Contains(rollback, "team-a stepped back to a shadow on 1 node(s) (node-1)") {
		t.Errorf("the rollback handed the Services back without the node confirming team-a stepped back:\n%s", rollback)
	}
	// The shadow went on the node's evidence (kube-proxy's rules), not after a fixed grace.
	if !strings.Contains(rollback, "programmed by it on 1 node(s) (node-1)") {
		t.Errorf("the rollback removed the shadow without the node confirming kube-proxy programmed the Services:\n%s", rollback)
	}
	testutil.Eventually(t, waitTimeout, "kube-proxy to serve them again and team-a to let go", func() bool {
		rules := strings.Join(kubeProxyRules(t, e), "\n")
		for _, ip := range ips {
			if !strings.Contains(rules, ip) || teamAHas(e, ip) {
				return false
			}
		}
		return true
	})
	testutil.Eventually(t, waitTimeout, "kube-proxy to take the health-check node port back", func() bool { return hcHolder(e, hcPort) == "kube-proxy" })
	// kube-proxy binds a health-check node port only when it syncs: had team-a still held
	// it, kube-proxy would have failed once and waited for a later sync (up to its 30s
	// sync period) to try again.
	for _, line := range strings.Split(kp.Log(), "\n") {
		if strings.Contains(line, "Failed to start healthcheck") && strings.Contains(line, "coexist/"+lbName) {
			t.Errorf("kube-proxy found the health-check node port taken: %s", line)
		}
	}
	time.Sleep(time.Second)

	finished = true
	var total, failed int64
	for _, l := range loads {
		ok, f := l.finish(t)
		total += ok + f
		failed += f
		if f != 0 {
			t.Errorf("%s: %d connections failed during the migration", l.name, f)
		}
	}
	capt.stop(t, failed > 0)
	if failed > 0 {
		t.Logf("rules that rejected or dropped packets:\n%s", rejectCounters(e))
	}
	drops := "" // nftables mode has no INVALID-drop rule
	if mode == modeIPTables {
		drops = fmt.Sprintf("; kube-proxy's INVALID-drop rule dropped %d packets", invalidDrops(e))
	}
	fmt.Printf("e2e: migrate beside kube-proxy in %s mode: move of %d Services (batches of 2, one LoadBalancer whose health-check node port moved with it) took %v, rollback %v; client loops: %d connections, %d failed%s\n",
		mode, len(names), moved.Round(time.Millisecond), rolledBack.Round(time.Millisecond), total, failed, drops)
}

// hcHolder names the process listening on a TCP port in the node namespace.
func hcHolder(e *env.Env, port int) string {
	out, err := e.TP.Exec(e.TP.Node, "ss", "-Hltnp", fmt.Sprintf("sport = :%d", port))
	if err != nil {
		return ""
	}
	for _, name := range []string{"kube-proxy", "shardproxy"} {
		if strings.Contains(out, `(("`+name) { // comm, truncated to 15 bytes: "kube-proxy-v1.3"
			return name
		}
	}
	return ""
}

func teamAHas(e *env.Env, ip string) bool {
	out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", "shardproxy-team-a")
	return err == nil && strings.Contains(out, ip+" . tcp . 80")
}
