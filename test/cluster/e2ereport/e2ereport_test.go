package e2ereport

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The reports in testdata are real Ginkgo v2.28.1 JSON reports (the Ginkgo e2e.test
// v1.36.3 is built with) of a stand-in suite, recorded with their exit statuses by
// testdata/standin/gen.sh: five [sig-network] Services tests the focus selects (one
// skips itself: "Requires at least 2 nodes (not 1)"), two it leaves out. Beside them,
// e2e-v1.36.3-ci.json is e2e.test's own report of CI's focus with kube-proxy on the
// cluster layer's two nodes (2026-11-29, the run that wrote ../testdata's record),
// trimmed: the captured output and events of each spec, and all but three of the 7,555
// specs the focus left out, removed.
const (
	basic      = "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
	affinity   = "[sig-network] Services should have session affinity timeout work for service with type clusterIP [LinuxOnly]"
	upDown     = "[sig-network] Services should be able to up and down services"
	fallback   = "[sig-network] Services should fallback to local terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Local"
	proxyName  = "[sig-network] Services should implement service.kubernetes.io/service-proxy-name"
	twoNodes   = "Requires at least 2 nodes (not 1)"
	standinVer = "v1.36.3"
)

var sel = Selection{Version: standinVer, Focus: `\[sig-network\] Services `, Skip: `\[Slow\]`}

// recorded returns the report testdata/name.json and the exit status name.exit records.
func recorded(t *testing.T, name string) (Report, error) {
	t.Helper()
	rep, err := Read(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("testdata", name+".exit"))
	if err != nil {
		t.Fatal(err)
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		return rep, errors.New("exit status " + strconv.Itoa(code))
	}
	return rep, nil
}

func run(t *testing.T, proxy, name string) *Run {
	t.Helper()
	rep, exit := recorded(t, name)
	return &Run{Proxy: proxy, Report: rep, Exit: exit}
}

func recordOf(t *testing.T, name string) *Record {
	t.Helper()
	rep, _ := recorded(t, name)
	rec, err := NewRecord(sel, rep)
	if err != nil {
		t.Fatal(err)
	}
	return &rec
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name          string
		want          []Result
		willRun       int
		suiteFailures []string
	}{{
		name:    "all-passed",
		willRun: 5,
		want: []Result{
			{Name: upDown, State: "passed"},
			{Name: fallback, State: "skipped", Message: twoNodes},
			{Name: affinity, State: "passed"},
			{Name: proxyName, State: "passed"},
			{Name: basic, State: "passed"},
		},
	}, {
		name:    "one-failed",
		willRun: 5,
		want: []Result{
			{Name: upDown, State: "failed", Message: "service is not reachable within 2m0s timeout on endpoint 10.96.12.7:80 over TCP protocol more detail"},
			{Name: fallback, State: "skipped", Message: twoNodes},
			{Name: affinity, State: "passed"},
			{Name: proxyName, State: "passed"},
			{Name: basic, State: "passed"},
		},
	}, {
		// The suite timeout cut the affinity test; the three after it never ran and
		// look like tests the focus left out, but for WillRun.
		name:    "suite-timeout",
		willRun: 5,
		want: []Result{
			{Name: upDown, State: "passed"},
			{Name: affinity, State: "timedout", Message: "A suite timeout occurred"},
		},
		suiteFailures: []string{"Suite Timeout Elapsed"},
	}, {
		name:    "e2e-v1.36.3-ci",
		willRun: 24,
		want:    realCI,
	}, {
		name:          "suite-broken",
		willRun:       5,
		suiteFailures: []string{"SynchronizedBeforeSuite failed: error waiting for all pods to be running and ready: node-1 is not ready"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rep, _ := recorded(t, tc.name)
			if rep.WillRun != tc.willRun {
				t.Errorf("WillRun %d, want %d", rep.WillRun, tc.willRun)
			}
			var got []Result
			for _, r := range rep.Results {
				if r.Passed() && r.Duration <= 0 {
					t.Errorf("%s: passed in %v", r.Name, r.Duration)
				}
				r.Duration = 0
				got = append(got, r)
			}
			if !equalResults(got, tc.want) {
				t.Errorf("results:\n%v\nwant:\n%v", got, tc.want)
			}
			if strings.Join(rep.SuiteFailures, "|") != strings.Join(tc.suiteFailures, "|") {
				t.Errorf("suite failures %q, want %q", rep.SuiteFailures, tc.suiteFailures)
			}
		})
	}
}

