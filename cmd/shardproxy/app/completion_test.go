package app

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestCompletionScripts: `shardproxy completion bash|zsh|fish` prints a script naming
// every command and the subcommands of migrate and config; the shells that are installed
// accept its syntax. Any other shell is a usage error.
func TestCompletionScripts(t *testing.T) {
	commands := []string{"run", "check", "render", "cleanup", "migrate", "plan", "move", "rollback", "config", "from-kube-proxy", "completion", "status", "version"}
	for _, tc := range []struct {
		shell string
		// syntax is the command line that checks a script's syntax without running it.
		syntax   []string
		wantCode int
		want     []string
	}{
		{shell: "bash", syntax: []string{"bash", "-n"}, want: append([]string{"complete -o default -F _shardproxy shardproxy", "--batch-size"}, commands...)},
		{shell: "zsh", syntax: []string{"zsh", "-n"}, want: append([]string{"#compdef shardproxy", "compdef _shardproxy shardproxy", "--batch-size"}, commands...)},
		{shell: "fish", syntax: []string{"fish", "--no-execute"}, want: append([]string{"complete -c shardproxy", "batch-size"}, commands...)},
		{shell: "tcsh", wantCode: exitUsage, want: []string{`unknown shell "tcsh": bash, zsh or fish`}},
	} {
		t.Run(tc.shell, func(t *testing.T) {
			out, errOut, code := runCLI("completion", tc.shell)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.wantCode, errOut)
			}
			got := out + errOut
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("the output does not name %q", w)
				}
			}
			if tc.syntax == nil {
				return
			}
			if _, err := exec.LookPath(tc.syntax[0]); err != nil {
				testutil.Unavailable(t, "%s is not installed (make deps installs it): the script's syntax is not checked", tc.syntax[0])
				return
			}
			file := filepath.Join(t.TempDir(), "completion."+tc.shell)
			if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, err := exec.Command(tc.syntax[0], append(tc.syntax[1:], file)...).CombinedOutput(); err != nil {
				t.Errorf("%s rejects the script: %v\n%s", tc.shell, err, b)
			}
		})
	}
}

// TestBashCompletion runs the bash script in bash: the words typed so far (the last one
// being completed) give the subcommands, the flags of the command they name, or nothing
// after a flag that takes a value (bash then completes file names).
func TestBashCompletion(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		testutil.Unavailable(t, "bash is not installed")
	}
	script, errOut, code := runCLI("completion", "bash")
	if code != 0 {
		t.Fatalf("completion bash: exit %d: %s", code, errOut)
	}
	file := filepath.Join(t.TempDir(), "shardproxy.bash")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		words []string
		want  string
	}{
		{name: "a command by its prefix", words: []string{"mi"}, want: "migrate"},
		{name: "every subcommand of a command", words: []string{"migrate", ""}, want: "plan move rollback"},
		{name: "a subcommand by its prefix", words: []string{"migrate", "ro"}, want: "rollback"},
		{name: "the flags of the subcommand", words: []string{"migrate", "move", "--ba"}, want: "--batch-size"},
		{name: "files after a flag that takes a value", words: []string{"run", "--config", ""}, want: ""},
		{name: "flags and their values before the subcommand are skipped", words: []string{"-v", "2", "migrate", "--to", "x", "mo"}, want: "move"},
		{name: "the application's flags", words: []string{"--vers"}, want: "--version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			words := append([]string{"shardproxy"}, tc.words...)
			quoted := make([]string, len(words))
			for i, w := range words {
				quoted[i] = shellQuote(w)
			}
			prog := "source " + shellQuote(file) + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
				strconv.Itoa(len(words)-1) + "\n_shardproxy\necho \"${COMPREPLY[*]}\"\n"
			b, err := exec.Command("bash", "--norc", "-c", prog).CombinedOutput()
			if err != nil {
				t.Fatalf("bash: %v\n%s", err, b)
			}
			if got := strings.TrimSpace(string(b)); got != tc.want {
				t.Errorf("completing %q: %q, want %q", words, got, tc.want)
			}
		})
	}
}

// TestZshCompletion runs the zsh script's function in zsh, with the completion system's
// builtins stubbed to print what they are given: the command path is found as in bash,
// subcommands come with their descriptions, after a value flag files are completed.
func TestZshCompletion(t *testing.T) {
	if _, err := exec.LookPath("zsh"); err != nil {
		testutil.Unavailable(t, "zsh is not installed (make deps installs it)")
	}
	script, errOut, code := runCLI("completion", "zsh")
	if code != 0 {
		t.Fatalf("completion zsh: exit %d: %s", code, errOut)
	}
	file := filepath.Join(t.TempDir(), "_shardproxy")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	stubs := "compdef() { :; }\nsource " + shellQuote(file) + "\n" +
		"compadd() { shift; print -r -- \"$*\"; }\n_describe() { print -r -- \"${(P)2}\"; }\n_files() { print files; }\n"
	for _, tc := range []struct {
		name  string
		words []string
		want  []string
	}{
		{name: "subcommands with their descriptions", words: []string{"migrate", ""}, want: []string{"plan:list the chosen Services", "rollback:"}},
		{name: "the flags of the subcommand", words: []string{"migrate", "move", "--ba"}, want: []string{"--batch-size", "--to"}},
		{name: "files after a flag that takes a value", words: []string{"run", "--config", ""}, want: []string{"files"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quoted := []string{shellQuote("shardproxy")}
			for _, w := range tc.words {
				quoted = append(quoted, shellQuote(w))
			}
			prog := stubs + "words=(" + strings.Join(quoted, " ") + ")\nCURRENT=${#words}\n_shardproxy\n"
			b, err := exec.Command("zsh", "-f", "-c", prog).CombinedOutput()
			if err != nil {
				t.Fatalf("zsh: %v\n%s", err, b)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("completing %q: %q lacks %q", tc.words, b, w)
				}
			}
		})
	}
}
