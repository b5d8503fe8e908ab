package app

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestConfigFromKubeProxy runs `config from-kube-proxy` on upstream-shaped kube-proxy
// configurations (a file, a kubeadm ConfigMap) and feeds each output to `check`, which
// must accept it; bad command lines exit 2.
func TestConfigFromKubeProxy(t *testing.T) {
	const testdata = "../../../supervisor/config/fromkubeproxy/testdata/"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"kubeadm ConfigMap file", []string{"-f", testdata + "kubeadm-configmap.yaml"}, []string{"default: true", "masqueradeBit: 14"}},
		{"nftables file", []string{"-f", testdata + "nftables-dualstack.yaml"}, []string{"nodePortAddresses: [primary]"}},
		{"alongside", []string{"-f", testdata + "kubeadm-configmap.yaml", "--alongside", "-n", "shop", "-n", "web"},
			[]string{"healthzBindAddress: 0.0.0.0:10356", "namespaces: [shop, web]", "# - featureGates"}},
		{"replacing IPVS mode", []string{"-f", testdata + "ipvs.yaml"}, []string{"# - ipvs.scheduler"}},
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
		{"alongside IPVS mode", []string{"-f", testdata + "ipvs.yaml", "--alongside"}, 1, "does not run beside kube-proxy in IPVS mode"},
		{"--write-overlay into no overlay", []string{"-f", testdata + "kubeadm-configmap.yaml", "--write-overlay", "testdata"}, 1, "not an overlay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := runCLI(append([]string{"config", "from-kube-proxy"}, tc.args...)...)
			if code != tc.code || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut, tc.code, tc.wantErr)
			}
		})
	}
}

// TestConfigFromKubeProxyWriteOverlay converts kubeadm's ConfigMap into a copy of each
// shipped overlay: config.yaml is the converted configuration, and replacing kube-proxy,
// apiserver-endpoint.yaml names the server of kubeadm's kubeconfig (and nothing else
// of the patch changes).
func TestConfigFromKubeProxyWriteOverlay(t *testing.T) {
	const configMap = "../../../supervisor/config/fromkubeproxy/testdata/kubeadm-configmap.yaml"
	for _, tc := range []struct {
		name, overlay string
		args          []string
		wantPatch     []string // lines of apiserver-endpoint.yaml after
		wantConfig    string
	}{
		{
			name: "replace", overlay: "replace-kube-proxy",
			wantPatch:  []string{"          value: control-plane.example", `          value: "6443"`},
			wantConfig: "default: true",
		},
		{
			name: "alongside", overlay: "alongside-kube-proxy", args: []string{"--alongside"},
			wantConfig: "healthzBindAddress: 0.0.0.0:10356",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join("../../../deploy/overlays", tc.overlay)
			dir := t.TempDir()
			entries, err := os.ReadDir(src)
			if err != nil {
				t.Fatal(err)
			}
			orig := map[string]string{}
			for _, e := range entries {
				data, err := os.ReadFile(filepath.Join(src, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				orig[e.Name()] = string(data)
				if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, errOut, code := runCLI(append([]string{"config", "from-kube-proxy", "-f", configMap, "--write-overlay", dir}, tc.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if !strings.Contains(out, "wrote "+filepath.Join(dir, "config.yaml")) {
				t.Errorf("output %q does not say it wrote config.yaml", out)
			}
			cfg, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
			if err != nil || !strings.Contains(string(cfg), tc.wantConfig) {
				t.Errorf("config.yaml lacks %q (%v):\n%s", tc.wantConfig, err, cfg)
			}
			patch, err := os.ReadFile(filepath.Join(dir, "apiserver-endpoint.yaml"))
			if tc.wantPatch == nil {
				if err == nil && string(patch) != orig["apiserver-endpoint.yaml"] {
					t.Errorf("apiserver-endpoint.yaml changed beside kube-proxy")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Split(string(patch), "\n")
			for _, w := range tc.wantPatch {
				if !slices.Contains(got, w) {
					t.Errorf("apiserver-endpoint.yaml lacks the line %q:\n%s", w, patch)
				}
			}
			before := strings.Split(orig["apiserver-endpoint.yaml"], "\n")
			if len(before) != len(got) {
				t.Fatalf("apiserver-endpoint.yaml went from %d to %d lines", len(before), len(got))
			}
			for i := range got {
				if got[i] != before[i] && !slices.Contains(tc.wantPatch, got[i]) {
					t.Errorf("apiserver-endpoint.yaml line %d changed from %q to %q; only the two values may", i+1, before[i], got[i])
				}
			}
		})
	}
}
