package realfleet

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestBothProxiesProgram is make fleet-real's slice for make test: two real nodes of
// upstream kube-proxy (nftables mode), then two of shardproxy's supervisor, against one
// kube-apiserver with 50 Services; each node's kernel must hold every probe Service, as
// its own nft monitor reports, within the change timeout.
func TestBothProxiesProgram(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft", "stdbuf", "curl")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := controlplane.APIServerBinary(ctx, nil); err != nil {
		testutil.Unavailable(t, "kube-apiserver: %v", err)
	}
	kubeProxy, err := controlplane.KubeProxyBinary(ctx, nil)
	if err != nil {
		t.Fatalf("kube-proxy: %v", err)
	}
	dir := t.TempDir()
	shardproxy := filepath.Join(dir, "shardproxy")
	build := exec.CommandContext(ctx, "go", "build", "-o", shardproxy, "github.com/shardproxy/shardproxy/cmd/shardproxy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building shardproxy: %v: %s", err, out)
	}
	const nodes, changes = 2, 2
	results, err := Run(ctx, Options{Nodes: []int{nodes}, Proxies: []Proxy{KubeProxy, Shardproxy}, Services: 50, Endpoints: 3,
		Changes: changes, Settle: time.Second, ReadyTimeout: time.Minute, ChangeTimeout: 30 * time.Second,
		ShardproxyBinary: shardproxy, KubeProxyBinary: kubeProxy, WorkDir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("%d results, want one per proxy", len(results))
	}
	for _, r := range results {
		if len(r.Changes) != changes || len(r.PerNode) != nodes*changes {
			t.Errorf("%s: %d changes and %d node times, want %d and %d", r.Proxy, len(r.Changes), len(r.PerNode), changes, nodes*changes)
		}
		// Every node syncs at least once for each change: fewer means the proxies'
		// sync histograms were not read.
		if r.Syncs < nodes*changes || r.SyncTime <= 0 {
			t.Errorf("%s: %v syncs taking %v during the changes, want at least %d and some time", r.Proxy, r.Syncs, r.SyncTime, nodes*changes)
		}
		for _, d := range r.PerNode {
			if d <= 0 || d > 30*time.Second {
				t.Errorf("%s: a node's time %v", r.Proxy, d)
			}
		}
	}
	t.Log("\n" + Table(results) + Ratios(results))
}
