package app

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/tables"
)

// testBuild is the binary the tests run: a release, so that what the version commands
// print shows the Build reached them.
var testBuild = Build{Version: "v9.9.9-test", Commit: "0123456789ab"}

// runCLI runs the application (testBuild) in-process. The logging configuration a command applies
// is process-wide and may be applied once: it is reset afterwards, for the next run.
func runCLI(args ...string) (string, string, int) {
	var out, errOut bytes.Buffer
	code := Run(append([]string{"shardproxy"}, args...), &out, &errOut, testBuild)
	if err := logsapi.ResetForTest(nil); err != nil {
		panic(err)
	}
	return out.String(), errOut.String(), code
}

func TestRenderOffline(t *testing.T) {
	out, errOut, code := runCLI("render", "--config", "testdata/config.yaml", "--instance", "default", "--from", "testdata/objects")
	if code != 0 {
		t.Fatalf("render failed (%d): %s", code, errOut)
	}
	for _, want := range []string{
		"add table ip shardproxy-default",
		"add table ip6 shardproxy-default",
		"add element ip shardproxy-default service-ips { 172.30.0.10 . tcp . 80 : goto pick-2 }",
		"add element ip shardproxy-default endpoints-tcp { 172.30.0.10 . 80 . 0 : 10.244.1.2 . 8080 }",
		"add element ip shardproxy-default service-ips { 192.168.100.1 . tcp . 30080 : goto pick-2 }",
		"add element ip shardproxy-default service-ips { 192.0.2.10 . tcp . 80 : goto pick-2 }",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "172.30.0.20") {
		t.Error("the default instance rendered team-a's Service")
	}
	if !strings.Contains(errOut, `shop/web:`) || !strings.Contains(errOut, "not-an-ip") {
		t.Errorf("the malformed external IP should be reported as a warning, got %q", errOut)
	}
}

// TestRenderShadow: an instance renders the Services it programs as a shadow
// (shardproxy.io/shadow), as a running instance programs them, besides the owner.
func TestRenderShadow(t *testing.T) {
	for _, inst := range []string{"team-a", "default"} {
		out, errOut, code := runCLI("render", "--config", "testdata/config.yaml", "--instance", inst, "--from", "testdata/objects")
		if code != 0 {
			t.Fatalf("render --instance %s failed (%d): %s", inst, code, errOut)
		}
		if want := "add element ip shardproxy-" + inst + " service-ips { 172.30.0.30 . tcp . 80 : goto pick-1 }"; !strings.Contains(out, want) {
			t.Errorf("render --instance %s: missing %q in\n%s", inst, want, out)
		}
	}
}

func TestCheckListsEveryProblem(t *testing.T) {
	_, errOut, code := runCLI("check", "--skip-probe", "--config", "testdata/bad-config.yaml")
	if code == 0 {
		t.Fatal("check accepted a bad configuration")
	}
	for _, want := range []string{"testdata/bad-config.yaml", "masqueradeBit", "instances[1].name", "slot", "proxyNames", "nodePortAddresses[0]"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("missing %q in the error:\n%s", want, errOut)
		}
	}
}