// realCI is what e2e.test v1.36.3 ran of CI's focus on two nodes: every test passed.
var realCI = func() []Result {
	var rs []Result
	for _, name := range []string{
		"should be able to change the type from ClusterIP to ExternalName [Conformance]",
		"should be able to change the type from ExternalName to ClusterIP [Conformance]",
		"should be able to change the type from ExternalName to NodePort [Conformance]",
		"should be able to change the type from NodePort to ExternalName [Conformance]",
		"should be able to create a functioning NodePort service [Conformance]",
		"should be able to switch session affinity for NodePort service [LinuxOnly] [Conformance]",
		"should be able to switch session affinity for service with type clusterIP [LinuxOnly] [Conformance]",
		"should be able to up and down services",
		"should complete a service status lifecycle [Conformance]",
		"should delete a collection of services [Conformance]",
		"should fail health check node port if there are only terminating endpoints",
		"should fallback to terminating endpoints when there are no ready endpoints with externallTrafficPolicy=Cluster",
		"should fallback to terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Cluster",
		"should find a service from listing all namespaces [Conformance]",
		"should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
		"should have session affinity work for service with type clusterIP [LinuxOnly] [Conformance]",
		"should implement service.kubernetes.io/service-proxy-name",
		"should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]",
		"should respect internalTrafficPolicy=Local Pod (hostNetwork: true) to Pod",
		"should respect internalTrafficPolicy=Local Pod to Pod",
		"should serve a basic endpoint from pods [Conformance]",
		"should serve endpoints on same port and different protocols [Conformance]",
		"should serve multiport endpoints from pods [Conformance]",
		"should support externalTrafficPolicy=Local for type=NodePort",
	} {
		rs = append(rs, Result{Name: "[sig-network] Services " + name, State: "passed"})
	}
	return rs
}()

