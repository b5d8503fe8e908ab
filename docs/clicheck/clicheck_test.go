package clicheck

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	shardproxy "github.com/shardproxy/shardproxy/cmd/shardproxy/app"
)

// docFiles are the operator documentation whose command lines TestDocsNameRealCommands
// checks against the CLI.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../../README.md", "../../deploy/README.md"}, files...)
}

// TestDocsNameRealCommands fails when the README or a page of docs/ names a shardproxy
// command or flag the CLI does not have.
func TestDocsNameRealCommands(t *testing.T) {
	app := shardproxy.New(io.Discard, io.Discard, shardproxy.Build{})
	checked := 0
	for _, file := range docFiles(t) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range CommandLines(string(text), app) {
			checked++
			if err := Check(app, line); err != nil {
				t.Errorf("%s: %q: %v", strings.TrimPrefix(file, "../../"), line, err)
			}
		}
	}
	// The README and docs name dozens of command lines; none found means the
	// extraction broke, not that the docs are right.
	t.Logf("%d command lines checked", checked)
	if checked < 30 {
		t.Errorf("found %d command lines in the docs, want at least 30", checked)
	}
}

func TestCheckCommandLine(t *testing.T) {
	tests := []struct {
		name, text string
		wantLines  int
		wantErr    string
	}{
		{name: "a flag the command has", text: "`shardproxy check --skip-probe --config c.yaml`", wantLines: 1},
		{name: "a flag the command lacks", text: "`shardproxy check --probe` lists them", wantLines: 1, wantErr: "shardproxy check has no flag --probe"},
		{name: "a span starting at a command name", text: "and `check --probe` lists them", wantLines: 1, wantErr: "no flag --probe"},
		{name: "subcommand alternatives", text: "```\nbin/shardproxy migrate plan|move|rollback ...   # move them\n```", wantLines: 1},
		{name: "an unknown subcommand", text: "`shardproxy migrate shift -n shop`", wantLines: 1, wantErr: `shardproxy migrate has no command "shift"`},
		{name: "an unknown command", text: "`shardproxy probe`", wantLines: 1, wantErr: `shardproxy has no command "probe"`},
		{name: "a value that looks like a command is a value", text: "`shardproxy migrate move --to shardproxy -n shop ns/web`", wantLines: 1},
		{name: "flags of a subcommand, an alias, a value with =", text: "`shardproxy config from-kube-proxy -f cm.yaml --configmap=kube-system/kube-proxy --alongside`", wantLines: 1},
		{name: "a flag of another command", text: "`shardproxy run --all`", wantLines: 1, wantErr: "shardproxy run has no flag --all"},
		{name: "logging flags before the command", text: "`shardproxy -v 4 --logging-format json run --config c.yaml`", wantLines: 1},
		{name: "through kubectl exec, then a pipe", text: "```\nkubectl exec ds/shardproxy -- shardproxy status -o json | jq .\n```", wantLines: 1},
		{name: "an ownership marker is no command line", text: "the comment `shardproxy instance <name> supervisor <node>:<port>`", wantLines: 0},
		{name: "prose is not read", text: "shardproxy probes the kernel", wantLines: 0},
		{name: "a comment in a code block is not read", text: "```yaml\n# An example shardproxy supervisor configuration\n```", wantLines: 0},
		{name: "a program's output (a text block) is not read", text: "```text\nshardproxy      100    true    24s\n```", wantLines: 0},
		{name: "a flag's value is not a command line", text: "`shardproxy-bench-compare -only shardproxy -also x`", wantLines: 0},
		{name: "another program's argument is not a command line", text: "```\nhelm install shardproxy deploy/helm/shardproxy -n kube-system\n```", wantLines: 0},
		{name: "after an environment assignment and a path", text: "`NODE_NAME=any bin/shardproxy check --probe`", wantLines: 1, wantErr: "no flag --probe"},
		{name: "in a process substitution", text: "`source <(bin/shardproxy completion bash)`", wantLines: 1},
	}
	app := shardproxy.New(io.Discard, io.Discard, shardproxy.Build{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := CommandLines(tt.text, app)
			if len(lines) != tt.wantLines {
				t.Fatalf("command lines %q, want %d", lines, tt.wantLines)
			}
			var errs []string
			for _, l := range lines {
				if err := Check(app, l); err != nil {
					errs = append(errs, err.Error())
				}
			}
			got := strings.Join(errs, "; ")
			if tt.wantErr == "" && got != "" || tt.wantErr != "" && !strings.Contains(got, tt.wantErr) {
				t.Errorf("errors %q, want %q", got, tt.wantErr)
			}
		})
	}
}
