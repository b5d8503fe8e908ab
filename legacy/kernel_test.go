package legacy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// Real-kernel tests: the cleanup runs inside the node namespace of a fresh test topology,
// against rules loaded there with the real iptables-restore (nft backend) and nft. These
// machines' kernels have neither IPVS nor the dummy interface driver, so virtual services
// and the deletion of a dummy kube-ipvs0 are covered by the fakes only (ipvs_test.go);
// the ipsets, the iptables rules that use them, and the refusal to delete a kube-ipvs0
// that is not a dummy are real here.

func kernelTopology(t *testing.T) *netns.Topology {
	t.Helper()
	testutil.RequireTools(t, "iptables-restore", "iptables-save", "ip6tables-restore", "nft")
	return netns.New(t)
}

// ourTable stands in for a shardproxy instance's table, which the cleanup must not touch.
const ourTable = `table ip shardproxy-team-a {
	chain nat-prerouting {
		type nat hook prerouting priority -66; policy accept;
		ip daddr 10.96.5.5 tcp dport 80 dnat to 10.244.1.2:8080
	}
}
table ip6 shardproxy-team-a {
	chain nat-prerouting {
		type nat hook prerouting priority -66; policy accept;
	}
}
`

const ip6Fixture = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -s fd00:10:244::/48 ! -d fd00:10:244::/48 -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d fd00:96::10/128 -p tcp -m comment --comment "ns1/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-ABCDEFGHIJKLMNOP
-A KUBE-SVC-ABCDEFGHIJKLMNOP -m comment --comment "ns1/web:http -> [fd00:10:244:1::2]:8080" -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment "ns1/web:http" -m tcp -j DNAT --to-destination [fd00:10:244:1::2]:8080
COMMIT
`

func loadRules(t *testing.T, tp *netns.Topology, ns string) {
	t.Helper()
	for cmd, rules := range map[string]string{"iptables-restore": fixture(t), "ip6tables-restore": ip6Fixture} {
		c := exec.Command("ip", "netns", "exec", ns, cmd)
		c.Stdin = strings.NewReader(rules)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
	}
	if err := tp.NFT(ns, ourTable); err != nil {
		t.Fatal(err)
	}
}

// saveRules returns the rule and chain lines of iptables-save and ip6tables-save in ns.
func saveRules(t *testing.T, tp *netns.Topology, ns string) []string {
	t.Helper()
	var lines []string
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := tp.Exec(ns, cmd)
		if err != nil {
			t.Fatal(err)
		}
		table := ""
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(l, "*"):
				table = l[1:]
			case strings.HasPrefix(l, ":"):
				// Without the counters, which traffic changes.
				f := strings.Fields(l)
				lines = append(lines, cmd+" "+table+" "+f[0]+" "+f[1])
			case strings.HasPrefix(l, "-A "):
				lines = append(lines, cmd+" "+table+" "+strings.Fields(l)[0]+" "+strings.SplitN(l, " ", 2)[1])
			}
		}
	}
	return lines
}

// survives reports whether a saved line must outlive the cleanup: not a kube-proxy chain,
// not a rule in one, not a jump to one.
func survives(line string) bool {
	f := strings.Fields(line)
	table := f[1]
	if strings.HasPrefix(f[2], ":") {
		return !Owned(table, strings.TrimPrefix(f[2], ":"))
	}
	if Owned(table, f[3]) {
		return false
	}
	return !Owned(table, targetOf(strings.Join(f[4:], " ")))
}

func runCleanup(t *testing.T, tp *netns.Topology, ns string, opts Options) (string, error) {
	t.Helper()
	var out bytes.Buffer
	opts.Out = &out
	err := tp.Do(ns, func() error { return Cleanup(context.Background(), opts) })
	return out.String(), err
}

func TestKernelIPTablesCleanup(t *testing.T) {
	tp := kernelTopology(t)
	loadRules(t, tp, tp.Node)
	before := saveRules(t, tp, tp.Node)
	ourBefore, err := tp.Exec(tp.Node, "nft", "-a", "list", "table", "ip", "shardproxy-team-a")
	if err != nil {
		t.Fatal(err)
	}

	report, err := runCleanup(t, tp, tp.Node, Options{Mode: ModeIPTables})
	t.Logf("report:\n%s", report)
	if err != nil {
		t.Fatal(err)
	}

	after := saveRules(t, tp, tp.Node)
	got := map[string]bool{}
	for _, l := range after {
		got[l] = true
		if !survives(l) {
			t.Errorf("left behind: %s", l)
		}
	}
	kept := 0
	for _, l := range before {
		if survives(l) {
			kept++
			if !got[l] {
				t.Errorf("removed, but not kube-proxy's: %s", l)
			}
		}
	}
	if len(after) != kept {
		t.Errorf("%d lines after the cleanup, want the %d that are not kube-proxy's", len(after), kept)
	}
	for _, want := range []string{"-A INPUT -j KUBE-FIREWALL", ":KUBE-MARK-DROP", ":KUBE-KUBELET-CANARY", "-j CNI-MASQ", "ip6tables-save nat -A POSTROUTING -s fd00:10:244::/48"} {
		if !strings.Contains(strings.Join(after, "\n"), want) {
			t.Errorf("%q is gone", want)
		}
	}
	ourAfter, err := tp.Exec(tp.Node, "nft", "-a", "list", "table", "ip", "shardproxy-team-a")
	if err != nil || ourAfter != ourBefore {
		t.Errorf("our table changed (%v):\nbefore:\n%s\nafter:\n%s", err, ourBefore, ourAfter)
	}
	if _, err := tp.Exec(tp.Node, "nft", "list", "table", "ip6", "shardproxy-team-a"); err != nil {
		t.Errorf("our ip6 table: %v", err)
	}

	// Again: nothing to do.
	report, err = runCleanup(t, tp, tp.Node, Options{Mode: ModeIPTables})
	if err != nil || !strings.Contains(report, "iptables: no kube-proxy chains") {
		t.Errorf("second run: %v\n%s", err, report)
	}
}

// fakeKubeProxy copies sleep to a binary named kube-proxy and runs it in ns.
func fakeKubeProxy(t *testing.T, tp *netns.Topology, ns string) *netns.Process {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		testutil.Unavailable(t, "no sleep binary")
	}
	bin := filepath.Join(t.TempDir(), "kube-proxy")
	testutil.CopyFile(t, sleep, bin, 0o755)
	p := tp.Start(ns, bin, "1000")
	// Start returns before ip netns exec has exec'd the program.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.Pid())); strings.TrimSpace(string(b)) == "kube-proxy" {
			return p
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d never became kube-proxy", p.Pid())
	return nil
}

func TestKernelRefusesWhileKubeProxyRuns(t *testing.T) {
	tp := kernelTopology(t)
	loadRules(t, tp, tp.Node)
	elsewhere := fakeKubeProxy(t, tp, tp.Pod1)

	// A kube-proxy in another network namespace does not hold the node's rules.
	if _, err := runCleanup(t, tp, tp.Node, Options{Mode: ModeIPTables, DryRun: true}); err != nil {
		t.Fatalf("a kube-proxy in %s stopped the cleanup of %s: %v", tp.Pod1, tp.Node, err)
	}

	proc := fakeKubeProxy(t, tp, tp.Node)
	t.Logf("fake kube-proxy pid %d in %s, another (pid %d) in %s", proc.Pid(), tp.Node, elsewhere.Pid(), tp.Pod1)
	before := saveRules(t, tp, tp.Node)
	_, err := runCleanup(t, tp, tp.Node, Options{Mode: ModeIPTables})
	var re *RunningError
	if !errors.As(err, &re) || len(re.Processes) != 1 || re.Processes[0].PID != proc.Pid() {
		t.Fatalf("err = %v, want a refusal naming pid %d", err, proc.Pid())
	}
	t.Logf("refusal: %v", err)
	if after := saveRules(t, tp, tp.Node); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Error("the refused cleanup changed the rules")
	}

	report, err := runCleanup(t, tp, tp.Node, Options{Mode: ModeIPTables, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(report, "going on (--force)") {
		t.Errorf("no warning under --force:\n%s", report)
	}
	for _, l := range saveRules(t, tp, tp.Node) {
		if !survives(l) {
			t.Errorf("left behind under --force: %s", l)
		}
	}
}

func TestKernelIPVSLeftovers(t *testing.T) {
	tp := kernelTopology(t)
	loadRules(t, tp, tp.Node)
	// What IPVS mode leaves besides virtual services: kube-ipvs0 with the Service
	// addresses, its ipsets, and iptables rules matching them. kube-proxy's kube-ipvs0 is
	// a dummy, which this kernel cannot make: a veth of that name stands in, and must be
	// left alone for not being a dummy.
	for _, args := range [][]string{
		{"ip", "link", "add", DummyInterface, "type", "veth", "peer", "name", "kipvs-peer"},
		{"ip", "addr", "add", "10.96.0.10/32", "dev", DummyInterface},
		{"ip", "addr", "add", "fd00:96::10/128", "dev", DummyInterface, "nodad"},
	} {
		if _, err := tp.Exec(tp.Node, args...); err != nil {
			t.Fatal(err)
		}
	}
	err := tp.Do(tp.Node, func() error {
		for name, typ := range map[string]string{"KUBE-CLUSTER-IP": "hash:ip,port", "KUBE-IPVS-IPS": "hash:ip", "other-set": "hash:ip"} {
			if err := netlink.IpsetCreate(name, typ, netlink.IpsetCreateOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		testutil.Unavailable(t, "this kernel cannot create ipsets (module ip_set missing?): %v", err)
	}
	rule := exec.Command("ip", "netns", "exec", tp.Node, "iptables-restore", "--noflush")
	rule.Stdin = strings.NewReader("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n")
	if out, err := rule.CombinedOutput(); err != nil {
		t.Fatalf("loading an ipset rule: %v: %s", err, out)
	}

	report, err := runCleanup(t, tp, tp.Node, Options{Mode: ModeIPVS})
	t.Logf("report:\n%s", report)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"no virtual services to remove",
		"ipvs: warning: kube-ipvs0 is a veth interface, not the dummy kube-proxy creates: left alone",
		"ipvs: removed ipsets KUBE-CLUSTER-IP KUBE-IPVS-IPS",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	err = tp.Do(tp.Node, func() error {
		if _, err := netlink.LinkByName(DummyInterface); err != nil {
			t.Errorf("the veth %s was deleted: %v", DummyInterface, err)
		}
		if _, err := netlink.LinkByName(netns.NodeClientInterface); err != nil {
			t.Errorf("%s is gone: %v", netns.NodeClientInterface, err)
		}
		sets, err := netlink.IpsetListAll()
		if err != nil {
			return err
		}
		var names []string
		for _, s := range sets {
			names = append(names, s.SetName)
		}
		if strings.Join(names, ",") != "other-set" {
			t.Errorf("ipsets left: %v, want only other-set", names)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.Exec(tp.Node, "nft", "list", "table", "ip", "shardproxy-team-a"); err != nil {
		t.Errorf("our table: %v", err)
	}
}

// TestKernelLegacyWaitsForXtablesLock: kube-proxy's chains in the iptables-legacy backend
// are removed while another program holds the xtables lock for a moment (kubelet, a CNI
// plugin), and a holder that never lets go fails the cleanup after kube-proxy's 5 s
// (-w 5) with iptables' message rather than hanging it (iptables 1.8.9's restore waits
// with no bound without -w). The lock is a file the whole host shares, so iptables is
// pointed at a lock file of the test's own (XTABLES_LOCKFILE).
func TestKernelLegacyWaitsForXtablesLock(t *testing.T) {
	testutil.RequireTools(t, "iptables-legacy-restore", "iptables-legacy-save")
	lockFile := filepath.Join(t.TempDir(), "xtables.lock")
	t.Setenv("XTABLES_LOCKFILE", lockFile)
	for _, tc := range []struct {
		name string
		held time.Duration // 0: not released
	}{
		{name: "lock held briefly", held: 500 * time.Millisecond},
		{name: "lock never released"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := kernelTopology(t)
			load := exec.Command("ip", "netns", "exec", tp.Node, "iptables-legacy-restore", "--noflush")
			load.Stdin = strings.NewReader("*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n")
			if out, err := load.CombinedOutput(); err != nil {
				t.Fatalf("iptables-legacy-restore: %v: %s", err, out)
			}
			release := holdLock(t, lockFile)
			if tc.held > 0 {
				time.AfterFunc(tc.held, release)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			var out bytes.Buffer
			err := tp.Do(tp.Node, func() error {
				return Cleanup(ctx, Options{Mode: ModeIPTables, KubeProxyMetricsAddress: "-", Out: &out})
			})
			took := time.Since(start)
			t.Logf("after %v: %v\n%s", took, err, out.String())
			if tc.held > 0 {
				if err != nil {
					t.Fatalf("cleanup while the xtables lock was held for %v: %v", tc.held, err)
				}
				if left, _ := tp.Exec(tp.Node, "iptables-legacy-save", "-t", "nat"); strings.Contains(left, "KUBE-") {
					t.Errorf("kube-proxy's legacy chains are left:\n%s", left)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "xtables lock") || took > 10*time.Second {
				t.Errorf("with the lock never released: %v after %v, want iptables' xtables lock error after ~5 s", err, took)
			}
		})
	}
}

// holdLock takes the xtables lock file as another program would; release lets it go.
func holdLock(t *testing.T, path string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}