func TestCheckPrintsTablesAndPriorities(t *testing.T) {
	out, errOut, code := runCLI("check", "--skip-probe", "--config", "testdata/config.yaml")
	if code != 0 {
		t.Fatalf("check failed: %s", errOut)
	}
	for _, want := range []string{"ip shardproxy-team-a, ip6 shardproxy-team-a", "-66", "<unlabeled>",
		"node table: ip shardproxy_node, ip6 shardproxy_node", "filter priority 10"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

func TestVersion(t *testing.T) {
	out, _, code := runCLI("version")
	if code != 0 || !strings.HasPrefix(out, "shardproxy ") {
		t.Errorf("version: %q (%d)", out, code)
	}
}

// TestCheckWarnsAboutProfilingOffLoopback: check warns when pprof shares a metrics
// address other hosts can reach, and only then.
func TestCheckWarnsAboutProfilingOffLoopback(t *testing.T) {
	base, err := os.ReadFile("testdata/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		metrics   string
		profiling bool
		wantWarn  bool
	}{
		{"profiling on every address", "0.0.0.0:10249", true, true},
		{"profiling on every address, host omitted", ":10249", true, true},
		{"profiling on every IPv6 address", "[::]:10249", true, true},
		{"profiling on a node address", "10.0.0.5:10249", true, true},
		{"profiling on IPv4 loopback", "127.0.0.1:10249", true, false},
		{"profiling on IPv6 loopback", "[::1]:10249", true, false},
		{"no profiling on every address", "0.0.0.0:10249", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			extra := fmt.Sprintf("metricsBindAddress: %q\nenableProfiling: %v\n", tc.metrics, tc.profiling)
			if err := os.WriteFile(path, append([]byte(extra), base...), 0o600); err != nil {
				t.Fatal(err)
			}
			out, errOut, code := runCLI("check", "--skip-probe", "--config", path)
			if code != 0 {
				t.Fatalf("check failed (%d): %s", code, errOut)
			}
			warned := strings.Contains(errOut, "warning: enableProfiling") && strings.Contains(errOut, tc.metrics)
			if warned != tc.wantWarn {
				t.Errorf("warned %v, want %v; stderr %q", warned, tc.wantWarn, errOut)
			}
			if !strings.Contains(out, "configuration is valid") {
				t.Errorf("stdout %q", out)
			}
		})
	}
}

// TestStatusCommand: `shardproxy status` prints each instance's status, last error
// included, from a supervisor's /status on loopback, and fails clearly where the
// supervisor refuses (a client not on loopback).
func TestStatusCommand(t *testing.T) {
	h := healthcheck.NewProxyHealth(nil, func(inst string) time.Duration {
		if inst == "team-b" {
			return time.Nanosecond // its queued update is stale at once
		}
		return healthcheck.DefaultHealthTimeout
	})
	h.AddInstance("team-a")
	h.SetInstanceCounts("team-a", 3, 7)
	h.SetInstanceError("team-a", errors.New("nft: transaction failed"))
	h.AddInstance("team-b")
	h.QueuedUpdate("team-b")
	h.SetConfig(healthcheck.ConfigStatus{Hash: "0123456789abcdef", Applied: time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC),
		Refused: "The changed configuration changes tablePrefix"})
	tests := []struct {
		name    string
		client  string // the peer address the supervisor sees; "" keeps the real one
		wantOut []string
		wantErr []string
	}{
		{name: "on loopback", wantOut: []string{"team-a", "true", "3", "7", "nft: transaction failed", "STALE", "team-b", "is not programmed (health timeout 1ns)",
			"configuration 0123456789abcdef, applied 2026-11-29T03:00:00Z", "newest file refused: The changed configuration changes tablePrefix"}},
		{name: "not on loopback", client: "10.0.0.7:40000", wantErr: []string{"403", "loopback", "run this on the node"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.client != "" {
					r.RemoteAddr = tc.client
				}
				h.Handler().ServeHTTP(w, r)
			}))
			defer srv.Close()
			out, errOut, code := runCLI("status", "--address", strings.TrimPrefix(srv.URL, "http://"))
			if (code == 0) != (tc.wantErr == nil) {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			wantOutput(t, out, errOut, tc.wantOut, tc.wantErr)
			if tc.wantErr != nil && strings.Contains(out+errOut, "transaction failed") {
				t.Errorf("the refused status leaked the error: %q %q", out, errOut)
			}
		})
	}
}

// TestTableOwnerWarnings: `check --probe` names the tables under the prefix that carry
// shardproxy's marker but are not this supervisor's: another supervisor's with the same
// prefix, and an earlier version's; its own, unmarked and other prefixes' tables are
// not mentioned.
func TestTableOwnerWarnings(t *testing.T) {
	cfg := &config.Config{NodeName: "node-1", HealthzBindAddress: "0.0.0.0:10256", TablePrefix: "shardproxy"}
	tests := []struct {
		name  string
		table tables.ListedTable
		want  string // substring; "" for no warning
	}{
		{"its own", tables.ListedTable{Name: "shardproxy-a", Comment: tables.OwnerComment("a", "node-1:10256")}, ""},
		{"another supervisor's", tables.ListedTable{Name: "shardproxy-b", Comment: tables.OwnerComment("b", "node-1:10266")},
			`table ip shardproxy-b (instance "b") belongs to another supervisor, node-1:10266, with the same tablePrefix "shardproxy"`},
		{"an earlier version's", tables.ListedTable{Name: "shardproxy-c", Comment: "shardproxy instance c"},
			`table ip shardproxy-c (instance "c") has an earlier version's ownership marker`},
		{"unmarked", tables.ListedTable{Name: "shardproxy-d"}, ""},
		{"another prefix", tables.ListedTable{Name: "kube-proxy", Comment: tables.OwnerComment("proxy", "x")}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tableOwnerWarnings(cfg, tables.IPv4, []tables.ListedTable{tc.table})
			switch {
			case tc.want == "" && len(got) != 0:
				t.Errorf("warnings %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Errorf("warnings %q, want one containing %q", got, tc.want)
			}
		})
	}
}
