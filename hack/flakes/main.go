// Command flakes reads `go test -json` output of tests run many times (-count) on stdin
// and lists every test that failed at least once, with how often it ran and failed, then
// one summary line. It exits 1 if any test failed, or if a package failed to build or
// ended without a test result (a crash or a timeout).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// event is one line of test2json output.
type event struct {
	Action  string
	Package string
	Test    string
}

// tally is how often one test ran and failed.
type tally struct{ runs, fails int }

func main() {
	layer := flag.String("layer", "tests", "the layer's name for the summary line")
	flag.Parse()
	os.Exit(report(os.Stdin, os.Stdout, *layer))
}

func report(in io.Reader, out io.Writer, layer string) int {
	tests := map[string]*tally{}
	var brokenPkgs []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // build output and other non-JSON lines
		}
		if e.Test == "" {
			if e.Action == "fail" {
				brokenPkgs = append(brokenPkgs, e.Package)
			}
			continue
		}
		name := e.Package + " " + e.Test
		switch e.Action {
		case "pass", "fail":
			t := tests[name]
			if t == nil {
				t = &tally{}
				tests[name] = t
			}
			t.runs++
			if e.Action == "fail" {
				t.fails++
			}
		}
	}
	var flaky []string
	runs := 0
	for name, t := range tests {
		runs += t.runs
		if t.fails > 0 {
			flaky = append(flaky, name)
		}
	}
	sort.Strings(flaky)
	for _, name := range flaky {
		fmt.Fprintf(out, "FLAKY %s: failed %d of %d runs\n", name, tests[name].fails, tests[name].runs)
	}
	rc := 0
	if len(flaky) > 0 || len(brokenPkgs) > len(packagesOf(flaky)) {
		rc = 1
	}
	fmt.Fprintf(out, "FLAKES %-11s %d tests (subtests included), %d runs, %d failed at least once; packages failed: %d\n",
		layer, len(tests), runs, len(flaky), len(brokenPkgs))
	return rc
}

// packagesOf returns the packages of test names ("pkg Test").
func packagesOf(names []string) map[string]bool {
	pkgs := map[string]bool{}
	for _, n := range names {
		for i := range n {
			if n[i] == ' ' {
				pkgs[n[:i]] = true
				break
			}
		}
	}
	return pkgs
}
