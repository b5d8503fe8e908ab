// Package e2ereport reads what a run of upstream's e2e.test left (its Ginkgo JSON report
// and its exit status), keeps the record of the tests a focus selects with upstream
// kube-proxy's result, and judges a conformance run against both. It does no I/O beyond
// reading and formatting bytes, so test/cluster's TestConformance and this package's
// unit tests (no root, no cluster) share the whole verdict.
package e2ereport

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// Result is the outcome of one test the focus selected.
type Result struct {
	// Name is the full spec text ("[sig-network] Services should ...").
	Name string
	// State is Ginkgo's: passed, skipped, failed, timedout, panicked, interrupted,
	// aborted.
	State    string
	Duration time.Duration
	// Message is the start of the failure message, or the reason the test skipped
	// itself.
	Message string
}

// Passed reports whether the test passed.
func (r Result) Passed() bool { return r.State == "passed" }

// SkippedWithReason reports whether the test skipped itself and said why (e2e.test's
// e2eskipper: "Requires at least 2 nodes (not 1)"). A skip without a reason is a test
// that did not run.
func (r Result) SkippedWithReason() bool { return r.State == "skipped" && r.Message != "" }

// Report is what one e2e.test run's JSON report says.
type Report struct {
	// Results are the tests the focus selected that the report shows run (passed,
	// failed, or skipped by the test itself), sorted by name.
	Results []Result
	// WillRun is how many tests the focus selected before the run began (Ginkgo's
	// PreRunStats.SpecsThatWillRun): a report with fewer Results stopped early.
	WillRun int
	// SuiteFailures are the reasons the suite as a whole failed: a suite-level node
	// (SynchronizedBeforeSuite, AfterSuite, ReportAfterSuite) that failed, and Ginkgo's
	// special reasons ("Suite Timeout Elapsed", an interrupt).
	SuiteFailures []string
}

// Read reads the Ginkgo JSON report at path (e2e.test --ginkgo.json-report).
func Read(path string) (Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Report{}, err
	}
	r, err := Parse(data)
	if err != nil {
		return Report{}, fmt.Errorf("reading %s: %w", path, err)
	}
	return r, nil
}

// Parse decodes a Ginkgo v2 JSON report. A spec Ginkgo reports skipped with no reason
// and no run time is one the focus did not select (or one a stopped suite never reached:
// WillRun tells the two apart in number, a record of the selection by name).
func Parse(data []byte) (Report, error) {
	var suites []struct {
		SuiteSucceeded             bool
		SpecialSuiteFailureReasons []string
		PreRunStats                struct{ SpecsThatWillRun int }
		SpecReports                []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			RunTime                 time.Duration
			Failure                 struct{ Message string }
		}
	}
	if err := json.Unmarshal(data, &suites); err != nil {
		return Report{}, err
	}
	if len(suites) == 0 {
		return Report{}, fmt.Errorf("the report holds no suite")
	}
	var out Report
	for _, s := range suites {
		out.WillRun += s.PreRunStats.SpecsThatWillRun
		out.SuiteFailures = append(out.SuiteFailures, s.SpecialSuiteFailureReasons...)
		for _, r := range s.SpecReports {
			msg := summary(r.Failure.Message)
			if r.LeafNodeType != "It" {
				// Suite-level nodes: only their failures matter.
				if r.State != "passed" && r.State != "skipped" && r.State != "" {
					out.SuiteFailures = append(out.SuiteFailures, fmt.Sprintf("%s %s: %s", r.LeafNodeType, r.State, msg))
				}
				continue
			}
			if r.State == "pending" || r.State == "skipped" && r.RunTime == 0 && msg == "" {
				continue
			}
			out.Results = append(out.Results, Result{
				Name:     strings.Join(append(r.ContainerHierarchyTexts, r.LeafNodeText), " "),
				State:    r.State,
				Duration: r.RunTime,
				Message:  msg,
			})
		}
	}
	sort.Slice(out.Results, func(i, j int) bool { return out.Results[i].Name < out.Results[j].Name })
	return out, nil
}

// summary is the start of a failure message: its first two non-empty lines (Gomega's
// first is often only "Timed out after 300.000s."), at most 300 bytes.
func summary(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && len(lines) < 2 {
			lines = append(lines, l)
		}
	}
	s = strings.Join(lines, " ")
	if len(s) > 300 {
		s = strings.ToValidUTF8(s[:300], "") + "..."
	}
	return s
}

// Totals counts results by state ("15 passed, 0 failed, 2 skipped").
func Totals(rs []Result) string {
	var passed, skipped, failed int
	for _, r := range rs {
		switch r.State {
		case "passed":
			passed++
		case "skipped":
			skipped++
		default:
			failed++
		}
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped", passed, failed, skipped)
}

// CompareTable formats two sets of results of the same focus side by side, one test a
// line (without prefix), with each side's totals last. A test one side lacks shows "-".
func CompareTable(prefix, aName string, a []Result, bName string, b []Result) string {
	am, bm := byName(a), byName(b)
	names := union(am, bm)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-12s %-12s test\n", aName, bName)
	cell := func(r Result, ok bool) string {
		switch {
		case !ok:
			return "-"
		case r.Duration == 0:
			return r.State
		}
		return fmt.Sprintf("%s %ds", r.State, int(r.Duration.Seconds()))
	}
	for _, n := range names {
		ar, aok := am[n]
		br, bok := bm[n]
		fmt.Fprintf(&sb, "%-12s %-12s %s\n", cell(ar, aok), cell(br, bok), strings.TrimPrefix(n, prefix))
	}
	fmt.Fprintf(&sb, "%s: %s; %s: %s\n", aName, Totals(a), bName, Totals(b))
	return sb.String()
}

func byName(rs []Result) map[string]Result {
	m := make(map[string]Result, len(rs))
	for _, r := range rs {
		m[r.Name] = r
	}
	return m
}
