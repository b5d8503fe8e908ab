// Command testsum reads `go test -json` output on stdin and prints one summary line for a
// test layer (tests passed, failed, skipped, packages, time), the full output of every
// failed test, and the measurement lines tests print ("e2e: ..."), so CI logs stay short
// but carry the figures. It exits 1 if any test or package failed.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
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

func main() {
	layer := flag.String("layer", "tests", "the layer's name for the summary line")
	show := flag.String("show", "e2e: ,coexist: Test,cluster: ", "comma-separated prefixes of output lines to print from passing tests")
	flag.Parse()
	os.Exit(summarize(os.Stdin, os.Stdout, *layer, strings.Split(*show, ",")))
}

func summarize(in io.Reader, out io.Writer, layer string, prefixes []string) int {
	start := time.Now()
	outputs := map[key]*strings.Builder{}
	var passed, failed, skipped int
	var failedTests, failedPkgs []string
	pkgs := map[string]bool{}
	var skips []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			// Build errors and other non-JSON lines: show them as they are.
			fmt.Fprintln(out, sc.Text())
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
			for _, p := range prefixes {
				if p != "" && strings.HasPrefix(strings.TrimSpace(ev.Output), strings.TrimSpace(p)) {
					fmt.Fprint(out, ev.Output)
				}
			}
		case "pass", "fail", "skip":
			if ev.Test == "" {
				pkgs[ev.Package] = true
				if ev.Action == "fail" {
					failedPkgs = append(failedPkgs, ev.Package)
					if b := outputs[k]; b != nil {
						fmt.Fprintf(out, "--- package %s failed:\n%s", ev.Package, b.String())
					}
				}
				continue
			}
			if strings.Contains(ev.Test, "/") {
				continue // subtests roll up into their parent
			}
			switch ev.Action {
			case "pass":
				passed++
			case "skip":
				skipped++
				skips = append(skips, ev.Package+"."+ev.Test+": "+lastLine(outputs[k]))
			case "fail":
				failed++
				failedTests = append(failedTests, ev.Package+"."+ev.Test)
				if b := outputs[k]; b != nil {
					fmt.Fprintf(out, "--- FAIL %s.%s:\n%s", ev.Package, ev.Test, b.String())
				}
			}
		}
	}
	sort.Strings(skips)
	for _, s := range skips {
		fmt.Fprintln(out, "skipped:", s)
	}
	status := "ok"
	if failed > 0 || len(failedPkgs) > 0 {
		status = "FAIL"
	}
	fmt.Fprintf(out, "LAYER %-12s %s: %d passed, %d failed, %d skipped, %d packages, %s\n",
		layer, status, passed, failed, skipped, len(pkgs), time.Since(start).Round(time.Second))
	if status != "ok" {
		if len(failedTests) > 0 {
			fmt.Fprintln(out, "failed tests:", strings.Join(failedTests, " "))
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
