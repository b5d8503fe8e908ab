package coexist

import (
	"context"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testEachProxyServesItsOwnServices: kube-proxy (in either mode) serves the unlabeled
// Service, team-a and team-b the Services labeled for them, from a pod and from the node
// itself, and each proxy's rules hold only its own Services.
func testEachProxyServesItsOwnServices(t *testing.T) {
	e, _ := environment(t)
	servers(t, e)
	plain := service(t, e, "plain", "")
	webA := service(t, e, "web-a", "team-a")
	webB := service(t, e, "web-b", "team-b")
	for _, ip := range []string{plain, webA, webB} {
		reach(t, e, e.TP.Pod2, ip)
		reach(t, e, e.TP.Node, ip)
	}

	save := strings.Join(kubeProxyRules(t, e), "\n")
	programmed := regexp.MustCompile(`(?m)-A KUBE-SERVICES -d ` + regexp.QuoteMeta(plain) + `/32 .*coexist/plain:http.* -j KUBE-SVC-`)
	if mode == modeNFTables { // an element of its service-ips verdict map
		programmed = regexp.MustCompile(regexp.QuoteMeta(plain + " . tcp . 80 : goto service-"))
	}
	if !programmed.MatchString(save) {
		t.Errorf("kube-proxy (%s) has not programmed coexist/plain (%s):\n%s", mode, plain, save)
	}
	for _, ip := range []string{webA, webB} {
		if strings.Contains(save, ip) {
			t.Errorf("kube-proxy programs labeled Service %s", ip)
		}
	}
	for inst, ip := range map[string]string{"team-a": webA, "team-b": webB} {
		table, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", "shardproxy-"+inst)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(table, ip+" . tcp . 80") {
			t.Errorf("%s does not program its Service %s", inst, ip)
		}
		if strings.Contains(table, plain+" ") {
			t.Errorf("%s programs kube-proxy's unlabeled Service %s", inst, plain)
		}
	}
	got := tables(t, e)
	kubeProxyTables := []string{"ip nat", "ip filter", "ip6 nat", "ip6 filter"} // iptables-nft's
	if mode == modeNFTables {
		kubeProxyTables = []string{"ip kube-proxy", "ip6 kube-proxy"}
	}
	for _, want := range append(ourTables, kubeProxyTables...) {
		if !got[want] {
			t.Errorf("nft list tables: no %q (have %v)", want, got)
		}
	}
	if mode == modeIPTables && (got["ip kube-proxy"] || got["ip6 kube-proxy"]) {
		t.Errorf("an nftables-mode kube-proxy table exists beside kube-proxy in iptables mode: %v", got)
	}
}

// testKubeProxyRestartLeavesShardproxyAlone: kube-proxy stopped and started again (its
// start-up deletes nftables-mode leftovers, the "kube-proxy" tables) never touches a
// shardproxy table: team-a's Service keeps answering throughout, and both tables keep
// their kernel handle (never deleted and recreated) and their rules.
func testKubeProxyRestartLeavesShardproxyAlone(t *testing.T) {
	e, kp := environment(t)
	ctx := context.Background()
	servers(t, e)
	plain := service(t, e, "plain-kp-restart", "")
	webA := service(t, e, "web-a-kp-restart", "team-a")
	reach(t, e, e.TP.Pod2, plain)
	reach(t, e, e.TP.Pod2, webA)
	before := tableState(t, e)
	// Decoys: what an nftables-mode kube-proxy would have left behind. kube-proxy in
	// iptables mode deletes these at start; seeing them go proves its cleanup ran. (In
	// nftables mode the tables are its own, rewritten at start.)
	if mode == modeIPTables {
		if err := e.TP.NFT(e.TP.Node, "add table ip kube-proxy\nadd table ip6 kube-proxy\n"); err != nil {
			t.Fatal(err)
		}
	}

	ours := startLoad(e, "team-a Service during the kube-proxy restart", e.TP.Pod2, webA)
	theirs := startLoad(e, "kube-proxy's own Service during its restart", e.TP.Pod2, plain)
	time.Sleep(500 * time.Millisecond)
	pid := kp.Pid()
	if err := kp.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	if err := kp.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy restarted (pid %d -> %d)", pid, kp.Pid())
	time.Sleep(time.Second)
	if _, failed := ours.finish(t); failed != 0 {
		t.Errorf("%d connections to team-a's Service failed while kube-proxy restarted", failed)
	}
	theirs.finish(t)

	got := tables(t, e)
	if mode == modeIPTables && (got["ip kube-proxy"] || got["ip6 kube-proxy"]) {
		t.Errorf("kube-proxy did not delete the nftables-mode decoy tables at start (its cleanup did not run?): %v", got)
	}
	after := tableState(t, e)
	for _, tbl := range ourTables {
		if counterless(before[tbl]) != counterless(after[tbl]) {
			t.Errorf("%s changed across the kube-proxy restart:\nbefore:\n%s\nafter:\n%s", tbl, before[tbl], after[tbl])
		}
	}
	reach(t, e, e.TP.Pod2, plain)
	reach(t, e, e.TP.Pod2, webA)
}

// testShardproxyRestartLeavesKubeProxyAlone: the supervisor stopped (SIGTERM) and started
// again never touches kube-proxy's rules: its Service keeps answering throughout and
// its rules (iptables-save, or its nftables tables) are the same line for line.
func testShardproxyRestartLeavesKubeProxyAlone(t *testing.T) {
	e, _ := environment(t)
	ctx := context.Background()
	servers(t, e)
	plain := service(t, e, "plain-sp-restart", "")
	webB := service(t, e, "web-b-sp-restart", "team-b")
	reach(t, e, e.TP.Pod2, plain)
	reach(t, e, e.TP.Pod2, webB)
	before := kubeProxyRules(t, e)

	theirs := startLoad(e, "kube-proxy Service during the shardproxy restart", e.TP.Pod2, plain)
	ours := startLoad(e, "team-b's own Service during the shardproxy restart", e.TP.Pod2, webB)
	time.Sleep(500 * time.Millisecond)
	if err := e.StopSupervisor(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := e.StartSupervisor(); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitHealthy(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if _, failed := theirs.finish(t); failed != 0 {
		t.Errorf("%d connections to kube-proxy's Service failed while shardproxy restarted", failed)
	}
	ours.finish(t)

	after := kubeProxyRules(t, e)
	if onlyBefore, onlyAfter := diffLines(before, after); len(onlyBefore)+len(onlyAfter) > 0 {
		t.Errorf("kube-proxy's %s rules changed across the shardproxy restart:\ngone:\n%s\nnew:\n%s",
			mode, strings.Join(onlyBefore, "\n"), strings.Join(onlyAfter, "\n"))
	}
	reach(t, e, e.TP.Pod2, plain)
	reach(t, e, e.TP.Pod2, webB)
}

var counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

func counterless(s string) string { return counterRE.ReplaceAllString(s, "counter") }
