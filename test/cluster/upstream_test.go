package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/cluster/e2ereport"
	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestConformance's environment.
const (
	// conformanceEnv selects the focus: empty ServicesConformanceFocus (CI, the record
	// testdata/conformance-<version>-ci.txt), "full" every single-node [sig-network]
	// Services test (`make conformance`, testdata/conformance-<version>-full.txt), "off"
	// none; anything else is a focus regexp of its own (to rerun one test), with no
	// record.
	conformanceEnv = "SHARDPROXY_CONFORMANCE"
	// baselineEnv set runs upstream kube-proxy's baseline after shardproxy's run ("full"
	// always does): the two runs must select the same tests, and kube-proxy must pass
	// every test it runs. CI leaves it out (minutes of the cluster layer) and holds
	// shardproxy's run to the record instead.
	baselineEnv = "SHARDPROXY_CONFORMANCE_BASELINE"
	// recordEnv set runs the baseline and rewrites the focus's record from it, as a
	// golden update: after a new e2e.test or a change of focus or skip.
	recordEnv = "SHARDPROXY_CONFORMANCE_RECORD"
)

// ciMustRun are tests of ServicesConformanceFocus beyond [Conformance]: a run of that
// focus that did not select them fails, so a broken regexp cannot drop them silently
// (nor be recorded). The last seven need two nodes.
var ciMustRun = []string{
	"should implement service.kubernetes.io/service-proxy-name",
	"should be able to up and down services",
	"should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
	"should fail health check node port if there are only terminating endpoints",
	"should support externalTrafficPolicy=Local for type=NodePort",
	"should respect internalTrafficPolicy=Local Pod to Pod",
	"should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod",
	"should fallback to terminating endpoints when there are no ready endpoints with externallTrafficPolicy=Cluster",
	"should fallback to terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Cluster",
}

// conformancePlan is what TestConformance runs.
type conformancePlan struct {
	// name is the focus's name in its record's file name; empty for a focus of one's
	// own, which has no record.
	name        string
	focus, skip string
	// suiteTimeout is each e2e.test run's --ginkgo.timeout.
	suiteTimeout     time.Duration
	baseline, record bool
}

// planConformance reads TestConformance's environment (mode is $SHARDPROXY_CONFORMANCE,
// not "off").
func planConformance(mode string, baseline, record bool) (conformancePlan, error) {
	// The full focus has two session-affinity timeout tests that each wait out a 125 s
	// affinity timeout, maybe several times: 14 minutes timed the second out. With the
	// multi-node and dual-stack tests it selects 67 tests.
	p := conformancePlan{name: "ci", focus: ServicesConformanceFocus, skip: ServicesSkip, suiteTimeout: 14 * time.Minute, baseline: baseline || record, record: record}
	switch mode {
	case "":
	case "full":
		p.name, p.focus, p.suiteTimeout, p.baseline = "full", ServicesFocus, 45*time.Minute, true
	default:
		p.name, p.focus = "", mode
	}
	if p.record && p.name == "" {
		return p, fmt.Errorf("$%s: a focus of one's own (%q) has no record to write", recordEnv, mode)
	}
	return p, nil
}

// timeout is TestConformance's context: each run's suite timeout, plus 10 minutes for
// the overlay, the switch to kube-proxy and e2e.test's own setup and cleanup. The
// package's `go test -timeout` must be longer: CI's 24 minutes, 38 with the baseline,
// `make conformance`'s 100.
func (p conformancePlan) timeout() time.Duration {
	runs := time.Duration(1)
	if p.baseline {
		runs = 2
	}
	return runs*p.suiteTimeout + 10*time.Minute
}

// recordPath is the plan's record, per e2e.test version and focus.
func (p conformancePlan) recordPath() string {
	return filepath.Join("testdata", "conformance-"+controlplane.KubernetesVersion+"-"+p.name+".txt")
}

