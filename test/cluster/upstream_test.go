package cluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/controlplane"
)

// conformanceEnv selects the focus: "full" runs every single-node [sig-network] Services
// test (`make conformance`), "off" none, empty ServicesConformanceFocus (CI); anything
// else is a focus regexp of its own (to rerun one test).
const conformanceEnv = "SHARDPROXY_CONFORMANCE"

// ciMustRun are tests of ServicesConformanceFocus beyond [Conformance]: a run of that
// focus that did not select them fails, so a broken regexp cannot drop them silently.
var ciMustRun = []string{
	"should implement service.kubernetes.io/service-proxy-name",
	"should be able to up and down services",
}

// TestConformance runs upstream's [sig-network] Services tests against the node twice:
// with shardproxy's DaemonSet (the replace overlay) as the node's only Service proxy, then
// with upstream kube-proxy v1.36.3 in nftables mode instead, and prints both results side
// by side. Every test kube-proxy passes here must pass with shardproxy.
func TestConformance(t *testing.T) {
	c := need(t)
	mode := os.Getenv(conformanceEnv)
	if mode == "off" {
		t.Skipf("$%s=off", conformanceEnv)
	}
	// The full focus has two session-affinity timeout tests that each wait out a
	// 125 s affinity timeout, maybe several times: 14 minutes timed the second out.
	focus, suiteTimeout := ServicesConformanceFocus, 14*time.Minute
	switch mode {
	case "":
	case "full":
		focus, suiteTimeout = ServicesFocus, 30*time.Minute
	default:
		focus = mode
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*suiteTimeout+10*time.Minute)
	defer cancel()
	e2eTest := c.conformanceSetup(ctx, t)

	took := applyOverlay(ctx, t, c, Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + shardproxyTag,
		APIServer: true, Config: conformanceConfig(t, c)})
	fmt.Printf("cluster: replace-kube-proxy overlay (its example external IP range enabled) Ready in %v\n", took.Round(time.Millisecond))
	start := time.Now()
	withShardproxy, err := c.RunE2E(ctx, e2eTest, "shardproxy", focus, ServicesSkip, suiteTimeout)
	if err != nil {
		t.Fatal(err)
	}
	shardproxyTime := time.Since(start).Round(time.Second)
	t.Logf("shardproxy: %s in %v", Totals(withShardproxy), shardproxyTime)

	c.replaceWithKubeProxy(ctx, t)
	start = time.Now()
	withKubeProxy, err := c.RunE2E(ctx, e2eTest, "kube-proxy", focus, ServicesSkip, suiteTimeout)
	if err != nil {
		t.Fatal(err)
	}
	kubeProxyTime := time.Since(start).Round(time.Second)
	t.Logf("kube-proxy: %s in %v", Totals(withKubeProxy), kubeProxyTime)
	fmt.Printf("cluster: upstream e2e.test %s, focus %q, skip %q (shardproxy %v, kube-proxy %v):\n", controlplane.KubernetesVersion, focus, ServicesSkip, shardproxyTime, kubeProxyTime)
	for _, line := range strings.Split(strings.TrimSpace(CompareTable("shardproxy", withShardproxy, "kube-proxy", withKubeProxy)), "\n") {
		fmt.Printf("cluster:   %s\n", line)
	}

	passedUpstream := map[string]bool{}
	for _, r := range withKubeProxy {
		passedUpstream[r.Name] = r.State == "passed"
	}
	for _, r := range withShardproxy {
		if r.State != "passed" && r.State != "skipped" && passedUpstream[r.Name] {
			t.Errorf("kube-proxy passes, shardproxy %s: %s: %s", r.State, r.Name, r.Failure)
		}
	}
	if len(withShardproxy) == 0 {
		t.Error("the focus selected no test")
	}
	if mode == "" {
		for _, name := range ciMustRun {
			if !slices.ContainsFunc(withShardproxy, func(r E2EResult) bool { return strings.HasSuffix(r.Name, name) }) {
				t.Errorf("the focus did not select %q", name)
			}
		}
	}
}

// exampleTenant is the replace overlay's commented example of the ranges the default
// instance serves external and load-balancer IPs from; conformanceConfig enables it.
const exampleTenant = `  # tenant:
  #   externalIPCIDRs: [203.0.113.0/24]
  #   loadBalancerCIDRs: [198.51.100.0/24]
`

