package e2ereport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// Selection is what decides which tests a run selects: e2e.test's version and the focus
// and skip regexps.
type Selection struct {
	Version, Focus, Skip string
}

// Record is the list of the tests a Selection selects with upstream kube-proxy's result
// for each (passed, or skipped by the test itself with its reason), kept in the
// repository so that a run without kube-proxy is still checked for selecting the same
// tests, and for passing what kube-proxy passes.
type Record struct {
	Selection
	// Tests are sorted by name; State is passed or skipped, Message the skip reason.
	Tests []Result
}

const recordHeader = `# The tests e2e.test selects with this focus and skip, each with upstream kube-proxy's
# (nftables) result on test/cluster's node. TestConformance checks every run against it;
# SHARDPROXY_CONFORMANCE_RECORD=1 rewrites it from a kube-proxy run (test/cluster/upstream_test.go).
# Lines: "version|focus|skip<TAB>value", "passed<TAB>test", "skipped<TAB>test<TAB>reason".
`

// NewRecord records a baseline run's results. It refuses a run with a result other
// than passed or skipped with a reason: the record is of a baseline that passed.
func NewRecord(sel Selection, baseline Report) (Record, error) {
	rec := Record{Selection: sel}
	var errs []error
	for _, r := range baseline.Results {
		if !r.Passed() && !r.SkippedWithReason() {
			errs = append(errs, fmt.Errorf("%s: %s: %s", r.Name, r.State, r.Message))
			continue
		}
		rec.Tests = append(rec.Tests, Result{Name: r.Name, State: r.State, Message: r.Message})
	}
	if len(rec.Tests) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("the run selected no test"))
	}
	if err := errors.Join(errs...); err != nil {
		return Record{}, fmt.Errorf("not recording a baseline that did not pass:\n%w", err)
	}
	return rec, nil
}

// Format returns the record as the text ParseRecord reads.
func (r Record) Format() []byte {
	var b bytes.Buffer
	b.WriteString(recordHeader)
	fmt.Fprintf(&b, "version\t%s\nfocus\t%s\nskip\t%s\n", r.Version, r.Focus, r.Skip)
	for _, t := range r.Tests {
		if t.State == "skipped" {
			fmt.Fprintf(&b, "skipped\t%s\t%s\n", t.Name, t.Message)
		} else {
			fmt.Fprintf(&b, "%s\t%s\n", t.State, t.Name)
		}
	}
	return b.Bytes()
}

// ParseRecord reads a record Format wrote; every problem is reported with its line.
func ParseRecord(data []byte) (Record, error) {
	var rec Record
	var errs []error
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("line %d: %s", n, fmt.Sprintf(format, args...)))
		}
		switch {
		case len(f) == 2 && f[0] == "version":
			rec.Version = f[1]
		case len(f) == 2 && f[0] == "focus":
			rec.Focus = f[1]
		case len(f) == 2 && f[0] == "skip":
			rec.Skip = f[1]
		case len(f) == 2 && f[0] == "passed", len(f) == 3 && f[0] == "skipped" && f[2] != "":
			if seen[f[1]] {
				bad("%q listed twice", f[1])
			}
			seen[f[1]] = true
			t := Result{Name: f[1], State: f[0]}
			if len(f) == 3 {
				t.Message = f[2]
			}
			rec.Tests = append(rec.Tests, t)
		default:
			bad("want version, focus, skip, passed or skipped (with a reason), tab-separated: %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if rec.Version == "" || rec.Focus == "" {
		errs = append(errs, errors.New("no version or focus line"))
	}
	if len(rec.Tests) == 0 {
		errs = append(errs, errors.New("no test listed"))
	}
	return rec, errors.Join(errs...)
}
