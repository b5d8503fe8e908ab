// Package clicheck finds the shardproxy command lines a Markdown text names and checks
// them against the CLI's command tree (app.New): every command and flag a line names
// must exist where the line puts it. Its tests run it over README.md, deploy/README.md
// and docs/*.md; building the command tree starts nothing, so they need no root and run
// in the unit layer.
package clicheck

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// notCommands are code spans that begin with "shardproxy " but are not command lines:
// the ownership markers written into table comments (tables/README.md).
var notCommands = []string{
	"shardproxy instance ",
	"shardproxy node-wide rules",
}

var (
	// fence is a fenced block with its language; a "text" block is a program's output
	// (a table whose rows may start with "shardproxy"), not command lines.
	fence    = regexp.MustCompile("(?s)```([a-z]*)\n(.*?)```")
	span     = regexp.MustCompile("`([^`\n]+)`")
	cmdStart = regexp.MustCompile(`(?:^|[\s(]|bin/)shardproxy\s+\S`)
	// shellComment is a comment in a code block's line (shell or YAML).
	shellComment = regexp.MustCompile(`(^|\s)#.*$`)
)

// CommandLines returns the shardproxy command lines of a Markdown text: each line of a
// fenced block and each code span from its first "shardproxy <word>" on, and code spans
// that start with one of the top-level commands followed by a flag or a subcommand
// ("cleanup --all", "migrate move ...").
func CommandLines(text string, app *cli.App) []string {
	var pieces []string
	for _, m := range fence.FindAllStringSubmatch(text, -1) {
		if m[1] == "text" {
			continue
		}
		for _, l := range strings.Split(m[2], "\n") {
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

// findCommand returns the command of cmds named or aliased name, or nil.
func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.Name == name || slices.Contains(c.Aliases, name) {
			return c
		}
	}
	return nil
}

// findFlag returns the flag of flags named or aliased name, or nil.
func findFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

// Check checks that every command and flag a documented command line names
// exists in app, where the line puts it. Arguments and values are not checked.
func Check(app *cli.App, line string) error {
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
