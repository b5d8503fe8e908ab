package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shardproxy/shardproxy/test/cluster/e2ereport"
)

// Conformance focuses and skips. CI runs ServicesConformanceFocus: the [Conformance]
// tests of upstream's Services suite, the two that hold a multi-proxy node to dropping
// what no proxy serves (a Service labelled for a proxy that does not run here, a
// deleted Service; issue 11), and the seven two-node tests that take seconds, not
// minutes (issue 30: 144 s together on two nodes; the other five two-node tests take
// 58-71 s each and only `make conformance` runs them). `make conformance` runs
// ServicesFocus: the whole Services suite, the tests that need several nodes and the
// ExternalTrafficPolicy ones included, and the [Feature:IPv6DualStack] tests that
// reach Services (issue 30). Both run with ServicesSkip.
const (
	ServicesConformanceFocus = `\[sig-network\] Services (.*\[Conformance\]|should implement service\.kubernetes\.io/service-proxy-name|should be able to up and down services|` +
		`should preserve source pod IP|should fail health check node port|should support externalTrafficPolicy=Local for type=NodePort|` +
		`should respect internalTrafficPolicy=Local Pod (\(hostNetwork: true\) )?to Pod|should fallback to terminating endpoints)`
	ServicesFocus = `\[sig-network\] Services |\[sig-network\] \[Feature:IPv6DualStack\] .*[Ss]ervice`
	// ServicesSkip leaves out only what no node here can do: the disruptive tests (they
	// delete kube-proxy's and kube-apiserver's pods, which are not pods here, and
	// disturb every test beside them) and SCTP traffic (the kernel answers
	// EPROTONOSUPPORT to an SCTP socket). Cloud load balancers are tested in
	// "[sig-network] LoadBalancers", which the focus does not select; no Services test
	// needs GCE or AWS. On CI's focus it leaves out nothing: no test it selects is
	// disruptive or SCTP.
	ServicesSkip = `\[Disruptive\]|\[Feature:SCTPConnectivity\]`
)

// conformancePrefix is what the side-by-side table leaves out of every test's name.
const conformancePrefix = "[sig-network] "

// RunE2E runs upstream's e2e.test (built from the same k8s.io/kubernetes module,
// hack/build-apiserver.sh --conformance) inside the first node's namespace against the
// cluster, with the focus and skip regexps, and returns its report and exit status,
// named for proxy, the node's Service proxy; the tests still running after timeout are
// reported timed out, those not reached by then not run. The error is for a run that
// left no readable report.
func (c *Cluster) RunE2E(ctx context.Context, e2eTest, proxy, focus, skip string, timeout time.Duration) (e2ereport.Run, error) {
	dir := filepath.Join(c.Dir, "e2e-"+proxy)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return e2ereport.Run{}, err
	}
	report := filepath.Join(dir, "report.json")
	args := []string{"--net=/run/netns/" + c.Nodes[0].NS, e2eTest,
		"--kubeconfig=" + c.Kubeconfig,
		"--kubectl-path=" + c.Bins["kubectl"],
		"--provider=local",
		"--num-nodes=" + strconv.Itoa(len(c.Nodes)),
		"--report-dir=" + dir,
		"--ginkgo.focus=" + focus,
		"--ginkgo.skip=" + skip,
		"--ginkgo.json-report=" + report,
		"--ginkgo.timeout=" + timeout.String(),
		"--ginkgo.no-color",
		"--ginkgo.v",
	}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	log, err := os.Create(filepath.Join(dir, "e2e.log"))
	if err != nil {
		return e2ereport.Run{}, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	// The exit status is kept, not judged here: e2ereport.Judge holds it against the
	// report (a non-zero exit with every test passed is a harness fault).
	runErr := cmd.Run()
	rep, err := e2ereport.Read(report)
	if err != nil {
		return e2ereport.Run{}, fmt.Errorf("e2e.test (%v, log %s): %w", runErr, log.Name(), err)
	}
	return e2ereport.Run{Proxy: proxy, Report: rep, Exit: runErr}, nil
}
