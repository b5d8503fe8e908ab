package fromkubeproxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// load converts a testdata file and decodes the result with shardproxy's own
// configuration code, failing the test if it does not validate.
func load(t *testing.T, file string, opts Options) (*config.Config, string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := Decode(data)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	opts.Source = file
	if opts.APIServer, err = APIServer(data); err != nil {
		t.Fatalf("APIServer: %v", err)
	}
	out, err := Convert(kp, opts)
	if err != nil {
		t.Fatalf("Convert: %v", err)
	}
	cfg, err := config.Decode(out, file)
	if err != nil {
		t.Fatalf("the output does not decode: %v\n%s", err, out)
	}
	cfg.DefaultWith(func(string) string { return "node-1" }, nil)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the output does not validate: %v\n%s", err, out)
	}
	return cfg, string(out)
}

// TestConvert converts real upstream-shaped configurations (written by kube-proxy
// v1.36.3's --write-config-to, and kubeadm's ConfigMap) and checks each carried setting
// in the decoded, defaulted, validated result, and the comment on each setting that is
// not carried.
func TestConvert(t *testing.T) {
	for _, tc := range []struct {
		name      string
		file      string
		opts      Options
		check     func(t *testing.T, c *config.Config)
		wantNotes []string
	}{
		{
			name: "kubeadm ConfigMap, iptables mode by default, zero values are upstream's defaults",
			file: "kubeadm-configmap.yaml",
			check: func(t *testing.T, c *config.Config) {
				in := c.Instances[0]
				expect(t, "kubeconfig", c.Kubeconfig, "") // kube-proxy's pod's file: the DaemonSet runs in-cluster
				expect(t, "healthzBindAddress", c.HealthzBindAddress, "0.0.0.0:10256")
				expect(t, "metricsBindAddress", c.MetricsBindAddress, "127.0.0.1:10249")
				expect(t, "clientConnection.qps", c.ClientConnection.QPS, 5) // kubeadm leaves 0: the default
				expect(t, "masqueradeBit", *c.MasqueradeBit, 14)
				expect(t, "conntrack.maxPerCore", *c.Conntrack.MaxPerCore, 0) // the overlay's init container writes it
				expect(t, "default", in.Default, true)
				expect(t, "nodePortAddresses", strings.Join(in.NodePortAddresses, ","), "0.0.0.0/0,::/0")
				expect(t, "detectLocal", in.DetectLocal.Mode+" "+strings.Join(in.DetectLocal.ClusterCIDRs, ","), "ClusterCIDR 10.244.0.0/16")
				expect(t, "syncPeriods", in.MinSyncPeriod.Duration.String()+" "+in.SyncPeriod.Duration.String(), "1s 30s")
				expect(t, "externalIPCIDRs", strings.Join(in.Tenant.ExternalIPCIDRs, ","), "0.0.0.0/0,::/0")
			},
			wantNotes: []string{"iptables.localhostNodePorts", "featureGates: KubeProxyDrainingTerminatingNodes=true", `logging: format "json"`},
		},
		{
			name: "nftables, dual-stack cluster CIDR",
			file: "nftables-dualstack.yaml",
			check: func(t *testing.T, c *config.Config) {
				in := c.Instances[0]
				expect(t, "nodePortAddresses", strings.Join(in.NodePortAddresses, ","), "primary")
				expect(t, "clusterCIDRs", strings.Join(in.DetectLocal.ClusterCIDRs, ","), "10.244.0.0/16,fd00:10:244::/48")
				expect(t, "conntrack", c.Conntrack.TCPEstablishedTimeout.Duration, 0) // kube-proxy's default: the overlay's init container writes it
			},
			wantNotes: []string{"oomScoreAdj: -999", "configSyncPeriod: 15m0s"},
		},
		{
			name: "ipvs: sync periods from the ipvs section, IPVS settings noted",
			file: "ipvs.yaml",
			check: func(t *testing.T, c *config.Config) {
				expect(t, "syncPeriod", c.Instances[0].SyncPeriod.Duration, 30*time.Second)
				expect(t, "loadBalancing.mode", c.Instances[0].LoadBalancing.Mode, "") // lc: none alike: the default, random
			},
			wantNotes: []string{`ipvs.scheduler: "lc": no counterpart`, "ipvs: strictARP true excludeCIDRs [10.10.0.0/16]"},
		},
		{
			name: "iptables with every setting changed",
			file: "iptables-custom.yaml",
			check: func(t *testing.T, c *config.Config) {
				in := c.Instances[0]
				expect(t, "nodeName", c.NodeName, "node-a")
				expect(t, "clientConnection", c.ClientConnection.ContentType+" "+fmt.Sprint(c.ClientConnection.Burst), "application/vnd.kubernetes.protobuf 10")
				expect(t, "metricsBindAddress", c.MetricsBindAddress, "0.0.0.0:10249")
				expect(t, "enableProfiling", c.EnableProfiling, true)
				expect(t, "conntrack.maxPerCore", *c.Conntrack.MaxPerCore, 0)
				expect(t, "masqueradeAll", in.MasqueradeAll, true)
				expect(t, "nodePortAddresses", strings.Join(in.NodePortAddresses, ","), "10.0.0.0/8,fd00::/8")
				expect(t, "detectLocal", in.DetectLocal.Mode+" "+in.DetectLocal.InterfaceNamePrefix, "InterfaceNamePrefix cali")
				expect(t, "syncPeriods", in.MinSyncPeriod.Duration.String()+" "+in.SyncPeriod.Duration.String(), "10s 1m0s")
			},
			wantNotes: []string{"conntrack.tcpBeLiberal: true", "oomScoreAdj: -998"},
		},
		{
			name: "alongside kube-proxy: own ports and bit, conntrack left alone, labeled Services only",
			file: "kubeadm-configmap.yaml",
			opts: Options{Alongside: true, Namespaces: []string{"shop", "web"}},
			check: func(t *testing.T, c *config.Config) {
				in := c.Instances[0]
				expect(t, "healthzBindAddress", c.HealthzBindAddress, "0.0.0.0:10356")
				expect(t, "metricsBindAddress", c.MetricsBindAddress, "127.0.0.1:10349")
				expect(t, "masqueradeBit", *c.MasqueradeBit, 13)
				expect(t, "conntrack.maxPerCore", *c.Conntrack.MaxPerCore, 0)
				expect(t, "conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout.Duration, 0)
				expect(t, "default", in.Default, false)
				expect(t, "proxyNames", strings.Join(in.ProxyNames, ","), "shardproxy")
				expect(t, "namespaces", strings.Join(in.Tenant.Namespaces, ","), "shop,web")
			},
			wantNotes: []string{"featureGates"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, out := load(t, tc.file, tc.opts)
			tc.check(t, cfg)
			notes := out[:strings.Index(out, "apiVersion:")]
			for _, want := range tc.wantNotes {
				if !strings.Contains(notes, "# - "+want) {
					t.Errorf("no note %q in the header:\n%s", want, notes)
				}
			}
		})
	}
}

func expect[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// convertYAML converts a KubeProxyConfiguration given by its fields (YAML after the
// apiVersion and kind lines) and decodes the result as a shardproxy configuration.
func convertYAML(t *testing.T, fields string) (*config.Config, []byte) {
	t.Helper()
	kp, err := Decode([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + fields))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Convert(kp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Decode(out, "t")
	if err != nil {
		t.Fatal(err)
	}
	return cfg, out
}

// TestConvertBindAddresses: kube-proxy's spellings of a bind address, each listening
// where kube-proxy's would.
func TestConvertBindAddresses(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "0.0.0.0:10256"},
		{":10256", "0.0.0.0:10256"},
		{"10.0.0.1", "10.0.0.1:10256"},
		{"[::]:10300", "[::]:10300"},
		{"10.0.0.0/8:10256", "0.0.0.0:10256"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			cfg, _ := convertYAML(t, "healthzBindAddress: \""+tc.in+"\"\n")
			if cfg.HealthzBindAddress != tc.want {
				t.Errorf("healthzBindAddress %q, want %q", cfg.HealthzBindAddress, tc.want)
			}
		})
	}
}

