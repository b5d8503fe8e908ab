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
				expect(t, "kubeconfig", c.Kubeconfig, "/var/lib/kube-proxy/kubeconfig.conf")
				expect(t, "healthzBindAddress", c.HealthzBindAddress, "0.0.0.0:10256")
				expect(t, "metricsBindAddress", c.MetricsBindAddress, "127.0.0.1:10249")
				expect(t, "clientConnection.qps", c.ClientConnection.QPS, 5) // kubeadm leaves 0: the default
				expect(t, "masqueradeBit", *c.MasqueradeBit, 14)
				expect(t, "conntrack.maxPerCore", *c.Conntrack.MaxPerCore, 32768)
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
				expect(t, "conntrack", c.Conntrack.TCPEstablishedTimeout.Duration, 24*time.Hour)
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
