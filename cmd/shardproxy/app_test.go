package main

import (
	"bytes"
	"strings"
	"testing"
)

func runCLI(args ...string) (string, string, int) {
	var out, errOut bytes.Buffer
	code := run(append([]string{"shardproxy"}, args...), &out, &errOut)
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
	for _, want := range []string{"ip shardproxy-team-a, ip6 shardproxy-team-a", "-66", "<unlabeled>"} {
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