// TestConvertIPVSSchedulers: the IPVS schedulers with a load-balancing mode that picks
// alike carry over; the others fall back to random with a note.
func TestConvertIPVSSchedulers(t *testing.T) {
	for _, tc := range []struct{ scheduler, wantMode, wantNote string }{
		{"", "roundRobin", ""},
		{"rr", "roundRobin", ""},
		{"sh", "sourceHash", ""},
		{"mh", "consistentHash", ""},
		{"wlc", "", `ipvs.scheduler: "wlc": no counterpart`}, // "": the default, random
	} {
		t.Run(tc.scheduler, func(t *testing.T) {
			cfg, out := convertYAML(t, "mode: ipvs\nipvs: {scheduler: \""+tc.scheduler+"\"}\n")
			cfg.DefaultWith(func(string) string { return "node-1" }, nil)
			if got := cfg.Instances[0].LoadBalancing.Mode; got != tc.wantMode {
				t.Errorf("loadBalancing.mode %q, want %q", got, tc.wantMode)
			}
			if tc.wantNote != "" && !strings.Contains(string(out), tc.wantNote) {
				t.Errorf("no note %q:\n%s", tc.wantNote, out)
			}
		})
	}
}

// TestConvertIsDeterministic: the same input gives the same output (maps are sorted).
func TestConvertIsDeterministic(t *testing.T) {
	_, first := load(t, "kubeadm-configmap.yaml", Options{})
	for range 5 {
		if _, again := load(t, "kubeadm-configmap.yaml", Options{}); again != first {
			t.Fatalf("outputs differ:\n%s\n---\n%s", first, again)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, input, wantErr string
	}{
		{"not kube-proxy's", "apiVersion: v1\nkind: Pod\n", `not a kube-proxy configuration: apiVersion "v1" kind "Pod"`},
		{"unknown field", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmodee: ipvs\n", `unknown field "modee"`},
		{"ConfigMap without one", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kube-proxy, namespace: kube-system}\ndata: {other: 'x: 1'}\n",
			"ConfigMap kube-system/kube-proxy holds no kube-proxy configuration"},
		{"ConfigMap with a bad one", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kube-proxy, namespace: kube-system}\ndata:\n  config.conf: 'apiVersion: v1'\n",
			"ConfigMap kube-system/kube-proxy, key config.conf: not a kube-proxy configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.input))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestConvertErrors(t *testing.T) {
	for _, tc := range []struct {
		name, input, wantErr string
	}{
		{"Windows mode", "mode: kernelspace\n", `mode "kernelspace"`},
		{"unknown local detection", "detectLocalMode: Magic\n", `detectLocalMode "Magic"`},
		{"bad bind address", "healthzBindAddress: nowhere:10256\n", `healthzBindAddress "nowhere:10256": not an IP address`},
		{"bad port", "metricsBindAddress: 127.0.0.1:http\n", `metricsBindAddress "127.0.0.1:http": bad port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kp, err := Decode([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n" + tc.input))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Convert(kp, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestConvertForOverlays converts kubeadm's kube-proxy ConfigMap (testdata, as kubeadm
// v1.36 writes it) into what deploy/'s overlays can run, and checks what the header says
// it changed and why.
func TestConvertForOverlays(t *testing.T) {
	kubeadm, err := os.ReadFile("testdata/kubeadm-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	edit := func(old, new string) []byte {
		t.Helper()
		if !strings.Contains(string(kubeadm), old) {
			t.Fatalf("testdata/kubeadm-configmap.yaml has no %q", old)
		}
		return []byte(strings.Replace(string(kubeadm), old, new, 1))
	}
	for _, tc := range []struct {
		name        string
		input       []byte
		alongside   bool
		wantErr     string
		want        []string // in the output
		wantNot     []string
		wantConfig  func(t *testing.T, c *config.Config)
		wantAPIHost string
	}{
		{
			name:  "replace: kubeadm's kubeconfig path left out, its server named for apiserver-endpoint.yaml",
			input: kubeadm,
			want: []string{
				"# - clientConnection.kubeconfig /var/lib/kube-proxy/kubeconfig.conf is left out",
				"set KUBERNETES_SERVICE_HOST=control-plane.example and KUBERNETES_SERVICE_PORT=6443 in deploy/overlays/replace-kube-proxy/apiserver-endpoint.yaml",
				"control-plane.example is a name: the pod resolves it through the node's resolver",
			},
			wantNot:     []string{"kubeconfig: /var/lib/kube-proxy"},
			wantAPIHost: "control-plane.example",
		},
		{
			name:        "replace: an IP address as the server needs no resolver",
			input:       edit("server: https://control-plane.example:6443", "server: https://10.0.0.10:6443"),
			want:        []string{"set KUBERNETES_SERVICE_HOST=10.0.0.10 and KUBERNETES_SERVICE_PORT=6443"},
			wantNot:     []string{"is a name"},
			wantAPIHost: "10.0.0.10",
		},
		{
			name:  "replace: no kubeconfig in the ConfigMap, the endpoint is for the operator to set",
			input: []byte(strings.Split(string(kubeadm), "  kubeconfig.conf: |-")[0]),
			want:  []string{"kube-proxy's configuration does not say where it is; set KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"},
		},
		{
			name:      "alongside: the kubeconfig path left out, no endpoint to set (kube-proxy keeps serving the kubernetes Service)",
			input:     kubeadm,
			alongside: true,
			want:      []string{"# - clientConnection.kubeconfig /var/lib/kube-proxy/kubeconfig.conf is left out"},
			wantNot:   []string{"KUBERNETES_SERVICE_HOST"},
		},
		{
			name:      "alongside an IPVS-mode kube-proxy is refused",
			input:     edit(`mode: ""`, "mode: ipvs"),
			alongside: true,
			wantErr:   "shardproxy does not run beside kube-proxy in IPVS mode",
		},
		{
			name:  "replacing an IPVS-mode kube-proxy is converted",
			input: edit(`mode: ""`, "mode: ipvs"),
			want:  []string{"mode ipvs", "loadBalancing:"},
		},
		{
			name:  "replace: conntrack sysctls the pod cannot write are left alone, kube-proxy's own values noted with where to set them",
			input: edit("maxPerCore: null", "maxPerCore: 65536"),
			want: []string{
				"# - conntrack.maxPerCore: 65536: shardproxy's unprivileged container cannot write /proc/sys; the replace overlay's conntrack-sysctls.yaml init container writes kube-proxy's default (32768)",
			},
			wantConfig: func(t *testing.T, c *config.Config) {
				expect(t, "conntrack.maxPerCore", *c.Conntrack.MaxPerCore, 0)
				expect(t, "conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout.Duration, 0)
				expect(t, "conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout.Duration, 0)
			},
		},
		{
			name:  "replace: a UDP timeout neither the pod nor the overlay sets",
			input: edit("udpTimeout: 0s\n", "udpTimeout: 30s\n"),
			want:  []string{"# - conntrack.udpTimeout: 30s: shardproxy's unprivileged container cannot write /proc/sys, and the replace overlay's init container does not set it"},
		},
		{
			name:    "replace: kube-proxy's default conntrack values need no note",
			input:   kubeadm,
			wantNot: []string{"# - conntrack."},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kp, err := Decode(tc.input)
			if err != nil {
				t.Fatal(err)
			}
			server, err := APIServer(tc.input)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantAPIHost != "" {
				host, _, err := Endpoint(server)
				if err != nil || host != tc.wantAPIHost {
					t.Errorf("Endpoint(%q) = %q, %v; want %q", server, host, err, tc.wantAPIHost)
				}
			}
			out, err := Convert(kp, Options{Alongside: tc.alongside, APIServer: server, Source: "kubeadm"})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			text := string(out)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("no %q in:\n%s", w, text)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(text, w) {
					t.Errorf("%q in:\n%s", w, text)
				}
			}
			if tc.wantConfig != nil {
				cfg, err := config.Decode(out, "t")
				if err != nil {
					t.Fatal(err)
				}
				tc.wantConfig(t, cfg)
			}
		})
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct{ server, host, port, wantErr string }{
		{server: "https://10.0.0.10:6443", host: "10.0.0.10", port: "6443"},
		{server: "https://[fd00::10]:6443", host: "fd00::10", port: "6443"},
		{server: "https://api.example", host: "api.example", port: "443"},
		{server: "10.0.0.10:6443", wantErr: "not a URL with a host"},
	} {
		t.Run(tc.server, func(t *testing.T) {
			host, port, err := Endpoint(tc.server)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || host != tc.host || port != tc.port {
				t.Errorf("got %q %q %v, want %q %q", host, port, err, tc.host, tc.port)
			}
		})
	}
}
