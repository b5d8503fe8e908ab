package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigFromKubeProxy runs `config from-kube-proxy` on upstream-shaped kube-proxy
// configurations (a file, a kubeadm ConfigMap) and feeds each output to `check`, which
// must accept it; bad command lines exit 2.
func TestConfigFromKubeProxy(t *testing.T) {
	const testdata = "../../supervisor/config/fromkubeproxy/testdata/"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"kubeadm ConfigMap file", []string{"-f", testdata + "kubeadm-configmap.yaml"}, []string{"default: true", "masqueradeBit: 14"}},
		{"nftables file", []string{"-f", testdata + "nftables-dualstack.yaml"}, []string{"nodePortAddresses: [primary]"}},
		{"alongside", []string{"-f", testdata + "ipvs.yaml", "--alongside", "-n", "shop", "-n", "web"},
			[]string{"healthzBindAddress: 0.0.0.0:10356", "namespaces: [shop, web]", "# - ipvs.scheduler"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(append([]string{"config", "from-kube-proxy"}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			path := filepath.Join(t.TempDir(), "converted.yaml")
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Setenv("NODE_NAME", "node-1")
			if checkOut, errOut, code := runCLI("check", "--skip-probe", "--config", path); code != 0 {
				t.Errorf("check of the output: exit %d\n%s%s\n%s", code, checkOut, errOut, out)
			}
		})
	}
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		wantErr string
	}{
		{"no source", nil, 2, "give exactly one of --file and --from-cluster"},
		{"two sources", []string{"-f", "x", "--from-cluster"}, 2, "give exactly one"},
		{"--namespace without --alongside", []string{"-f", "x", "-n", "a"}, 2, "--namespace only applies to --alongside"},
		{"missing file", []string{"-f", "nowhere.yaml"}, 1, "nowhere.yaml"},
		{"not kube-proxy's", []string{"-f", "testdata/config.yaml"}, 1, "not a kube-proxy configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := runCLI(append([]string{"config", "from-kube-proxy"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut, tc.code, tc.wantErr)
			}
		})
	}
}