func equalResults(a, b []Result) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, data string }{
		{"not JSON", "<testsuites/>"},
		{"no suite", "[]"},
	} {
		if _, err := Parse([]byte(tc.data)); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

func TestJudge(t *testing.T) {
	staleRecord := func(t *testing.T) *Record {
		rec := recordOf(t, "all-passed")
		rec.Tests = rec.Tests[1:] // upDown
		rec.Tests[0] = Result{Name: fallback, State: "passed"}
		rec.Tests = append(rec.Tests, Result{Name: "[sig-network] Services should be gone", State: "passed"})
		return rec
	}
	for _, tc := range []struct {
		name       string
		shardproxy string
		exit       func(error) error // overrides shardproxy's recorded exit status
		baseline   string            // "" for no kube-proxy run
		record     func(*testing.T) *Record
		// Substrings of each failure, harness fault and skip line, in order.
		failures, faults, skipped []string
	}{{
		name:       "all selected tests passed or skipped with a reason, against the record",
		shardproxy: "all-passed",
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		skipped:    []string{fallback + ": " + twoNodes},
	}, {
		name:       "all selected tests passed or skipped with a reason, against kube-proxy",
		shardproxy: "all-passed",
		baseline:   "all-passed",
		skipped:    []string{fallback + ": " + twoNodes},
	}, {
		name:       "all passed, against kube-proxy and the record",
		shardproxy: "all-passed",
		baseline:   "all-passed",
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		skipped:    []string{fallback + ": " + twoNodes},
	}, {
		name:       "a custom focus with neither record nor baseline is still absolute",
		shardproxy: "one-failed",
		failures:   []string{upDown + ": failed with shardproxy: service is not reachable"},
		skipped:    []string{fallback},
	}, {
		name:       "a test failed with shardproxy, kube-proxy passed it in the record",
		shardproxy: "one-failed",
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		failures:   []string{upDown + ": failed with shardproxy: service is not reachable"},
		skipped:    []string{fallback},
	}, {
		name:       "a test failed with both proxies: a failure and a harness fault",
		shardproxy: "one-failed",
		baseline:   "one-failed",
		failures:   []string{upDown + ": failed with shardproxy"},
		faults:     []string{"kube-proxy baseline failed: " + upDown + ": service is not reachable"},
		skipped:    []string{fallback},
	}, {
		name:       "tests missing from shardproxy's report: the suite timed out",
		shardproxy: "suite-timeout",
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		failures: []string{
			"shardproxy run: the suite failed: Suite Timeout Elapsed",
			"shardproxy run: the report shows 2 of the 5 tests the focus selected run",
			affinity + ": timedout with shardproxy: A suite timeout occurred",
			proxyName + ": not run with shardproxy (the record: passed)",
			basic + ": not run with shardproxy (the record: passed)",
			fallback + ": not run with shardproxy (the record: skipped)",
		},
	}, {
		name:       "tests missing from shardproxy's report with kube-proxy run too",
		shardproxy: "suite-timeout",
		baseline:   "all-passed",
		failures: []string{
			"Suite Timeout Elapsed",
			"the report shows 2 of the 5",
			affinity + ": timedout",
			proxyName + ": not run with shardproxy (kube-proxy's run: passed)",
			basic + ": not run",
			fallback + ": not run",
		},
	}, {
		name:       "shardproxy's run selected one test fewer than the record",
		shardproxy: "other-skip",
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		failures:   []string{proxyName + ": not run with shardproxy (the record: passed)"},
		faults:     []string{"e2e.test selected 4 tests with shardproxy; the record lists 5"},
		skipped:    []string{fallback},
	}, {
		name:       "the two runs selected different tests",
		shardproxy: "all-passed",
		baseline:   "other-skip",
		faults: []string{
			"e2e.test selected 5 tests with shardproxy, 4 with kube-proxy",
			proxyName + ": selected with shardproxy, not in kube-proxy's run",
		},
		skipped: []string{fallback},
	}, {
		name:       "the kube-proxy run broke: a harness fault",
		shardproxy: "all-passed",
		baseline:   "suite-broken",
		faults: []string{
			"kube-proxy run: the suite failed: SynchronizedBeforeSuite failed: error waiting for all pods",
			"kube-proxy run: the report shows 0 of the 5 tests the focus selected run",
			upDown + ": selected with shardproxy, not in kube-proxy's run",
			fallback + ": selected with shardproxy, not in kube-proxy's run",
			affinity + ": selected with shardproxy",
			proxyName + ": selected with shardproxy",
			basic + ": selected with shardproxy",
		},
		skipped: []string{fallback},
	}, {
		name:       "the shardproxy run broke",
		shardproxy: "suite-broken",
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		failures: []string{
			"shardproxy run: the suite failed: SynchronizedBeforeSuite failed",
			"shardproxy run: the report shows 0 of the 5",
			upDown + ": not run with shardproxy",
			fallback + ": not run with shardproxy",
			affinity + ": not run with shardproxy",
			proxyName + ": not run with shardproxy",
			basic + ": not run with shardproxy",
		},
	}, {
		name:       "e2e.test exited non-zero though its report shows all passed",
		shardproxy: "all-passed",
		exit:       func(error) error { return errors.New("exit status 1") },
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		faults:     []string{"shardproxy run: e2e.test exited with exit status 1, but its report shows every test passed or skipped"},
		skipped:    []string{fallback},
	}, {
		name:       "e2e.test exited 0 though its report shows a failure",
		shardproxy: "one-failed",
		exit:       func(error) error { return nil },
		record:     func(t *testing.T) *Record { return recordOf(t, "all-passed") },
		failures:   []string{upDown + ": failed"},
		faults:     []string{"shardproxy run: e2e.test exited 0, but its report shows a failure"},
		skipped:    []string{fallback},
	}, {
		name:       "skipped with shardproxy where kube-proxy passed",
		shardproxy: "all-passed",
		record: func(t *testing.T) *Record {
			rec := recordOf(t, "all-passed")
			for i := range rec.Tests {
				rec.Tests[i].State, rec.Tests[i].Message = "passed", ""
			}
			return rec
		},
		failures: []string{fallback + ": skipped with shardproxy (" + twoNodes + "), passed with kube-proxy"},
	}, {
		name:       "kube-proxy's results differ from the record",
		shardproxy: "all-passed",
		baseline:   "all-passed",
		record:     staleRecord,
		faults: []string{
			"kube-proxy run: " + upDown + ": passed, not in the record: rewrite the record",
			"kube-proxy run: [sig-network] Services should be gone: not run, the record says passed",
			"kube-proxy run: " + fallback + ": skipped, the record says passed: rewrite the record",
		},
		skipped: []string{fallback},
	}, {
		name:       "the record is of another focus",
		shardproxy: "all-passed",
		record: func(t *testing.T) *Record {
			rec := recordOf(t, "all-passed")
			rec.Focus = `\[sig-network\] Services .*\[Conformance\]`
			return rec
		},
		faults:  []string{`the record is of e2e.test v1.36.3, focus "\\[sig-network\\] Services .*\\[Conformance\\]"`},
		skipped: []string{fallback},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			sp := run(t, "shardproxy", tc.shardproxy)
			if tc.exit != nil {
				sp.Exit = tc.exit(sp.Exit)
			}
			var baseline *Run
			if tc.baseline != "" {
				baseline = run(t, "kube-proxy", tc.baseline)
			}
			var record *Record
			if tc.record != nil {
				record = tc.record(t)
			}
			v := Judge(sel, *sp, baseline, record)
			check(t, "failures", v.Failures, tc.failures)
			check(t, "harness faults", v.HarnessFaults, tc.faults)
			check(t, "skipped", v.Skipped, tc.skipped)
			if want := len(tc.failures) == 0 && len(tc.faults) == 0; v.OK() != want {
				t.Errorf("OK() = %v, want %v", v.OK(), want)
			}
		})
	}
}