// TestConformance runs upstream's [sig-network] Services tests against the node with
// shardproxy's DaemonSet (the replace overlay) as the node's only Service proxy, and,
// when asked (baselineEnv, "full"), again with upstream kube-proxy v1.36.3 in nftables
// mode instead. The verdict is absolute (e2ereport.Judge): every selected test passes
// with shardproxy or skips itself with a reason (listed); the run selects exactly the
// tests of the record (testdata) and of kube-proxy's run; kube-proxy's run, when there
// is one, passes every test it runs (else the harness is at fault); e2e.test's exit
// status agrees with its report.
func TestConformance(t *testing.T) {
	c := need(t)
	mode := os.Getenv(conformanceEnv)
	if mode == "off" {
		testutil.Unavailable(t, "$%s=off asks to leave the conformance run out", conformanceEnv)
	}
	plan, err := planConformance(mode, os.Getenv(baselineEnv) != "", os.Getenv(recordEnv) != "")
	if err != nil {
		t.Fatal(err)
	}
	sel := e2ereport.Selection{Version: controlplane.KubernetesVersion, Focus: plan.focus, Skip: plan.skip}
	// The record is read before the minutes of running: without it (or kube-proxy's
	// run) nothing would check which tests the run selected.
	var record *e2ereport.Record
	if plan.name != "" && !plan.record {
		data, err := os.ReadFile(plan.recordPath())
		switch {
		case err == nil:
			rec, err := e2ereport.ParseRecord(data)
			if err != nil {
				t.Fatalf("%s: %v", plan.recordPath(), err)
			}
			record = &rec
		case errors.Is(err, fs.ErrNotExist) && plan.baseline:
			t.Logf("no record %s: kube-proxy's run is the only reference ($%s=1 writes the record)", plan.recordPath(), recordEnv)
		case errors.Is(err, fs.ErrNotExist):
			t.Fatalf("no record %s of the tests e2e.test %s selects: $%s=1 writes it from a kube-proxy run", plan.recordPath(), sel.Version, recordEnv)
		default:
			t.Fatal(err)
		}
	}
	if plan.name == "" && !plan.baseline {
		t.Logf("a focus of one's own has no record: only kube-proxy's run ($%s=1) would check which tests it selects", baselineEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), plan.timeout())
	defer cancel()
	e2eTest := c.conformanceSetup(ctx, t)

	took := applyOverlay(ctx, t, c, Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + shardproxyTag,
		APIServer: true, Config: conformanceConfig(t, c)})
	fmt.Printf("cluster: replace-kube-proxy overlay (its example external IP range enabled) Ready in %v\n", took.Round(time.Millisecond))
	start := time.Now()
	withShardproxy, err := c.RunE2E(ctx, e2eTest, "shardproxy", plan.focus, plan.skip, plan.suiteTimeout)
	if err != nil {
		t.Fatal(err)
	}
	times := fmt.Sprintf("shardproxy %v", time.Since(start).Round(time.Second))
	t.Logf("shardproxy: %s (e2e.test exit: %v)", e2ereport.Totals(withShardproxy.Report.Results), exitText(withShardproxy.Exit))

	var baseline *e2ereport.Run
	refName, ref := "no record", []e2ereport.Result(nil)
	if record != nil {
		refName, ref = "recorded", record.Tests
	}
	if plan.baseline {
		c.replaceWithKubeProxy(ctx, t)
		start = time.Now()
		run, err := c.RunE2E(ctx, e2eTest, "kube-proxy", plan.focus, plan.skip, plan.suiteTimeout)
		if err != nil {
			t.Fatalf("harness fault: kube-proxy's baseline run: %v", err)
		}
		baseline = &run
		times += fmt.Sprintf(", kube-proxy %v", time.Since(start).Round(time.Second))
		t.Logf("kube-proxy: %s (e2e.test exit: %v)", e2ereport.Totals(run.Report.Results), exitText(run.Exit))
		refName, ref = "kube-proxy", run.Report.Results
	}
	fmt.Printf("cluster: upstream e2e.test %s, focus %q, skip %q (%s):\n", sel.Version, plan.focus, plan.skip, times)
	for _, line := range strings.Split(strings.TrimSpace(e2ereport.CompareTable(conformancePrefix, "shardproxy", withShardproxy.Report.Results, refName, ref)), "\n") {
		fmt.Printf("cluster:   %s\n", line)
	}

	v := e2ereport.Judge(sel, withShardproxy, baseline, record)
	for _, s := range v.Skipped {
		fmt.Printf("cluster:   skipped by e2e.test itself: %s\n", s)
	}
	for _, f := range v.Failures {
		t.Errorf("shardproxy: %s", f)
	}
	for _, f := range v.HarnessFaults {
		t.Errorf("harness fault: %s", f)
	}
	selectionOK := len(v.HarnessFaults) == 0
	if plan.name == "ci" {
		for _, run := range []*e2ereport.Run{&withShardproxy, baseline} {
			for _, name := range ciMustRun {
				if run != nil && !slices.ContainsFunc(run.Report.Results, func(r e2ereport.Result) bool { return strings.HasSuffix(r.Name, name) }) {
					t.Errorf("%s run: %q did not run: the focus must select it", run.Proxy, name)
					selectionOK = false
				}
			}
		}
	}
	if plan.record {
		// A shardproxy failure does not stop the record (it is kube-proxy's); a harness
		// fault or a selection short of ciMustRun does.
		if !selectionOK {
			t.Fatalf("not rewriting %s: see the harness faults above", plan.recordPath())
		}
		rec, err := e2ereport.NewRecord(sel, baseline.Report)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(plan.recordPath()), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(plan.recordPath(), rec.Format(), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("cluster: wrote %s (%d tests)\n", plan.recordPath(), len(rec.Tests))
	}
}

// exitText describes e2e.test's exit status.
func exitText(err error) string {
	if err == nil {
		return "0"
	}
	return err.Error()
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
	for _, n := range c.Nodes {
		tables, err := n.NFTTables(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The instances' tables and the node-wide one (shardproxy_node).
		for _, table := range tables {
			if family, name, _ := strings.Cut(table, " "); strings.HasPrefix(name, "shardproxy") {
				if _, err := n.Run(ctx, "nft", "delete", "table", family, name); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// startKubeProxy runs upstream kube-proxy v1.36.3 in mode in every node's namespace on
// its default ports, dual-stack, serving the unlabeled Services, until the test ends;
// then it is stopped and its rules cleaned up (kube-proxy --cleanup), as later tests
// expect.
func (c *Cluster) startKubeProxy(ctx context.Context, t *testing.T, mode string) {
	t.Helper()
	bin, err := controlplane.KubeProxyBinary(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		kp, err := n.StartChild("kube-proxy", bin,
			"--proxy-mode="+mode,
			"--kubeconfig="+c.Kubeconfig,
			"--hostname-override="+n.Name,
			"--cluster-cidr="+strings.Join(ClusterCIDRs, ","),
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
			if err := n.StopChild("kube-proxy", 10*time.Second); err != nil {
				t.Error(err)
			}
			if out, err := n.Run(context.Background(), bin, "--cleanup"); err != nil {
				t.Errorf("%s: kube-proxy --cleanup: %v: %s", n.Name, err, out)
			}
		})
		err = poll(ctx, time.Minute, "kube-proxy healthy on "+n.Name, func() (bool, error) {
			if !kp.Running() {
				return false, kp.ExitErr()
			}
			client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: c.Dialer(n.NS)}}
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
}
