package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestNonRootWithFileCapabilities runs the real supervisor binary the way the
// DaemonSet's container runs it, on the real kernel: as user 65532 (the image's USER),
// with no_new_privs (allowPrivilegeEscalation: false) and a bounding set of NET_ADMIN
// alone (capabilities: drop ALL, add NET_ADMIN), started by a root process that holds the
// capabilities, as runc is. `shardproxy check` asks the kernel, through nft, to load every
// rule shape. It works only when both the supervisor and nft carry cap_net_admin as file
// capabilities (deploy/Dockerfile's setcap): a non-root process gets no capability from
// the runtime itself. What this does not show: a real kubelet and container runtime
// starting the image (deploy/README.md, "What is not tested").
func TestNonRootWithFileCapabilities(t *testing.T) {
	testutil.RequireKernel(t, "nft", "ip", "setcap", "setpriv")
	bin := buildShardproxy(t)
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Fatal(err)
	}
	// The non-root user must reach the binaries and the configuration.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "config.yaml")
	testutil.CopyFile(t, filepath.Join("base", "config.yaml"), cfg, 0o644)

	for _, tc := range []struct {
		name      string
		fileCaps  []string // of "shardproxy", "nft"
		wantProbe bool
	}{
		{name: "file capabilities on the supervisor and nft, as in the image", fileCaps: []string{"shardproxy", "nft"}, wantProbe: true},
		{name: "none: the runtime gives a non-root process no capability"},
		{name: "only the supervisor: nft, which it runs, has none", fileCaps: []string{"shardproxy"}},
		{name: "only nft: under no_new_privs it gets no more than the supervisor has", fileCaps: []string{"nft"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binDir := filepath.Join(dir, strings.NewReplacer(" ", "-", ",", "", ":", "").Replace(tc.name))
			if err := os.Mkdir(binDir, 0o755); err != nil {
				t.Fatal(err)
			}
			testutil.CopyFile(t, bin, filepath.Join(binDir, "shardproxy"), 0o755)
			testutil.CopyFile(t, nft, filepath.Join(binDir, "nft"), 0o755)
			for _, f := range tc.fileCaps {
				if out, err := exec.Command("setcap", "cap_net_admin=ep", filepath.Join(binDir, f)).CombinedOutput(); err != nil {
					t.Fatalf("setcap %s: %v: %s", f, err, out)
				}
			}
			ns := testutil.NewNetns(t, "spnonroot")
			uid := strconv.Itoa(imageUID)
			cmd := exec.Command("ip", "netns", "exec", ns,
				"setpriv", "--reuid="+uid, "--regid="+uid, "--clear-groups",
				"--bounding-set=-all,+net_admin", "--inh-caps=-all", "--no-new-privs",
				filepath.Join(binDir, "shardproxy"), "check", "--config", cfg)
			// knftables runs the first nft on PATH: the copy with (or without) capabilities.
			cmd.Env = []string{"PATH=" + binDir + ":/usr/sbin:/usr/bin:/sbin:/bin", "NODE_NAME=node-1"}
			out, err := cmd.CombinedOutput()
			probed := err == nil && strings.Contains(string(out), "nft and the kernel accept every rule shape")
			if probed != tc.wantProbe {
				t.Fatalf("shardproxy check as user %s: probe passed %v, want %v (%v)\n%s", uid, probed, tc.wantProbe, err, out)
			}
			if !tc.wantProbe && !strings.Contains(string(out), "Operation not permitted") {
				t.Errorf("the probe failed for another reason than a missing capability:\n%s", out)
			}
			t.Logf("file capabilities on %v: probe passed %v", tc.fileCaps, probed)
		})
	}
}
