package legacy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// capsHelper, set in the environment, makes TestRealExecPassesNetAdmin the process under
// test: it reads the rules with iptables-nft-save through RealExec and prints them.
const capsHelper = "SHARDPROXY_LEGACY_CAPS_HELPER"

// TestRealExecPassesNetAdmin runs RealExec the way the DaemonSet's container runs the
// supervisor, on the real kernel: as user 65532 with no_new_privs and a bounding set of
// NET_ADMIN alone, the process holding CAP_NET_ADMIN from a file capability of its own
// (as /usr/local/bin/shardproxy does in the image). It reads a netns's iptables rules
// with the host's iptables-nft-save, which carries no file capability: it works because
// RealExec passes the capability on, not because xtables-nft-multi has one (the image
// gives it none). Without the capability the read fails for want of it, not at the exec.
func TestRealExecPassesNetAdmin(t *testing.T) {
	if os.Getenv(capsHelper) != "" {
		out, err := RealExec{}.Run(context.Background(), nil, "iptables-nft-save")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%s", out)
		return
	}
	testutil.RequireKernel(t, "ip", "setcap", "getcap", "setpriv", "iptables-nft", "iptables-nft-save")
	save, err := exec.LookPath("iptables-nft-save")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(save)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("getcap", real).Output(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("%s carries file capabilities (%q, %v): this test needs one without", real, out, err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ns := testutil.NewNetns(t, "splegcap")
	if out, err := exec.Command("ip", "netns", "exec", ns, "iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES").CombinedOutput(); err != nil {
		t.Fatalf("creating a chain: %v: %s", err, out)
	}
	for _, tc := range []struct {
		name     string
		fileCap  bool // on the process that runs RealExec
		wantRead bool
	}{
		{name: "the process holds NET_ADMIN: iptables-nft-save reads with it", fileCap: true, wantRead: true},
		{name: "the process holds nothing: iptables-nft-save fails for want of it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(dir, strings.NewReplacer(" ", "-", ":", "").Replace(tc.name))
			testutil.CopyFile(t, self, bin, 0o755)
			if tc.fileCap {
				if out, err := exec.Command("setcap", "cap_net_admin=ep", bin).CombinedOutput(); err != nil {
					t.Fatalf("setcap: %v: %s", err, out)
				}
			}
			cmd := exec.Command("ip", "netns", "exec", ns,
				"setpriv", "--reuid=65532", "--regid=65532", "--clear-groups",
				"--bounding-set=-all,+net_admin", "--inh-caps=-all", "--no-new-privs",
				bin, "-test.run=^TestRealExecPassesNetAdmin$", "-test.count=1", "-test.v")
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", capsHelper + "=1"}
			out, err := cmd.CombinedOutput()
			read := err == nil && strings.Contains(string(out), ":KUBE-SERVICES")
			if read != tc.wantRead {
				t.Fatalf("iptables-nft-save as user 65532: read the rules %v, want %v (%v)\n%s", read, tc.wantRead, err, out)
			}
			if !tc.wantRead && (strings.Contains(string(out), "fork/exec") || !strings.Contains(strings.ToLower(string(out)), "permission denied")) {
				t.Errorf("the read failed for another reason than a missing capability:\n%s", out)
			}
		})
	}
}
