package app

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCommandLineConventions runs the application in-process with the command lines
// Kubernetes users type: --version as well as version, the component-base logging flags
// (-v/--v, --logging-format) before or after the command, exit 2 with the usage line for a
// command line that cannot run, exit 1 for a runtime failure.
func TestCommandLineConventions(t *testing.T) {
	const missing = "testdata/does-not-exist.yaml"
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantOut    []string
		wantErr    []string
		notWantErr []string
		// wantJSONMsg, when set, is the message of the first stderr line, decoded as JSON.
		wantJSONMsg string
	}{
		{name: "version command", args: []string{"version"}, wantOut: []string{"shardproxy v9.9.9-test (commit 0123456789ab, go"}},
		{name: "--version flag", args: []string{"--version"}, wantOut: []string{"shardproxy v9.9.9-test (commit 0123456789ab, go"}},
		{name: "no arguments print the help", args: nil, wantOut: []string{"USAGE:", "run"}},
		{name: "unknown global flag", args: []string{"--bogus"}, wantCode: 2,
			wantErr: []string{"flag provided but not defined: -bogus", "Usage: shardproxy [options] command", "shardproxy --help"}},
		{name: "unknown command flag", args: []string{"run", "--bogus", "--config", missing}, wantCode: 2,
			wantErr: []string{"shardproxy run: flag provided but not defined: -bogus", "Usage: shardproxy run [options]\n"}},
		{name: "unknown flag of a subcommand", args: []string{"migrate", "move", "--bogus"}, wantCode: 2,
			wantErr: []string{"Usage: shardproxy migrate move [options] [namespace/name ...]"}},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2,
			wantErr: []string{`unknown command "frobnicate"`, "Usage: shardproxy [options] command"}},
		{name: "unknown subcommand", args: []string{"migrate", "frobnicate"}, wantCode: 2,
			wantErr: []string{`shardproxy migrate: unknown command "frobnicate"`, "Usage: shardproxy migrate [options] command"}},
		{name: "missing required flags are listed together", args: []string{"render", "--config", "testdata/config.yaml"}, wantCode: 2,
			wantErr: []string{"required flags not set: --instance, --from", "Usage: shardproxy render [options]"}},
		{name: "missing --config", args: []string{"run"}, wantCode: 2, wantErr: []string{"required flags not set: --config"}},
		{name: "a flag after an argument is refused, not dropped", args: []string{"migrate", "move", "--to", "shardproxy", "shop/web", "--batch-size", "1"}, wantCode: 2,
			wantErr: []string{`flag --batch-size after the argument "shop/web": put every flag before the arguments`, "Usage: shardproxy migrate move [options] [namespace/name ...]"}},
		{name: "a batch size of 0 is refused, not replaced", args: []string{"migrate", "move", "--to", "shardproxy", "--batch-size", "0"}, wantCode: 2,
			wantErr: []string{"shardproxy migrate move: --batch-size 0: must be at least 1", "Usage: shardproxy migrate move [options]"}},
		{name: "an output format shardproxy does not print", args: []string{"status", "-o", "xml"}, wantCode: 2,
			wantErr: []string{`shardproxy status: --output "xml": must be table, json or yaml`}},
		{name: "a required flag after an argument is refused as such", args: []string{"migrate", "rollback", "shop/web", "--from", "shardproxy"}, wantCode: 2,
			wantErr: []string{`shardproxy migrate rollback: flag --from after the argument "shop/web"`}},
		{name: "an argument to a command that takes none", args: []string{"check", "--skip-probe", "--config", "testdata/config.yaml", "extra"}, wantCode: 2,
			wantErr: []string{`unexpected argument "extra": check takes no arguments`}},
		{name: "a flag after an argument of a command that takes none", args: []string{"status", "now", "--address", "127.0.0.1:1"}, wantCode: 2,
			wantErr: []string{`unexpected argument "now"`}},
		{name: "malformed verbosity", args: []string{"run", "-v", "high", "--config", missing}, wantCode: 2,
			wantErr: []string{`invalid value "high" for flag -v`, "Usage: shardproxy run [options]"}},
		{name: "unknown logging format", args: []string{"run", "--logging-format=xml", "--config", missing}, wantCode: 2,
			wantErr: []string{`"xml": Unsupported log format`, "Usage: shardproxy run"}},
		{name: "runtime failure", args: []string{"check", "--skip-probe", "--config", "testdata/bad-config.yaml"}, wantCode: 1,
			wantErr: []string{"masqueradeBit"}, notWantErr: []string{"Usage:"}},
		{name: "default verbosity hides V(2)", args: []string{"run", "--config", missing}, wantCode: 1,
			wantErr: []string{`"Starting shardproxy"`, "no such file"}, notWantErr: []string{"Reading the configuration", "Usage:"}},
		{name: "-v 2 after the command", args: []string{"run", "--config", missing, "-v", "2"}, wantCode: 1,
			wantErr: []string{`"Reading the configuration" path="` + missing + `"`}},
		{name: "--v=2 before the command", args: []string{"--v=2", "run", "--config", missing}, wantCode: 1,
			wantErr: []string{`"Reading the configuration"`}},
		{name: "json logging", args: []string{"run", "--logging-format=json", "--v=2", "--config", missing}, wantCode: 1,
			wantJSONMsg: "Starting shardproxy", wantErr: []string{`"msg":"Reading the configuration"`, `"path":"` + missing + `"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(tc.args...)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stdout %q, stderr %q", code, tc.wantCode, out, errOut)
			}
			wantOutput(t, out, errOut, tc.wantOut, tc.wantErr)
			for _, not := range tc.notWantErr {
				if strings.Contains(errOut, not) {
					t.Errorf("stderr has %q:\n%s", not, errOut)
				}
			}
			if tc.wantCode == 2 && strings.Contains(out, "USAGE:") {
				t.Errorf("a usage error printed the whole help:\n%s", out)
			}
			if tc.wantJSONMsg != "" {
				var line struct {
					Msg string `json:"msg"`
				}
				first, _, _ := strings.Cut(errOut, "\n")
				if err := json.Unmarshal([]byte(first), &line); err != nil || line.Msg != tc.wantJSONMsg {
					t.Errorf("first stderr line %q: msg %q (%v), want %q", first, line.Msg, err, tc.wantJSONMsg)
				}
			}
		})
	}
}

// wantOutput fails t for each of wantOut missing from stdout and wantErr from stderr.
func wantOutput(t *testing.T, stdout, stderr string, wantOut, wantErr []string) {
	t.Helper()
	for _, want := range wantOut {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	for _, want := range wantErr {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}
