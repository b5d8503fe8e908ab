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

func summarize(in io.Reader, out io.Writer, opts options) int {
	start := time.Now()
	outputs := map[key]*strings.Builder{}
	tests := map[key]*result{}
	var order []key
	pkgs := map[string]string{} // package → pass, fail, or "notests" (skip: no test files)
	var failedPkgs []string
	var problems []string
	var noise int

	get := func(k key) *result {
		r := tests[k]
		if r == nil {
			r = &result{}
			tests[k] = r
			order = append(order, k)
			// Mark every ancestor as a parent: subtests may start before the stream
			// names their parent (it does not, but a truncated stream might).
			for name := k.test; strings.Contains(name, "/"); {
				name = name[:strings.LastIndex(name, "/")]
				pk := key{k.pkg, name}
				if p := tests[pk]; p != nil {
					p.parent = true
				} else {
					tests[pk] = &result{parent: true}
					order = append(order, pk)
				}
			}
		}
		return r
	}

	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil || ev.Action == "" {
			// Not test2json's: a `go:` error, or something else writing into the
			// stream. Show it, and do not let the layer read as clean.
			fmt.Fprintln(out, "testsum: not go test -json:", sc.Text())
			noise++
			continue
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			fmt.Fprint(out, ev.Output) // compiler errors: always shown
		case "output":
			b := outputs[k]
			if b == nil {
				b = &strings.Builder{}
				outputs[k] = b
			}
			b.WriteString(ev.Output)
			for _, p := range opts.prefixes {
				if p != "" && strings.HasPrefix(strings.TrimSpace(ev.Output), strings.TrimSpace(p)) {
					fmt.Fprint(out, ev.Output)
				}
			}
		case "run":
			if ev.Test != "" {
				get(k).started = true
			}
		case "pass", "fail", "skip":
			if ev.Test == "" {
				switch {
				case ev.Action == "fail":
					pkgs[ev.Package] = "fail"
					failedPkgs = append(failedPkgs, ev.Package)
				case ev.Action == "skip":
					pkgs[ev.Package] = "notests" // [no test files]
				default:
					pkgs[ev.Package] = "pass"
				}
				continue
			}
			get(k).action = ev.Action
		}
	}
	if err := sc.Err(); err != nil {
		problems = append(problems, "reading the stream: "+err.Error())
	}

	var passed, failed, skipped int
	var failedTests, unfinished, skips []string
	failedBelow := map[key]bool{} // a parent with a failed or unfinished descendant
	for _, k := range order {
		r := tests[k]
		if r.action == "fail" || (r.started && r.action == "") {
			for name := k.test; strings.Contains(name, "/"); {
				name = name[:strings.LastIndex(name, "/")]
				failedBelow[key{k.pkg, name}] = true
			}
		}
	}
	for _, k := range order {
		r := tests[k]
		name := k.pkg + "." + k.test
		switch {
		case r.started && r.action == "":
			// Started and never ended: the binary died under it (a panic in
			// another goroutine, -timeout). Its package failed; name the test.
			failed++
			unfinished = append(unfinished, name)
			if b := outputs[k]; b != nil {
				fmt.Fprintf(out, "--- DID NOT FINISH %s:\n%s", name, b.String())
			}
		case r.parent:
			// Counted at its leaves, unless it failed on its own (a cleanup, an
			// error after its subtests passed).
			// Its own output is shown either way: a subtest's panic is printed there.
			if r.action == "fail" && !failedBelow[k] {
				failed++
				failedTests = append(failedTests, name)
			}
			if b := outputs[k]; b != nil && r.action == "fail" {
				fmt.Fprintf(out, "--- FAIL %s:\n%s", name, b.String())
			}
		case r.action == "pass":
			passed++
		case r.action == "skip":
			skipped++
			skips = append(skips, name+": "+lastLine(outputs[k]))
		case r.action == "fail":
			failed++
			failedTests = append(failedTests, name)
			if b := outputs[k]; b != nil {
				fmt.Fprintf(out, "--- FAIL %s:\n%s", name, b.String())
			}
		}
	}
	for _, p := range failedPkgs {
		if b := outputs[key{p, ""}]; b != nil {
			fmt.Fprintf(out, "--- package %s failed:\n%s", p, b.String())
		}
	}
	sort.Strings(skips)
	for _, s := range skips {
		fmt.Fprintln(out, "skipped:", s)
	}

	ran := 0
	for _, state := range pkgs {
		if state != "notests" {
			ran++
		}
	}
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
	if noise > 0 {
		problems = append(problems, fmt.Sprintf("%d line(s) were not go test -json", noise))
	}
	if ran == 0 {
		problems = append(problems, "no package ran tests")
	}
	if passed+failed == 0 {
		problems = append(problems, fmt.Sprintf("no test ran (%d skipped)", skipped))
	}
	if len(unfinished) > 0 {
		problems = append(problems, fmt.Sprintf("%d test(s) did not finish", len(unfinished)))
	}

	status := "ok"
	if failed > 0 || len(failedPkgs) > 0 || len(problems) > 0 {
		status = "FAIL"
	}
	line := fmt.Sprintf("LAYER %-12s %s: %d passed, %d failed, %d skipped, %d packages, %s",
		opts.layer, status, passed, failed, skipped, ran, time.Since(start).Round(time.Second))
	if len(problems) > 0 {
		line += " (" + strings.Join(problems, "; ") + ")"
	}
	fmt.Fprintln(out, line)
	if status != "ok" {
		if len(failedTests) > 0 {
			fmt.Fprintln(out, "failed tests:", strings.Join(failedTests, " "))
		}
		if len(unfinished) > 0 {
			fmt.Fprintln(out, "tests that did not finish:", strings.Join(unfinished, " "))
		}
		if len(failedPkgs) > 0 {
			fmt.Fprintln(out, "failed packages:", strings.Join(failedPkgs, " "))
		}
		return 1
	}
	return 0
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
