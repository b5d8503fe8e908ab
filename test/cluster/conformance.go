package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Conformance focuses: the [Conformance] tests of upstream's Services suite plus the two
// that hold a multi-proxy node to dropping what no proxy serves (a Service labelled for a
// proxy that does not run here, a deleted Service; issue 11) (what CI runs), and the whole
// Services suite as far as one node allows (`make conformance`).
const (
	ServicesConformanceFocus = `\[sig-network\] Services (.*\[Conformance\]|should implement service\.kubernetes\.io/service-proxy-name|should be able to up and down services)`
	ServicesFocus            = `\[sig-network\] Services `
	// ServicesSkip leaves out what one node without a cloud cannot run: load balancers,
	// several nodes, and disruptive or slow tests.
	ServicesSkip = `\[Serial\]|\[Disruptive\]|\[Slow\]|\[Flaky\]|LoadBalancer|\[Feature:|multiple nodes|different nodes|ExternalTrafficPolicy|GCE|AWS`
)

// E2EResult is one upstream test's outcome.
type E2EResult struct {
	Name, State string
	Duration    time.Duration
	Failure     string
}

// RunE2E runs upstream's e2e.test (built from the same k8s.io/kubernetes module,
// hack/build-apiserver.sh --conformance) inside the node's namespace against the
// cluster, with the focus and skip regexps, and returns each selected test's outcome;
// the tests still running after timeout are reported timed out.
func (c *Cluster) RunE2E(ctx context.Context, e2eTest, name, focus, skip string, timeout time.Duration) ([]E2EResult, error) {
	dir := filepath.Join(c.Dir, "e2e-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	report := filepath.Join(dir, "report.json")
	args := []string{"--net=/run/netns/" + c.NodeNS, e2eTest,
		"--kubeconfig=" + c.Kubeconfig,
		"--kubectl-path=" + c.Bins["kubectl"],
		"--provider=local",
		"--num-nodes=1",
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
		return nil, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	runErr := cmd.Run()
	results, err := readGinkgoReport(report)
	if err != nil {
		return nil, fmt.Errorf("e2e.test (%v, log %s): %w", runErr, log.Name(), err)
	}
	return results, nil
}

// readGinkgoReport reads the specs of a ginkgo v2 JSON report that ran (passed, failed,
// or skipped at run time), leaving out those the focus did not select.
func readGinkgoReport(path string) ([]E2EResult, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var suites []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			RunTime                 time.Duration
			Failure                 struct{ Message string }
		}
	}
	if err := json.Unmarshal(data, &suites); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var out []E2EResult
	for _, s := range suites {
		for _, r := range s.SpecReports {
			if r.LeafNodeType != "It" || r.State == "skipped" && r.RunTime == 0 && r.Failure.Message == "" {
				continue
			}
			msg := r.Failure.Message
			if i := strings.IndexByte(msg, '\n'); i > 0 {
				msg = msg[:i]
			}
			out = append(out, E2EResult{
				Name:     strings.Join(append(r.ContainerHierarchyTexts, r.LeafNodeText), " "),
				State:    r.State,
				Duration: r.RunTime,
				Failure:  msg,
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// CompareTable formats two runs of the same focus side by side, one test a line, with
// each run's totals last.
func CompareTable(aName string, a []E2EResult, bName string, b []E2EResult) string {
	byName := func(rs []E2EResult) map[string]E2EResult {
		m := map[string]E2EResult{}
		for _, r := range rs {
			m[r.Name] = r
		}
		return m
	}
	am, bm := byName(a), byName(b)
	var names []string
	for n := range am {
		names = append(names, n)
	}
	for n := range bm {
		if _, ok := am[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-10s %-10s test\n", aName, bName)
	cell := func(r E2EResult, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%s %ds", r.State, int(r.Duration.Seconds()))
	}
	for _, n := range names {
		ar, aok := am[n]
		br, bok := bm[n]
		fmt.Fprintf(&sb, "%-10s %-10s %s\n", cell(ar, aok), cell(br, bok), strings.TrimPrefix(n, "[sig-network] Services "))
	}
	fmt.Fprintf(&sb, "%s: %s; %s: %s\n", aName, Totals(a), bName, Totals(b))
	return sb.String()
}

// Totals counts results by state ("15 passed, 0 failed, 0 skipped").
func Totals(rs []E2EResult) string {
	count := map[string]int{}
	for _, r := range rs {
		count[r.State]++
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", count["passed"], count["failed"]+count["panicked"]+count["timedout"]+count["interrupted"], count["skipped"])
}
