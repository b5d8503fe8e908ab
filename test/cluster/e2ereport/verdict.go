package e2ereport

import (
	"fmt"
	"sort"
)

// Run is one e2e.test run of a focus against the node with one proxy.
type Run struct {
	// Proxy names the node's Service proxy during the run ("shardproxy", "kube-proxy").
	Proxy  string
	Report Report
	// Exit is e2e.test's exit status: nil when it exited 0.
	Exit error
}

// Verdict is what a conformance run means. The run passes only when both lists are
// empty; Skipped is listed either way.
type Verdict struct {
	// Failures are selected tests shardproxy did not pass: failed, timed out, never run,
	// or skipped where kube-proxy passed.
	Failures []string
	// HarnessFaults say the runs cannot be trusted, whatever shardproxy did: the
	// kube-proxy baseline did not pass a test, the runs or the record selected different
	// tests, e2e.test's exit status contradicts its report.
	HarnessFaults []string
	// Skipped are the tests e2e.test skipped itself in shardproxy's run, with the
	// reason it gave.
	Skipped []string
}

// OK reports whether the run passes.
func (v Verdict) OK() bool { return len(v.Failures) == 0 && len(v.HarnessFaults) == 0 }

// Judge decides a conformance run: shardproxy's run of sel, upstream kube-proxy's run of
// the same selection (nil when not run), and the repository's record of sel (nil when
// there is none or it is being rewritten). Every test the focus selects must pass with
// shardproxy or skip itself with a reason; the runs and the record must select the same
// tests; the baseline must pass; e2e.test's exit status must agree with its report.
func Judge(sel Selection, shardproxy Run, baseline *Run, record *Record) Verdict {
	var v Verdict
	v.judgeRun(shardproxy, v.fail)
	if baseline != nil {
		v.judgeRun(*baseline, v.fault)
	}
	ref, refName := v.reference(sel, shardproxy, baseline, record)
	v.judgeAgainst(shardproxy, ref, refName)
	return v
}

func (v *Verdict) fail(format string, args ...any) {
	v.Failures = append(v.Failures, fmt.Sprintf(format, args...))
}

func (v *Verdict) fault(format string, args ...any) {
	v.HarnessFaults = append(v.HarnessFaults, fmt.Sprintf(format, args...))
}

// judgeRun checks one run on its own: complete, and its exit status agreeing with its
// report. report is how its shortcomings count: a shardproxy run that stopped early did
// not pass what it never ran (a failure); a baseline that did is a harness fault.
func (v *Verdict) judgeRun(run Run, report func(format string, args ...any)) {
	rep := run.Report
	for _, reason := range rep.SuiteFailures {
		report("%s run: the suite failed: %s", run.Proxy, reason)
	}
	switch {
	case len(rep.Results) == 0 && rep.WillRun == 0:
		report("%s run: the focus selected no test", run.Proxy)
	case len(rep.Results) < rep.WillRun:
		report("%s run: the report shows %d of the %d tests the focus selected run; the rest never ran", run.Proxy, len(rep.Results), rep.WillRun)
	case len(rep.Results) > rep.WillRun:
		v.fault("%s run: the report shows %d tests run, more than the %d the focus selected", run.Proxy, len(rep.Results), rep.WillRun)
	}
	failed := len(rep.SuiteFailures) > 0
	for _, r := range rep.Results {
		failed = failed || !r.Passed() && r.State != "skipped"
	}
	switch {
	case run.Exit != nil && !failed:
		v.fault("%s run: e2e.test exited with %v, but its report shows every test passed or skipped", run.Proxy, run.Exit)
	case run.Exit == nil && failed:
		v.fault("%s run: e2e.test exited 0, but its report shows a failure", run.Proxy)
	}
}

// reference returns what kube-proxy does, by test name, and what it is called: this
// run's baseline, else the record (nil when neither). It checks the record against the
// selection and the baseline against the record on the way.
func (v *Verdict) reference(sel Selection, shardproxy Run, baseline *Run, record *Record) (map[string]Result, string) {
	var ref map[string]Result
	refName := ""
	if record != nil {
		if record.Selection != sel {
			v.fault("the record is of e2e.test %s, focus %q, skip %q; this run is of %s, %q, %q: rewrite the record", record.Version, record.Focus, record.Skip, sel.Version, sel.Focus, sel.Skip)
		}
		ref, refName = byName(record.Tests), "the record"
		if n := shardproxy.Report.WillRun; n != len(record.Tests) {
			v.fault("e2e.test selected %d tests with shardproxy; the record lists %d", n, len(record.Tests))
		}
	}
	if baseline == nil {
		return ref, refName
	}
	b := baseline.Report
	for _, r := range b.Results {
		if !r.Passed() && !r.SkippedWithReason() {
			v.fault("kube-proxy baseline %s: %s: %s (the baseline must pass every test it runs: the node or the harness is broken, not shardproxy)", r.State, r.Name, r.Message)
		}
	}
	if b.WillRun != shardproxy.Report.WillRun {
		v.fault("e2e.test selected %d tests with shardproxy, %d with kube-proxy", shardproxy.Report.WillRun, b.WillRun)
	}
	if record != nil {
		v.baselineAgainstRecord(byName(b.Results), ref)
	}
	return byName(b.Results), "kube-proxy's run"
}

// baselineAgainstRecord checks that kube-proxy's run gave what the record says.
func (v *Verdict) baselineAgainstRecord(run, record map[string]Result) {
	for _, name := range union(run, record) {
		got, inRun := run[name]
		want, inRecord := record[name]
		switch {
		case !inRecord:
			v.fault("kube-proxy run: %s: %s, not in the record: rewrite the record", name, got.State)
		case !inRun:
			v.fault("kube-proxy run: %s: not run, the record says %s", name, want.State)
		case got.State != want.State:
			v.fault("kube-proxy run: %s: %s, the record says %s: rewrite the record", name, got.State, want.State)
		}
	}
}

// judgeAgainst checks every selected test, shardproxy's run against the reference ref
// (nil: none): each must pass, or skip itself with a reason where kube-proxy did not
// pass it either.
func (v *Verdict) judgeAgainst(shardproxy Run, ref map[string]Result, refName string) {
	got := byName(shardproxy.Report.Results)
	for _, name := range union(got, ref) {
		r, ran := got[name]
		want, inRef := ref[name]
		switch {
		case !ran:
			v.fail("%s: not run with shardproxy (%s: %s)", name, refName, want.State)
			continue
		case ref != nil && !inRef:
			v.fault("%s: selected with shardproxy, not in %s: the two must select the same tests", name, refName)
		}
		switch {
		case r.Passed():
		case r.SkippedWithReason() && inRef && want.Passed():
			v.fail("%s: skipped with shardproxy (%s), passed with kube-proxy", name, r.Message)
		case r.SkippedWithReason():
			v.Skipped = append(v.Skipped, fmt.Sprintf("%s: %s", name, r.Message))
		case r.Message == "":
			v.fail("%s: %s with shardproxy, no reason given", name, r.State)
		default:
			v.fail("%s: %s with shardproxy: %s", name, r.State, r.Message)
		}
	}
}

func union(a, b map[string]Result) []string {
	var names []string
	for n := range a {
		names = append(names, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}
