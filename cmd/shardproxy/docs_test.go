package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
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

// notCommands are code spans that begin with "shardproxy " but are not command lines:
// the ownership markers written into table comments (tables/README.md).
var notCommands = []string{
	"shardproxy instance ",
	"shardproxy node-wide rules",
}

var (
	fence    = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	span     = regexp.MustCompile("`([^`\n]+)`")
	cmdStart = regexp.MustCompile(`(?:^|[\s(]|bin/)shardproxy\s+\S`)
	// shellComment is a comment in a code block's line (shell or YAML).
	shellComment = regexp.MustCompile(`(^|\s)#.*$`)
)

// commandLines returns the shardproxy command lines of a Markdown text: each line of a
// fenced block and each code span from its first "shardproxy <word>" on, and code spans
// that start with one of the top-level commands followed by a flag or a subcommand
// ("cleanup --all", "migrate move ...").
func commandLines(text string, app *cli.App) []string {
	var pieces []string
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		for _, l := range strings.Split(m[1], "\n") {
			pieces = append(pieces, shellComment.ReplaceAllString(l, ""))
		}
	}
	for _, m := range span.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
		pieces = append(pieces, m[1])
	}
	var out []string
	for _, p := range pieces {
		if line, ok := firstCommand(p); ok {
			if !slices.ContainsFunc(notCommands, func(s string) bool { return strings.HasPrefix(line, s) }) {
				out = append(out, line)
			}
			continue
		}
		f := strings.Fields(p)
		if len(f) >= 2 && findCommand(app.Commands, f[0]) != nil && (strings.HasPrefix(f[1], "-") || findCommand(findCommand(app.Commands, f[0]).Subcommands, f[1]) != nil) {
			out = append(out, "shardproxy "+p)
		}
	}
	return out
}

// firstCommand returns p from its first "shardproxy <word>" that is a command: at the
// start, after a path ("bin/shardproxy"), "--" (kubectl exec's end of options), "$",
// "sudo" or an environment assignment (NODE_NAME=x). After anything else it is an
// argument or a flag's value ("helm install shardproxy ...", "-only shardproxy").
func firstCommand(p string) (string, bool) {
	for _, loc := range cmdStart.FindAllStringIndex(p, -1) {
		at := strings.LastIndex(p[:loc[1]], "shardproxy")
		before := strings.Fields(p[:at])
		if len(before) > 0 {
			prev := before[len(before)-1]
			ok := strings.HasSuffix(prev, "/") || strings.HasSuffix(prev, "(") || slices.Contains([]string{"--", "$", "sudo"}, prev) ||
				strings.Contains(prev, "=") && !strings.HasPrefix(prev, "-")
			if !ok {
				continue
			}
		}
		return p[at:], true
	}
	return "", false
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.Name == name || slices.Contains(c.Aliases, name) {
			return c
		}
	}
	return nil
}

func findFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

// checkCommandLine checks that every command and flag a documented command line names
// exists in app, where the line puts it. Arguments and values are not checked.
func checkCommandLine(app *cli.App, line string) error {
	cmds, flags, path := app.Commands, app.Flags, "shardproxy"
	sawArg := false
	tokens := strings.Fields(line)[1:]
	for i := 0; i < len(tokens); i++ {
		tok := strings.Trim(tokens[i], "[],.")
		switch {
		case tok == "" || tok == "..." || strings.HasPrefix(tok, "<"):
			continue
		case slices.Contains([]string{"|", "||", "&&", ";", "#", ">", "2>", "<("}, tok) || strings.HasPrefix(tok, "#") || strings.HasPrefix(tok, ">"):
			return nil // the rest is the shell's
		case strings.HasPrefix(tok, "-") && len(tok) > 1:
			name, value, hasValue := strings.Cut(strings.TrimLeft(tok, "-"), "=")
			if name == "help" || name == "h" {
				continue
			}
			for _, alt := range strings.Split(name, "|") {
				f := findFlag(flags, strings.TrimLeft(alt, "-"))
				if f == nil {
					return fmt.Errorf("%s has no flag --%s", path, strings.TrimLeft(alt, "-"))
				}
				if _, isBool := f.(*cli.BoolFlag); !isBool && !hasValue && !strings.Contains(name, "|") {
					i++ // its value
				}
			}
			_ = value
		case !sawArg && len(cmds) > 0:
			var next *cli.Command
			for _, alt := range strings.Split(tok, "|") {
				c := findCommand(cmds, alt)
				if c == nil {
					return fmt.Errorf("%s has no command %q", path, alt)
				}
				if next == nil {
					next = c
				}
			}
			cmds, flags, path = next.Subcommands, next.Flags, path+" "+next.Name
		default:
			sawArg = true
		}
	}
	return nil
}

// TestDocsNameRealCommands fails when the README or a page of docs/ names a shardproxy
// command or flag the CLI does not have.
func TestDocsNameRealCommands(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	checked := 0
	for _, file := range docFiles(t) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range commandLines(string(text), app) {
			checked++
			if err := checkCommandLine(app, line); err != nil {
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
		{name: "a flag's value is not a command line", text: "`shardproxy-bench-compare -only shardproxy -also x`", wantLines: 0},
		{name: "another program's argument is not a command line", text: "```\nhelm install shardproxy deploy/helm/shardproxy -n kube-system\n```", wantLines: 0},
		{name: "after an environment assignment and a path", text: "`NODE_NAME=any bin/shardproxy check --probe`", wantLines: 1, wantErr: "no flag --probe"},
		{name: "in a process substitution", text: "`source <(bin/shardproxy completion bash)`", wantLines: 1},
	}
	app := newApp(io.Discard, io.Discard)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines := commandLines(tt.text, app)
			if len(lines) != tt.wantLines {
				t.Fatalf("command lines %q, want %d", lines, tt.wantLines)
			}
			var errs []string
			for _, l := range lines {
				if err := checkCommandLine(app, l); err != nil {
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
