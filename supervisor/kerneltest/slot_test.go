package kerneltest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestLiveSlotChangeRehooksTables: a live configuration change that gives an instance
// another slot moves its base chains to the new slot's priorities. The kernel refuses to
// change a base chain's priority in place, so the restarted instance's first full sync
// deletes and recreates its tables in one transaction: afterwards the chains hook at the
// new priorities, its Service is programmed, and the other instance was not touched.
func TestLiveSlotChangeRehooksTables(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft")
	tp := netns.New(t)
	ns := tp.Node
	nftInNode(t, ns)
	list := func(table string) string {
		out, err := tp.Exec(ns, "nft", "list", "table", "ip", table)
		if err != nil {
			return ""
		}
		return out
	}

	healthz, metrics := freePort(t), freePort(t)
	yaml := func(alphaSlot int) string {
		return fmt.Sprintf("apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\nnodeName: node-1\n"+
			"healthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\nserviceCIDRDrop: false\nstatusNamespace: \"-\"\ninstances:\n"+
			"- name: alpha\n  proxyNames: [alpha]\n  slot: %d\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n  tenant:\n    namespaces: [alpha]\n"+
			"- name: beta\n  proxyNames: [beta]\n  slot: 2\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n  tenant:\n    namespaces: [beta]\n",
			healthz, metrics, alphaSlot)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, yaml(0))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	createPlain(t, client, "alpha", "web", "10.96.0.10", "10.244.0.10")
	createPlain(t, client, "beta", "web", "10.96.0.20", "10.244.0.20")
	deps := nodeDeps(tp, ns, client, logr.Logger(funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{})))
	deps.ConfigFile, deps.ConfigData, deps.ConfigPoll = path, data, 20*time.Millisecond
	runSupervisor(t, decodeConfig(t, string(data), path), deps)

	testutil.Eventually(t, time.Minute, "both instances program their Service", func() bool {
		return strings.Contains(list("shardproxy-alpha"), "10.96.0.10") && strings.Contains(list("shardproxy-beta"), "10.96.0.20")
	})
	before, beta := priorities(list("shardproxy-alpha")), list("shardproxy-beta")

	writeFile(t, path, yaml(5))
	var after []string
	testutil.Eventually(t, time.Minute, "alpha's chains at slot 5's priorities, its Service programmed", func() bool {
		table := list("shardproxy-alpha")
		after = priorities(table)
		return strings.Contains(table, "10.96.0.10") && len(after) == len(before) && strings.Join(after, ",") != strings.Join(before, ",")
	})
	for i := range before {
		if before[i] == after[i] {
			t.Errorf("base chain %d still hooks at %s after the slot change", i, after[i])
		}
	}
	if got := list("shardproxy-beta"); got != beta {
		t.Errorf("beta's table changed with alpha's slot:\nbefore %s\nafter %s", beta, got)
	}
	if failed := syncFailures(t, metrics); len(failed) > 0 {
		t.Errorf("failed syncs: %q", failed)
	}
	fmt.Printf("kernel: live slot change of alpha 0 → 5: %d base chains re-hooked (first: %q → %q), its Service programmed, beta untouched, no failed sync\n",
		len(after), before[0], after[0])
}

// syncFailures are the metrics server's non-zero sync failure counters.
func syncFailures(t *testing.T, port int) []string {
	t.Helper()
	body := scrapeMetrics(t, port)
	var out []string
	seen := false
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{") {
			continue
		}
		seen = true
		if !strings.HasSuffix(line, " 0") {
			out = append(out, line)
		}
	}
	if !seen {
		t.Fatal("the metrics show no sync failure counter")
	}
	return out
}

// priorities lists the base chains' "hook priority" lines of an nft table listing, in order.
func priorities(table string) []string {
	var out []string
	for _, line := range strings.Split(table, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "type ") && strings.Contains(line, "priority") {
			out = append(out, line)
		}
	}
	return out
}

// writeFile replaces path's content by a rename, as a ConfigMap volume's update does.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}
