package coexist

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
)

// testLegacyCleanupAfterRealKubeProxy (last in TestCoexist: it stops kube-proxy for good) runs
// `shardproxy cleanup --legacy iptables` in the node namespace against the rules the
// real kube-proxy wrote: refused while kube-proxy runs, naming its pid; once it is
// stopped, every kube-proxy chain goes while shardproxy's tables and traffic are
// untouched; the unlabeled Service then moves to team-a by relabeling.
func testLegacyCleanupAfterRealKubeProxy(t *testing.T) {
	e, kp := environment(t)
	ctx := context.Background()
	servers(t, e)
	plain := service(t, e, "plain-legacy", "")
	webA := service(t, e, "web-a-legacy", "team-a")
	reach(t, e, e.TP.Pod2, plain)
	reach(t, e, e.TP.Pod2, webA)
	cli := func(args ...string) (string, error) {
		return e.TP.Exec(e.TP.Node, append([]string{e.Binary, "cleanup"}, args...)...)
	}

	out, err := cli("--legacy", "iptables")
	want := fmt.Sprintf("kube-proxy is still running on this node: pid %d (", kp.Pid())
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("cleanup with kube-proxy running: err %v, output:\n%s\nwant a refusal with %q", err, out, want)
	}
	t.Logf("refused: %s", strings.TrimSpace(out))
	out, err = cli("--legacy", "iptables", "--dry-run", "--force", "--kube-proxy-metrics-address", fmt.Sprintf("127.0.0.1:%d", env.KubeProxyMetricsPort))
	if err != nil || !strings.Contains(out, "a kube-proxy in iptables mode answers on 127.0.0.1:10259") || !strings.Contains(out, "would remove") {
		t.Errorf("dry run with the metrics probe: err %v, output:\n%s", err, out)
	}

	if err := kp.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// kube-proxy leaves its rules in place when it exits.
	reach(t, e, e.TP.Pod2, plain)
	before := tableState(t, e)
	ours := startLoad(e, "team-a Service during the legacy cleanup", e.TP.Pod2, webA)
	time.Sleep(300 * time.Millisecond)
	// No --force: shardproxy's own metrics server on 127.0.0.1:10249 must not pass for a
	// kube-proxy.
	out, err = cli("--legacy", "iptables")
	time.Sleep(500 * time.Millisecond)
	if _, failed := ours.finish(t); failed != 0 {
		t.Errorf("%d connections to team-a's Service failed during the legacy cleanup", failed)
	}
	if err != nil {
		t.Fatalf("cleanup after kube-proxy stopped: %v", err)
	}
	t.Logf("cleanup --legacy iptables:\n%s", out)

	for _, line := range iptablesSave(t, e) {
		f := strings.Fields(line)
		table, rest := f[1], strings.Join(f[2:], " ")
		for _, word := range strings.Fields(rest) {
			if legacy.Owned(table, strings.TrimPrefix(word, ":")) {
				t.Errorf("left behind: %s", line)
				break
			}
		}
	}
	after := tableState(t, e)
	for _, tbl := range ourTables {
		if counterless(before[tbl]) != counterless(after[tbl]) {
			t.Errorf("%s changed in the legacy cleanup:\nbefore:\n%s\nafter:\n%s", tbl, before[tbl], after[tbl])
		}
	}
	reach(t, e, e.TP.Pod2, webA)
	if r, err := e.TP.DialWith(e.TP.Pod2, "tcp", plain, 80, netns.DialOptions{Timeout: time.Second}); err == nil {
		t.Errorf("the unlabeled Service is still served (by %s) with kube-proxy and its rules gone", r.Server)
	}

	// The migration's last step: the Service moves to an instance.
	if err := e.Relabel(ctx, "coexist", "plain-legacy", "team-a"); err != nil {
		t.Fatal(err)
	}
	reach(t, e, e.TP.Pod2, plain)
}
