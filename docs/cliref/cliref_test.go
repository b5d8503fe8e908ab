package cliref

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	shardproxy "github.com/shardproxy/shardproxy/cmd/shardproxy/app"
)

// TestCommandsPageUpToDate fails when docs/commands.md's reference is not what the
// CLI's command tree makes of it today: a flag added, removed or reworded without
// `make docs`.
func TestCommandsPageUpToDate(t *testing.T) {
	got, err := os.ReadFile("../../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Splice(got, Generate(shardproxy.New(io.Discard, io.Discard, shardproxy.Build{})))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/commands.md is not what the command tree makes of it: run `make docs` and commit it")
	}
}

// TestEveryFlagDocumented: every flag of every command of the real tree has a row in
// the generated reference, under its command.
func TestEveryFlagDocumented(t *testing.T) {
	app := shardproxy.New(io.Discard, io.Discard, shardproxy.Build{})
	ref := string(Generate(app))
	var walk func(cmds []*cli.Command, path string)
	rows := 0
	walk = func(cmds []*cli.Command, path string) {
		for _, c := range cmds {
			name := strings.TrimSpace(path + " " + c.Name)
			section := ref[strings.Index(ref, "\n### "+name+"\n"):]
			if next := strings.Index(section[1:], "\n### "); next >= 0 {
				section = section[:next+1]
			}
			for _, f := range c.Flags {
				if f.(cli.CategorizableFlag).GetCategory() == "logging" {
					continue // global: in the global table
				}
				rows++
				if !strings.Contains(section, "\n| `--"+f.Names()[0]+"`") && !strings.Contains(section, "\n| `-"+f.Names()[0]+"`") {
					t.Errorf("%s --%s has no row under its command", name, f.Names()[0])
				}
			}
			walk(c.Subcommands, name)
		}
	}
	walk(app.Commands, "")
	if rows < 50 {
		t.Errorf("found %d flags in the command tree, want at least 50: the walk is broken", rows)
	}
}

func TestGenerate(t *testing.T) {
	app := &cli.App{
		Flags: []cli.Flag{&cli.BoolFlag{Name: "version", Usage: "print the version"}},
		Commands: []*cli.Command{
			{
				Name: "tool", Usage: "tools",
				Subcommands: []*cli.Command{{
					Name: "go", Usage: "goes", ArgsUsage: "[ns/name ...]", Description: "Goes <somewhere>.",
					Flags: []cli.Flag{
						&cli.StringFlag{Name: "mode", Aliases: []string{"m"}, Value: "a", Usage: "a|b, <the> mode_name *x*"},
						&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "bound"},
						&cli.BoolFlag{Name: "force", Usage: "force it"},
						&cli.StringFlag{Name: "secret", Hidden: true, Usage: "never listed"},
						&cli.BoolFlag{Name: "version", Usage: "the global flag again"},
					},
				}},
			},
			{Name: "hidden", Hidden: true, Usage: "never listed"},
			{Name: "plain", Usage: "no flags"},
		},
	}
	got := string(Generate(app))
	tests := []struct {
		name        string
		want, never string
	}{
		{name: "a command with subcommands takes a command", want: "```text\nshardproxy tool <command>\n\ntools\n```\n"},
		{name: "a leaf's usage line, its help and description verbatim", want: "```text\nshardproxy tool go [flags] [ns/name ...]\n\ngoes\n\nGoes <somewhere>.\n```\n"},
		{name: "a flag with its alias, value and default; pipes, HTML and emphasis escaped", want: "| `--mode`, `-m` | string | `a` | a\\|b, &lt;the&gt; mode\\_name \\*x\\* |\n"},
		{name: "a duration's default as its help prints it", want: "| `--timeout` | duration | `2m0s` | bound |\n"},
		{name: "a boolean takes no value and shows no default", want: "| `--force` |  |  | force it |\n"},
		{name: "the global flags once, in their own table", want: "### Global flags\n\nBefore the command or on any command:\n\n| flag | value | default | what it does |\n|---|---|---|---|\n| `--version` |  |  | print the version |\n"},
		{name: "a global flag is not repeated under a command", never: "the global flag again"},
		{name: "a hidden flag is not listed", never: "secret"},
		{name: "a hidden command is not listed", never: "### hidden"},
		{name: "a command without flags has no table and no [flags]", want: "```text\nshardproxy plain\n\nno flags\n```\n\n" + End},
		{name: "flags sorted by name, as the help prints them", want: "| `--force` |  |  | force it |\n| `--mode`"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("want\n%s\nin\n%s", tc.want, got)
			}
			if tc.never != "" && strings.Contains(got, tc.never) {
				t.Errorf("%q in\n%s", tc.never, got)
			}
		})
	}
}

func TestSplice(t *testing.T) {
	gen := []byte(Begin + "\nnew\n" + End + "\n")
	tests := []struct {
		name, page, want, wantErr string
	}{
		{name: "replaces the generated part, keeps the hand-written text around it", page: "# Intro\n\n" + Begin + "\nold\n" + End + "\nafter\n", want: "# Intro\n\n" + Begin + "\nnew\n" + End + "\nafter\n"},
		{name: "appends to a page without one", page: "# Intro\n", want: "# Intro\n\n" + Begin + "\nnew\n" + End + "\n"},
		{name: "refuses markers out of order", page: End + "\n" + Begin + "\n", wantErr: "out of order"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Splice([]byte(tc.page), gen)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