// conformanceConfig is the replace overlay's configuration with its example tenant
// ranges enabled, as an operator who uses external IPs does. Upstream's "should be
// possible to connect to a service via ExternalIP when the external IP is not assigned
// to a node" gives its Service 203.0.113.250 (RFC 5737), which shardproxy serves only
// from listed ranges (kube-proxy serves any address: CVE-2020-8554); with the overlay's
// empty default the test fails by design.
func conformanceConfig(t *testing.T, c *Cluster) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.OverlayDir(ReplaceOverlay), "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	config := string(data)
	if !strings.Contains(config, exampleTenant) {
		t.Fatalf("the replace overlay's config.yaml no longer has the example:\n%s", exampleTenant)
	}
	return strings.Replace(config, exampleTenant, strings.ReplaceAll(exampleTenant, "# ", ""), 1)
}

// conformanceSetup builds e2e.test and tags the offline images under the names the
// tests ask for; it returns e2e.test's path.
func (c *Cluster) conformanceSetup(ctx context.Context, t *testing.T) string {
	t.Helper()
	paths, err := BuildBinaries(ctx, c.opts.RepoRoot, "e2e.test")
	if err != nil {
		t.Fatal(err)
	}
	for source, target := range map[string]string{
		agnhostImage: "registry.k8s.io/e2e-test-images/agnhost:" + strings.TrimPrefix(agnhostImage, "localhost/agnhost:"),
		PauseImage:   "registry.k8s.io/pause:3.10.2",
	} {
		if err := c.TagImage(ctx, source, target); err != nil {
			t.Fatal(err)
		}
	}
	return paths["e2e.test"]
}

// replaceWithKubeProxy removes shardproxy's DaemonSet and tables and runs upstream
// kube-proxy (nftables mode) in the node's namespace with kube-proxy's default ports.
func (c *Cluster) replaceWithKubeProxy(ctx context.Context, t *testing.T) {
	t.Helper()
	c.removeShardproxy(ctx, t)
	c.startKubeProxy(ctx, t, "nftables")
}

// removeShardproxy deletes shardproxy's DaemonSet, waits for its pod to go and deletes
// the tables it leaves (a supervisor that exits keeps its rules in place).
func (c *Cluster) removeShardproxy(ctx context.Context, t *testing.T) {
	t.Helper()
	err := c.Client.AppsV1().DaemonSets("kube-system").Delete(ctx, "shardproxy", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	err = poll(ctx, 2*time.Minute, "shardproxy's pod gone", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.NFTTables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The instances' tables and the node-wide one (shardproxy_node).
	for _, table := range tables {
		if family, name, _ := strings.Cut(table, " "); strings.HasPrefix(name, "shardproxy") {
			if _, err := c.InNode(ctx, "nft", "delete", "table", family, name); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// startKubeProxy runs upstream kube-proxy v1.36.3 in mode in the node's namespace on its
// default ports, serving the unlabeled Services, until the test ends; then it is stopped
// and its rules cleaned up (kube-proxy --cleanup), as later tests expect.
func (c *Cluster) startKubeProxy(ctx context.Context, t *testing.T, mode string) {
	t.Helper()
	bin, err := controlplane.KubeProxyBinary(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := c.startChild("kube-proxy", bin,
		"--proxy-mode="+mode,
		"--kubeconfig="+c.Kubeconfig,
		"--hostname-override="+NodeName,
		"--cluster-cidr="+ClusterCIDR,
		// The node's conntrack table is the host's: leave its sysctls alone.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--v=1",
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := kp.Stop(10 * time.Second); err != nil {
			t.Error(err)
		}
		c.mu.Lock()
		delete(c.children, "kube-proxy")
		c.mu.Unlock()
		if out, err := c.InNode(context.Background(), bin, "--cleanup"); err != nil {
			t.Errorf("kube-proxy --cleanup: %v: %s", err, out)
		}
	})
	err = poll(ctx, time.Minute, "kube-proxy healthy", func() (bool, error) {
		if !kp.Running() {
			return false, kp.ExitErr()
		}
		client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: c.Dialer(c.NodeNS)}}
		resp, err := client.Get("http://127.0.0.1:10256/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("%v; log ends:\n%s", err, kp.LogTail(20))
	}
}
