// Package coexist runs upstream kube-proxy (the same v1.36.3 the control plane is built
// from) and the shardproxy supervisor side by side in one node namespace, for real, once
// with kube-proxy in nftables mode and once in iptables mode: kube-proxy serves the
// unlabeled Services, two shardproxy instances (no default instance) serve the labeled
// ones, and each survives the other's restarts. Root only (CI is root); it needs
// iptables (hack/install-deps.sh installs it).
package coexist

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// instances are two team instances and no default one: unlabeled Services are
// kube-proxy's.
const instances = `
- name: team-a
  proxyNames: [team-a]
  slot: 1
  minSyncPeriod: 100ms
  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/48"]}
  tenant: {namespaces: [coexist]}
- name: team-b
  proxyNames: [team-b]
  slot: 2
  minSyncPeriod: 100ms
  detectLocal: {mode: InterfaceNamePrefix, interfaceNamePrefix: vpod}
  tenant: {namespaces: [coexist]}
`

var (
	shared    *env.Env
	kubeProxy *env.KubeProxy
	// kubeProxyBinary is upstream kube-proxy, started in each mode by TestCoexist.
	kubeProxyBinary string
	// mode is the proxy mode of the running kube-proxy: modeIPTables or modeNFTables.
	mode string
)

// kube-proxy's proxy modes the suite runs against.
const (
	modeIPTables = "iptables"
	modeNFTables = "nftables"
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if os.Geteuid() != 0 || testing.Short() {
		if testutil.CI() {
			fmt.Printf("coexist: %s=1 (CI mode) but not root or -short: the coexist tests cannot run\n", testutil.CIEnv)
			return 1
		}
		fmt.Println("coexist: skipped: needs root (network namespaces, nftables, iptables) and no -short; CI runs as root")
		return m.Run()
	}
	for _, tool := range []string{"iptables", "iptables-save", "ip6tables-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Printf("coexist: %s is not installed (hack/install-deps.sh installs iptables)\n", tool)
			return 1
		}
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	work, err := os.MkdirTemp("", "shardproxy-coexist-")
	if err != nil {
		fmt.Println("coexist:", err)
		return 1
	}
	defer os.RemoveAll(work)
	// Start-up only: make test builds kube-apiserver and kube-proxy before this layer,
	// so minutes are spare; under the layer's go test -timeout (hack/test.sh).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	logf := func(f string, a ...any) { fmt.Printf("coexist: "+f+"\n", a...) }

	binary, err := controlplane.KubeProxyBinary(ctx, os.Stdout)
	if err != nil {
		fmt.Println("coexist: kube-proxy binary:", err)
		return 1
	}
	start := time.Now()
	e, err := env.Start(ctx, env.Options{RepoRoot: root, WorkDir: work, Instances: instances, Logf: logf})
	if err != nil {
		fmt.Println("coexist: starting the environment:", err)
		if e != nil {
			_ = e.Close()
		}
		return 1
	}
	defer func() {
		if err := e.Close(); err != nil {
			fmt.Println("coexist: cleanup:", err)
		}
	}()
	logf("environment up in %v", time.Since(start).Round(time.Millisecond))
	shared, kubeProxyBinary = e, binary
	code := m.Run()
	if code != 0 {
		fmt.Println("coexist: supervisor log (end):\n" + tail(e.SupervisorLog(), 60))
		if kubeProxy != nil {
			fmt.Printf("coexist: kube-proxy (%s mode) log (end):\n%s\n", mode, kubeProxy.LogTail(60))
		}
	}
	return code
}

// startKubeProxy stops the running kube-proxy, if any, and starts one in proxy mode m,
// which at start removes what the other mode left (its chains or its tables).
func startKubeProxy(t *testing.T, e *env.Env, m string) {
	t.Helper()
	if kubeProxy != nil {
		if err := kubeProxy.Stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	kp := e.NewKubeProxy(kubeProxyBinary, "kube-proxy-"+m, e.KubeProxyArgs(m)...)
	if err := kp.Start(); err != nil {
		t.Fatal(err)
	}
	kubeProxy, mode = kp, m
	if err := kp.WaitHealthy(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reportKubeProxyErrors(kp) })
}

// reportKubeProxyErrors prints kube-proxy's klog error lines ("E1122 ..."), for the
// record: a namespace it could not configure shows up here first.
func reportKubeProxyErrors(kp *env.KubeProxy) {
	var errLines []string
	for _, line := range strings.Split(kp.Log(), "\n") {
		if strings.HasPrefix(line, "E") && len(line) > 5 && line[1] >= '0' && line[1] <= '9' {
			errLines = append(errLines, line)
		}
	}
	fmt.Printf("coexist: kube-proxy logged %d error lines%s\n", len(errLines), strings.Join(append([]string{""}, firstN(errLines, 5)...), "\n  "))
}

// TestCoexist runs the suite against the one shared environment, first beside kube-proxy
// in nftables mode, then in iptables mode, in a fixed order written here rather than
// left to file and declaration order: the legacy cleanup stops kube-proxy for good, so it
// runs last. Services get the mode in their names, so the passes do not meet.
//
// Both passes run the migration (move, then rollback, which keeps the shadow until the
// node reads kube-proxy's rules for the Services: iptables in one mode, its nftables maps
// in the other). Not in the nftables pass: the iptables cleanup after kube-proxy, which is
// about iptables mode.
func TestCoexist(t *testing.T) {
	type step struct {
		name string
		run  func(t *testing.T)
	}
	coexist := []step{
		{"EachProxyServesItsOwnServices", testEachProxyServesItsOwnServices},
		{"HealthEndpointsMatchKubeProxy", testHealthEndpointsMatchKubeProxy},
		{"KubeProxyRestartLeavesShardproxyAlone", testKubeProxyRestartLeavesShardproxyAlone},
		{"ShardproxyRestartLeavesKubeProxyAlone", testShardproxyRestartLeavesKubeProxyAlone},
	}
	migrate := step{"MigrateMoveAndRollback", testMigrateMoveAndRollback}
	for _, pass := range []struct {
		mode  string
		steps []step
	}{
		{modeNFTables, append(slices.Clone(coexist), migrate, step{"ScopedWatch", testScopedWatch},
			step{"LiveConfigRescopes", testLiveConfigRescopes})},
		{modeIPTables, append(coexist, migrate,
			step{"LegacyCleanupAfterRealKubeProxy", testLegacyCleanupAfterRealKubeProxy})},
	} {
		t.Run(pass.mode, func(t *testing.T) {
			e, _ := environment(t)
			startKubeProxy(t, e, pass.mode)
			for _, s := range pass.steps {
				t.Run(s.name, s.run)
			}
		})
	}
}

// waitTimeout bounds how long a test waits for a proxy to act.
const waitTimeout = 30 * time.Second

// environment returns the shared environment, skipping when there is none (not root,
// or -short).
func environment(t *testing.T) (*env.Env, *env.KubeProxy) {
	t.Helper()
	if shared == nil {
		testutil.Unavailable(t, "coexist: needs root and no -short (CI runs it as root)")
	}
	return shared, kubeProxy
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
