package app

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

func TestCleanupFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"neither --config nor --legacy", []string{"cleanup"}, "cleanup needs --config"},
		{"unknown legacy mode", []string{"cleanup", "--legacy", "nftables"}, `unknown legacy mode "nftables" (want iptables or ipvs)`},
		{"--legacy with --instance", []string{"cleanup", "--legacy", "iptables", "--instance", "team-a"}, "cannot be combined with --config or --instance"},
		{"--legacy with --config", []string{"cleanup", "--legacy", "ipvs", "--config", "testdata/config.yaml"}, "cannot be combined with --config or --instance"},
		{"--force without --legacy", []string{"cleanup", "--config", "testdata/config.yaml", "--force"}, "--force only applies to --legacy"},
		{"--dry-run without --legacy", []string{"cleanup", "--config", "testdata/config.yaml", "--dry-run"}, "--dry-run only applies to --legacy"},
		{"--instance keeps working: an unknown instance", []string{"cleanup", "--config", "testdata/config.yaml", "--instance", "nope"}, `no instance "nope"`},
		{"an unknown instance must be a valid instance name", []string{"cleanup", "--instance", "Not_A_Name"}, `instance "Not_A_Name": not a valid instance name`},
		{"--table-prefix without --instance", []string{"cleanup", "--config", "testdata/config.yaml", "--table-prefix", "sp"}, "--table-prefix only applies to --instance"},
		{"--legacy with --table-prefix", []string{"cleanup", "--legacy", "iptables", "--table-prefix", "sp"}, "cannot be combined with --config or --instance or --table-prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := runCLI(tc.args...)
			if code == 0 || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want failure with %q", code, errOut, tc.wantErr)
			}
		})
	}
}

// TestCleanupLegacyInNamespace runs `shardproxy cleanup --legacy iptables` for real inside
// a node namespace holding a kube-proxy ruleset and a shardproxy table: it refuses while a
// process named kube-proxy runs there, and then removes kube-proxy's chains only.
func TestCleanupLegacyInNamespace(t *testing.T) {
	testutil.RequireTools(t, "iptables-restore", "iptables-save", "nft")
	tp := netns.New(t)
	fixture, err := os.ReadFile("../../../legacy/testdata/iptables.save")
	if err != nil {
		t.Fatal(err)
	}
	restore := exec.Command("ip", "netns", "exec", tp.Node, "iptables-restore")
	restore.Stdin = bytes.NewReader(fixture)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("loading the fixture: %v: %s", err, out)
	}
	if err := tp.NFT(tp.Node, "add table ip shardproxy-team-a\nadd chain ip shardproxy-team-a services\n"); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (string, string, int) { return runCLIIn(t, tp, tp.Node, args...) }

	// A stand-in kube-proxy: sleep under kube-proxy's name.
	bin := filepath.Join(t.TempDir(), "kube-proxy")
	testutil.CopyFile(t, mustLookPath(t, "sleep"), bin, 0o755)
	proc := tp.Start(tp.Node, bin, "1000")
	waitExec(t, proc.Pid(), "kube-proxy")
	_, errOut, code := cli("cleanup", "--legacy", "iptables")
	if code == 0 || !strings.Contains(errOut, "kube-proxy is still running on this node: pid ") || !strings.Contains(errOut, "--force") {
		t.Fatalf("with kube-proxy (pid %d) running: exit %d, stderr %q; want a refusal", proc.Pid(), code, errOut)
	}
	t.Logf("refused: %s", strings.TrimSpace(errOut))

	out, errOut, code := cli("cleanup", "--legacy", "iptables", "--dry-run", "--force")
	if code != 0 || !strings.Contains(out, "would remove 13 kube-proxy chains from table nat") {
		t.Fatalf("dry run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_ = proc.Stop() // killed: Wait reports the signal

	out, errOut, code = cli("cleanup", "--legacy", "iptables")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("stdout:\n%s", out)
	save, err := tp.Exec(tp.Node, "iptables-save")
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY"} {
		if strings.Contains(save, gone) {
			t.Errorf("%s is still there:\n%s", gone, save)
		}
	}
	for _, kept := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-MARK-DROP", "KUBE-ROUTER-INPUT", "CNI-MASQ", "--dport 22 -j ACCEPT"} {
		if !strings.Contains(save, kept) {
			t.Errorf("%s is gone:\n%s", kept, save)
		}
	}
	if _, err := tp.Exec(tp.Node, "nft", "list", "chain", "ip", "shardproxy-team-a", "services"); err != nil {
		t.Errorf("our table was touched: %v", err)
	}
}

// waitExec waits until process pid runs the program named comm (ip netns exec has
// exec'd it).
func waitExec(t *testing.T, pid int, comm string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if strings.TrimSpace(string(b)) == comm {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d never became %s", pid, comm)
}

func mustLookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testutil.Unavailable(t, "%s is not installed", name)
	}
	return p
}

// runCLIIn is runCLI on a thread switched into network namespace ns of tp: the nft and
// iptables it runs, and the netlink it talks, see that namespace.
func runCLIIn(t *testing.T, tp *netns.Topology, ns string, args ...string) (out, errOut string, code int) {
	t.Helper()
	if err := tp.Do(ns, func() error {
		out, errOut, code = runCLI(args...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out, errOut, code
}