// check compares got with want, an entry a substring of each, order-insensitively.
func check(t *testing.T, what string, got, want []string) {
	t.Helper()
	left := append([]string(nil), got...)
	var missing []string
	for _, w := range want {
		i := 0
		for i < len(left) && !strings.Contains(left[i], w) {
			i++
		}
		if i == len(left) {
			missing = append(missing, w)
			continue
		}
		left = append(left[:i], left[i+1:]...)
	}
	if len(missing) > 0 || len(left) > 0 {
		t.Errorf("%s:\n  got:\n    %s\n  missing:\n    %s\n  unexpected:\n    %s", what,
			strings.Join(got, "\n    "), strings.Join(missing, "\n    "), strings.Join(left, "\n    "))
	}
}

func TestRecordRoundTrip(t *testing.T) {
	rec := recordOf(t, "all-passed")
	data := rec.Format()
	want := "version\tv1.36.3\nfocus\t\\[sig-network\\] Services \nskip\t\\[Slow\\]\n" +
		"passed\t" + upDown + "\n" +
		"skipped\t" + fallback + "\t" + twoNodes + "\n" +
		"passed\t" + affinity + "\n" +
		"passed\t" + proxyName + "\n" +
		"passed\t" + basic + "\n"
	if body, ok := strings.CutPrefix(string(data), recordHeader); !ok || body != want {
		t.Errorf("Format:\n%s\nwant the header, then:\n%s", data, want)
	}
	got, err := ParseRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Selection != rec.Selection || !equalResults(got.Tests, rec.Tests) {
		t.Errorf("ParseRecord(Format()) = %+v, want %+v", got, rec)
	}
}

func TestNewRecordRefusesABaselineThatFailed(t *testing.T) {
	for _, name := range []string{"one-failed", "suite-timeout", "suite-broken"} {
		rep, _ := recorded(t, name)
		if _, err := NewRecord(sel, rep); err == nil {
			t.Errorf("%s: recorded", name)
		}
	}
}

func TestParseRecordErrors(t *testing.T) {
	head := "version\tv1.36.3\nfocus\tx\n"
	for _, tc := range []struct{ name, data, wantErr string }{
		{"failed result", head + "failed\ta test\n", "line 3: want version"},
		{"skip without reason", head + "skipped\ta test\n", "line 3: want version"},
		{"spaces for tabs", head + "passed a test\n", "line 3: want version"},
		{"listed twice", head + "passed\ta test\npassed\ta test\n", `line 4: "a test" listed twice`},
		{"no focus", "version\tv1.36.3\npassed\ta test\n", "no version or focus line"},
		{"no test", head, "no test listed"},
	} {
		_, err := ParseRecord([]byte(tc.data))
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestCompareTable(t *testing.T) {
	a := []Result{{Name: "[sig-network] Services x", State: "passed"}, {Name: "[sig-network] Services y", State: "failed"}}
	b := []Result{{Name: "[sig-network] Services x", State: "passed"}}
	got := CompareTable("[sig-network] Services ", "shardproxy", a, "kube-proxy", b)
	want := "shardproxy   kube-proxy   test\n" +
		"passed       passed       x\n" +
		"failed       -            y\n" +
		"shardproxy: 1 passed, 1 failed, 0 skipped; kube-proxy: 1 passed, 0 failed, 0 skipped\n"
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestRepositoryRecords parses the records TestConformance keeps (test/cluster/testdata),
// and holds e2e.test's real report of CI's focus to the one of its version.
func TestRepositoryRecords(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("..", "testdata", "conformance-*.txt"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no record in ../testdata (%v)", err)
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := ParseRecord(data)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if filepath.Base(path) != "conformance-"+standinVer+"-ci.txt" {
			continue
		}
		rep, exit := recorded(t, "e2e-v1.36.3-ci")
		if v := Judge(rec.Selection, Run{Proxy: "shardproxy", Report: rep, Exit: exit}, nil, &rec); !v.OK() {
			t.Errorf("e2e.test's report of CI's focus against %s:\n%s", path, strings.Join(append(v.Failures, v.HarnessFaults...), "\n"))
		}
	}
}

func TestSummary(t *testing.T) {
	long := strings.Repeat("x", 400)
	for _, tc := range []struct{ in, want string }{
		{"Timed out after 300.000s.\nexpected pod to be running\n  <*v1.Pod>: ...", "Timed out after 300.000s. expected pod to be running"},
		{"\n  one line  \n\n", "one line"},
		{long, long[:300] + "..."},
	} {
		if got := summary(tc.in); got != tc.want {
			t.Errorf("summary(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
