// Command testsum reads `go test -json` output on stdin and prints one summary line for a
// test layer (tests passed, failed, skipped, packages, time), the full output of every
// failed test, and the measurement lines tests print ("e2e: ..."), so CI logs stay short
// but carry the figures. It exits 1 unless the layer really ran and passed:
//
//   - a test or a package failed, or a test started and never ended (a panic outside
//     the test's goroutine, a -timeout);
//   - go test's own exit status (-go-status, a file holding it) is not 0 or is missing;
//   - a line on stdin is not test2json's, or go test wrote to stderr (-stderr, a file)
//     anything but module downloads: a `go:` error must not read as a quiet layer;
//   - no package ran tests, or no test passed or failed (all skipped, or none selected).
//
// Tests are counted at their leaves: a subtest that skipped counts as skipped, and a
// parent whose subtests all skipped is not a pass.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// event is one line of test2json output.
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

// options are what summarize needs besides the stream.
type options struct {
	layer    string
	prefixes []string // output lines of passing tests to print, by prefix
	// goStatus names a file holding go test's exit status, stderr one holding its
	// standard error ("": not given). Both are read after the stream ends: go test
	// has exited by then, and the script has written its status.
	goStatus, stderr string
}

func main() {
	layer := flag.String("layer", "tests", "the layer's name for the summary line")
	show := flag.String("show", "e2e: ,coexist: Test,cluster: ", "comma-separated prefixes of output lines to print from passing tests")
	goStatus := flag.String("go-status", "", "a file holding go test's exit status, written when it exits: the layer fails unless it is 0")
	stderr := flag.String("stderr", "", "a file holding go test's standard error: anything but module downloads fails the layer")
	flag.Parse()
	os.Exit(summarize(os.Stdin, os.Stdout, options{layer: *layer, prefixes: strings.Split(*show, ","), goStatus: *goStatus, stderr: *stderr}))
}

// result is what the stream said of one test.
type result struct {
	started bool
	action  string // pass, fail, skip, or "" if it never ended
	parent  bool   // it has subtests
}

// benignStderr are lines go test writes to stderr on a healthy run.
var benignStderr = regexp.MustCompile(`^go: (downloading|extracting|finding) `)

// summarize reads go test -json from in, writes the layer's summary to out (failures
// with their output, skips with their reason, then one LAYER line) and returns the exit
// status: 1 when a test or package failed, or the run cannot be trusted (problems).
func summarize(in io.Reader, out io.Writer, opts options) int {
	start := time.Now()
	st := newStream()
	st.read(in, out, opts.prefixes)
	t := st.tally(out)
	problems := append(st.problems, opts.goProblems(out)...)
	if st.noise > 0 {
		problems = append(problems, fmt.Sprintf("%d line(s) were not go test -json", st.noise))
	}
	ran := st.packagesRan()
	if ran == 0 {
		problems = append(problems, "no package ran tests")
	}
	if t.passed+t.failed == 0 {
		problems = append(problems, fmt.Sprintf("no test ran (%d skipped)", t.skipped))
	}
	if len(t.unfinished) > 0 {
		problems = append(problems, fmt.Sprintf("%d test(s) did not finish", len(t.unfinished)))
	}

	status := "ok"
	if t.failed > 0 || len(st.failedPkgs) > 0 || len(problems) > 0 {
		status = "FAIL"
	}
	line := fmt.Sprintf("LAYER %-12s %s: %d passed, %d failed, %d skipped, %d packages, %s",
		opts.layer, status, t.passed, t.failed, t.skipped, ran, time.Since(start).Round(time.Second))
	if len(problems) > 0 {
		line += " (" + strings.Join(problems, "; ") + ")"
	}
	fmt.Fprintln(out, line)
	if status == "ok" {
		return 0
	}
	if len(t.failedTests) > 0 {
		fmt.Fprintln(out, "failed tests:", strings.Join(t.failedTests, " "))
	}
	if len(t.unfinished) > 0 {
		fmt.Fprintln(out, "tests that did not finish:", strings.Join(t.unfinished, " "))
	}
	if len(st.failedPkgs) > 0 {
		fmt.Fprintln(out, "failed packages:", strings.Join(st.failedPkgs, " "))
	}
	return 1
}

// stream is what the go test -json stream said: each test's result and output, in the
// order the tests first appeared, and each package's.
type stream struct {
	outputs    map[key]*strings.Builder
	tests      map[key]*result
	order      []key
	pkgs       map[string]string // package → pass, fail, or "notests" (skip: no test files)
	failedPkgs []string
	// problems are what makes the stream untrustworthy; noise counts its lines that
	// were not test2json's.
	problems []string
	noise    int
}

func newStream() *stream {
	return &stream{outputs: map[key]*strings.Builder{}, tests: map[key]*result{}, pkgs: map[string]string{}}
}

// get returns the result of test k, recording it (and its ancestors, as parents) on
// first sight.
func (st *stream) get(k key) *result {
	r := st.tests[k]
	if r != nil {
		return r
	}
	r = &result{}
	st.tests[k] = r
	st.order = append(st.order, k)
	// Mark every ancestor as a parent: subtests may start before the stream
	// names their parent (it does not, but a truncated stream might).
	for name := k.test; strings.Contains(name, "/"); {
		name = name[:strings.LastIndex(name, "/")]
		pk := key{k.pkg, name}
		if p := st.tests[pk]; p != nil {
			p.parent = true
		} else {
			st.tests[pk] = &result{parent: true}
			st.order = append(st.order, pk)
		}
	}
	return r
}

