package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSummarize feeds testsum streams recorded from real `go test -json` runs
// (testdata/README.md says how each was made) with the exit status go test returned.
func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stream   string // a file in testdata, or "" for empty input
		stderr   string // a file in testdata
		status   string // go test's exit status as the -go-status file holds it
		wantCode int
		want     []string
		notWant  []string
	}{
		{
			name: "passing tests, a skipped subtest counted as skipped", stream: "pass.json", status: "0",
			wantCode: 0,
			want:     []string{"LAYER unit         ok: 2 passed, 0 failed, 1 skipped, 1 packages", "skipped: example.com/ts/pass.TestB/two: p_test.go:8: not here"},
			notWant:  []string{"FAIL"},
		},
		{
			name: "module downloads on stderr are not a problem", stream: "pass.json", stderr: "downloads.stderr", status: "0",
			wantCode: 0,
			want:     []string{"LAYER unit         ok: 2 passed"},
		},
		{
			name: "a build failure fails the layer and shows the compiler", stream: "buildfail.json", status: "1",
			wantCode: 1,
			want:     []string{"b_test.go:5:28: undefined: undefined", "failed packages: example.com/ts/buildfail", "go test exited 1", "no test ran"},
			notWant:  []string{" ok: "},
		},
		{
			name: "a panicking subtest fails itself, not also its parent", stream: "panic.json", status: "1",
			wantCode: 1,
			want:     []string{"LAYER unit         FAIL: 1 passed, 1 failed, 0 skipped", "failed tests: example.com/ts/panic.TestBoom/inner", "assignment to entry in nil map"},
		},
		{
			name: "a test cut off by -timeout did not finish", stream: "timeout.json", status: "1",
			wantCode: 1,
			want:     []string{"--- DID NOT FINISH example.com/ts/timeout.TestHang", "panic: test timed out", "1 test(s) did not finish", "tests that did not finish: example.com/ts/timeout.TestHang"},
		},
		{
			name: "a panic outside the test's goroutine", stream: "gopanic.json", status: "1",
			wantCode: 1,
			want:     []string{"1 failed", "tests that did not finish: example.com/ts/gopanic.TestBackground", "background goroutine"},
		},
		{
			name: "a package that ran no test", stream: "zero.json", status: "0",
			wantCode: 1,
			want:     []string{"LAYER unit         FAIL: 0 passed, 0 failed, 0 skipped, 1 packages", "no test ran (0 skipped)"},
		},
		{
			name: "a parent whose subtests all skipped is not a pass", stream: "allskip.json", status: "0",
			wantCode: 1,
			want:     []string{"0 passed, 0 failed, 2 skipped", "no test ran (2 skipped)", "skipped: example.com/ts/allskip.TestNeedsRoot/a: s_test.go:7: needs root"},
		},
		{
			name: "a package run twice (split between lanes) counts once and fails if one run failed", stream: "split.json", status: "1",
			wantCode: 1,
			want:     []string{"LAYER unit         FAIL: 1 passed, 1 failed, 0 skipped, 1 packages", "failed tests: example.com/ts/split.TestA", "failed packages: example.com/ts/split"},
		},
		{
			name: "a missing module fails the layer", stream: "moderr.json", status: "1",
			wantCode: 1,
			want:     []string{"missing go.sum entry", "failed packages: example.com/m", "go test exited 1"},
		},
		{
			name: "a line that is not test2json's fails a green run", stream: "noise.json", status: "0",
			wantCode: 1,
			want:     []string{"testsum: not go test -json: some tool printed this", "2 passed, 0 failed, 1 skipped", "1 line(s) were not go test -json"},
		},
		{
			name: "go test outside a module: empty stdout, an error on stderr", stderr: "nomod.stderr", status: "1",
			wantCode: 1,
			want:     []string{"testsum: go test stderr: go: go.mod file not found", "go test exited 1", "no package ran tests", "go test wrote 1 line(s) to stderr"},
		},
		{
			name: "go test failed though every event passed", stream: "pass.json", status: "2",
			wantCode: 1,
			want:     []string{"LAYER unit         FAIL: 2 passed, 0 failed, 1 skipped", "go test exited 2"},
		},
		{
			name: "go test's exit status never written", stream: "pass.json", status: "",
			wantCode: 1,
			want:     []string{"go test's exit status is unknown"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in []byte
			if tc.stream != "" {
				in = read(t, tc.stream)
			}
			dir := t.TempDir()
			opts := options{layer: "unit", prefixes: []string{"e2e: "}, goStatus: filepath.Join(dir, "status"), stderr: filepath.Join(dir, "stderr")}
			write(t, opts.goStatus, tc.status+"\n")
			stderr := ""
			if tc.stderr != "" {
				stderr = string(read(t, tc.stderr))
			}
			write(t, opts.stderr, stderr)
			var out bytes.Buffer
			code := summarize(bytes.NewReader(in), &out, opts)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d\n%s", code, tc.wantCode, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q:\n%s", w, out.String())
				}
			}
			if n := strings.Count(out.String(), "LAYER "); n != 1 {
				t.Errorf("%d LAYER lines, want exactly 1:\n%s", n, out.String())
			}
		})
	}
}

// TestSummarizeFigures: measurement lines of passing tests are printed, a parent that
// fails on its own after its subtests passed counts as one failure.
func TestSummarizeFigures(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"e2e: handover 0 failed\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"run","Package":"p","Test":"TestB/sub"}
{"Action":"pass","Package":"p","Test":"TestB/sub"}
{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:9: cleanup left a namespace\n"}
{"Action":"fail","Package":"p","Test":"TestB"}
{"Action":"fail","Package":"p"}`
	var out bytes.Buffer
	code := summarize(strings.NewReader(in), &out, options{layer: "e2e", prefixes: []string{"e2e: "}})
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	for _, w := range []string{"e2e: handover 0 failed", "LAYER e2e          FAIL: 2 passed, 1 failed, 0 skipped, 1 packages", "failed tests: p.TestB", "cleanup left a namespace"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
