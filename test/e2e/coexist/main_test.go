// Package coexist runs upstream kube-proxy (iptables mode, the same v1.36.3 the control
// plane is built from) and the shardproxy supervisor side by side in one node namespace,
// for real: kube-proxy serves the unlabeled Services, two shardproxy instances (no default
// instance) serve the labeled ones, and each survives the other's restarts. Root only (CI
// is root); it needs iptables (hack/install-deps.sh installs it).
package coexist

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/e2e/env"
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
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Println("coexist: skipped: needs root (network namespaces, nftables, iptables); CI runs as root")
		return m.Run()
	}
	if testing.Short() {
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
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
	logf("starting %s --proxy-mode=iptables in %s", binary, e.TP.Node)
	kp := e.NewKubeProxy(binary, "kube-proxy", e.KubeProxyArgs("iptables")...)
	if err := kp.Start(); err != nil {
		fmt.Println("coexist:", err)
		return 1
	}
	if err := kp.WaitHealthy(ctx, time.Minute); err != nil {
		fmt.Println("coexist:", err)
		return 1
	}
	logf("environment with kube-proxy up in %v", time.Since(start).Round(time.Millisecond))
	shared, kubeProxy = e, kp
	code := m.Run()
	// kube-proxy's klog error lines ("E1122 ..."), for the record: a namespace it could
	// not configure shows up here first.
	var errLines []string
	for _, line := range strings.Split(kp.Log(), "\n") {
		if strings.HasPrefix(line, "E") && len(line) > 5 && line[1] >= '0' && line[1] <= '9' {
			errLines = append(errLines, line)
		}
	}
	logf("kube-proxy logged %d error lines%s", len(errLines), strings.Join(append([]string{""}, firstN(errLines, 5)...), "\n  "))
	if code != 0 {
		fmt.Println("coexist: supervisor log (end):\n" + tail(e.SupervisorLog(), 60))
		fmt.Println("coexist: kube-proxy log (end):\n" + kp.LogTail(60))
	}
	return code
}

// TestCoexist runs the suite against the one shared environment in a fixed order, written
// here rather than left to file and declaration order: the legacy cleanup stops
// kube-proxy for good, so it runs last.
func TestCoexist(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"EachProxyServesItsOwnServices", testEachProxyServesItsOwnServices},
		{"KubeProxyRestartLeavesShardproxyAlone", testKubeProxyRestartLeavesShardproxyAlone},
		{"ShardproxyRestartLeavesKubeProxyAlone", testShardproxyRestartLeavesKubeProxyAlone},
		{"MigrateMoveAndRollback", testMigrateMoveAndRollback},
		{"LegacyCleanupAfterRealKubeProxy", testLegacyCleanupAfterRealKubeProxy},
	} {
		t.Run(tc.name, tc.run)
	}
}

// waitTimeout bounds how long a test waits for a proxy to act.
const waitTimeout = 30 * time.Second

// environment returns the shared environment, skipping when there is none (not root,
// or -short).
func environment(t *testing.T) (*env.Env, *env.KubeProxy) {
	t.Helper()
	if shared == nil {
		t.Skip("coexist: needs root and no -short (CI runs it as root)")
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