// read reads the stream from in, writing to out as they come the compiler's errors,
// the output lines that start with one of prefixes, and the lines that are not
// go test -json.
func (st *stream) read(in io.Reader, out io.Writer, prefixes []string) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Action == "" {
			// Not test2json's: a `go:` error, or something else writing into the
			// stream. Show it, and do not let the layer read as clean.
			fmt.Fprintln(out, "testsum: not go test -json:", sc.Text())
			st.noise++
			continue
		}
		st.event(ev, out, prefixes)
	}
	if err := sc.Err(); err != nil {
		st.problems = append(st.problems, "reading the stream: "+err.Error())
	}
}

// event records one event of the stream.
func (st *stream) event(ev event, out io.Writer, prefixes []string) {
	k := key{ev.Package, ev.Test}
	switch ev.Action {
	case "build-output":
		fmt.Fprint(out, ev.Output) // compiler errors: always shown
	case "output":
		b := st.outputs[k]
		if b == nil {
			b = &strings.Builder{}
			st.outputs[k] = b
		}
		b.WriteString(ev.Output)
		for _, p := range prefixes {
			if p != "" && strings.HasPrefix(strings.TrimSpace(ev.Output), strings.TrimSpace(p)) {
				fmt.Fprint(out, ev.Output)
			}
		}
	case "run":
		if ev.Test != "" {
			st.get(k).started = true
		}
	case "pass", "fail", "skip":
		if ev.Test != "" {
			st.get(k).action = ev.Action
			return
		}
		switch ev.Action {
		case "fail":
			st.pkgs[ev.Package] = "fail"
			st.failedPkgs = append(st.failedPkgs, ev.Package)
		case "skip":
			st.pkgs[ev.Package] = "notests" // [no test files]
		default:
			st.pkgs[ev.Package] = "pass"
		}
	}
}

// packagesRan counts the packages that had tests.
func (st *stream) packagesRan() int {
	ran := 0
	for _, state := range st.pkgs {
		if state != "notests" {
			ran++
		}
	}
	return ran
}

// tally is the tests counted: a parent at its leaves, unless it failed on its own.
type tally struct {
	passed, failed, skipped int
	failedTests, unfinished []string
}

// tally counts the tests and writes to out the output of each that failed or did not
// finish, of each failed package, and the reason of each skip.
func (st *stream) tally(out io.Writer) tally {
	var t tally
	var skips []string
	failedBelow := map[key]bool{} // a parent with a failed or unfinished descendant
	for _, k := range st.order {
		r := st.tests[k]
		if r.action == "fail" || (r.started && r.action == "") {
			for name := k.test; strings.Contains(name, "/"); {
				name = name[:strings.LastIndex(name, "/")]
				failedBelow[key{k.pkg, name}] = true
			}
		}
	}
	for _, k := range st.order {
		r := st.tests[k]
		name := k.pkg + "." + k.test
		switch {
		case r.started && r.action == "":
			// Started and never ended: the binary died under it (a panic in
			// another goroutine, -timeout). Its package failed; name the test.
			t.failed++
			t.unfinished = append(t.unfinished, name)
			if b := st.outputs[k]; b != nil {
				fmt.Fprintf(out, "--- DID NOT FINISH %s:\n%s", name, b.String())
			}
		case r.parent:
			// Counted at its leaves, unless it failed on its own (a cleanup, an
			// error after its subtests passed).
			// Its own output is shown either way: a subtest's panic is printed there.
			if r.action == "fail" && !failedBelow[k] {
				t.failed++
				t.failedTests = append(t.failedTests, name)
			}
			if b := st.outputs[k]; b != nil && r.action == "fail" {
				fmt.Fprintf(out, "--- FAIL %s:\n%s", name, b.String())
			}
		case r.action == "pass":
			t.passed++
		case r.action == "skip":
			t.skipped++
			skips = append(skips, name+": "+lastLine(st.outputs[k]))
		case r.action == "fail":
			t.failed++
			t.failedTests = append(t.failedTests, name)
			if b := st.outputs[k]; b != nil {
				fmt.Fprintf(out, "--- FAIL %s:\n%s", name, b.String())
			}
		}
	}
	for _, p := range st.failedPkgs {
		if b := st.outputs[key{p, ""}]; b != nil {
			fmt.Fprintf(out, "--- package %s failed:\n%s", p, b.String())
		}
	}
	sort.Strings(skips)
	for _, s := range skips {
		fmt.Fprintln(out, "skipped:", s)
	}
	return t
}

// goProblems reads go test's exit status and standard error, if given, and returns
// what fails the layer: a status other than 0 or unknown, and stderr lines other than
// module downloads (written to out).
func (opts options) goProblems(out io.Writer) []string {
	var problems []string
	if opts.goStatus != "" {
		b, err := os.ReadFile(opts.goStatus)
		status, convErr := strconv.Atoi(strings.TrimSpace(string(b)))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("go test's exit status is unknown: %v", err))
		case convErr != nil:
			problems = append(problems, fmt.Sprintf("go test's exit status is unknown (%q)", strings.TrimSpace(string(b))))
		case status != 0:
			problems = append(problems, fmt.Sprintf("go test exited %d", status))
		}
	}
	if opts.stderr != "" {
		b, err := os.ReadFile(opts.stderr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("go test's stderr is unknown: %v", err))
		}
		var stderrLines int
		for _, l := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(l) == "" || benignStderr.MatchString(l) {
				continue
			}
			fmt.Fprintln(out, "testsum: go test stderr:", l)
			stderrLines++
		}
		if stderrLines > 0 {
			problems = append(problems, fmt.Sprintf("go test wrote %d line(s) to stderr", stderrLines))
		}
	}
	return problems
}

func lastLine(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "---") && !strings.HasPrefix(l, "===") {
			return l
		}
	}
	return ""
}
