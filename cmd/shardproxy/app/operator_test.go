package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
)

// TestStatusAddress: `shardproxy status` asks where the configuration says the
// supervisor serves, on loopback, not kube-proxy's 10256, which beside kube-proxy is
// kube-proxy's own /healthz.
func TestStatusAddress(t *testing.T) {
	dir := t.TempDir()
	write := func(name, healthz string) string {
		p := filepath.Join(dir, name)
		body := "apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\n"
		if healthz != "" {
			body += "healthzBindAddress: " + healthz + "\n"
		}
		body += "instances:\n- name: main\n  proxyNames: [shardproxy]\n  slot: 0\n  tenant:\n    namespaces: [default]\n"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name     string
		addr     string
		config   string
		explicit bool
		want     string
		wantErr  string
	}{
		{name: "--address wins", addr: "127.0.0.1:1", config: write("a.yaml", "0.0.0.0:10356"), want: "127.0.0.1:1"},
		{name: "the alongside port, on loopback", config: write("b.yaml", "0.0.0.0:10356"), want: "127.0.0.1:10356"},
		{name: "IPv6 any becomes ::1", config: write("c.yaml", `"[::]:10356"`), want: "[::1]:10356"},
		{name: "a specific address stays", config: write("d.yaml", "127.0.0.2:10356"), want: "127.0.0.2:10356"},
		{name: "unset is the default 10256", config: write("e.yaml", ""), want: "127.0.0.1:10256"},
		{name: "no configuration in the pod's place: kube-proxy's port", config: filepath.Join(dir, "missing.yaml"), want: "127.0.0.1:10256"},
		{name: "a configuration asked for must exist", config: filepath.Join(dir, "missing.yaml"), explicit: true, wantErr: "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statusAddress(tc.addr, tc.config, tc.explicit)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestStatusReadsTheConfiguredPort runs `shardproxy status --config F` against a
// supervisor's /status on the port F names.
func TestStatusReadsTheConfiguredPort(t *testing.T) {
	h := healthcheck.NewProxyHealth(nil, nil)
	h.AddInstance("team-a")
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	body := "apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\nhealthzBindAddress: 0.0.0.0:" + port +
		"\ninstances:\n- name: team-a\n  proxyNames: [a]\n  slot: 0\n  tenant:\n    namespaces: [a]\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI("status", "--config", cfg)
	if code != 0 || !strings.Contains(out, "team-a") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestOperatorKubeconfigList: KUBECONFIG may list several files (kubectl merges them);
// migrate loads them with clientcmd's rules rather than taking the list as one path.
func TestOperatorKubeconfigList(t *testing.T) {
	dir := t.TempDir()
	cluster := filepath.Join(dir, "cluster.yaml")
	user := filepath.Join(dir, "user.yaml")
	for file, body := range map[string]string{
		cluster: `apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster: {server: "https://192.0.2.1:6443", insecure-skip-tls-verify: true}
contexts:
- name: prod
  context: {cluster: prod, user: admin}
current-context: prod
`,
		user: `apiVersion: v1
kind: Config
users:
- name: admin
  user: {token: secret-token}
`,
	} {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("KUBECONFIG", cluster+string(os.PathListSeparator)+user)
	rc, err := operatorRESTConfig("")
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://192.0.2.1:6443" || rc.BearerToken != "secret-token" {
		t.Errorf("host %q token %q: want the cluster of the first file and the user of the second", rc.Host, rc.BearerToken)
	}
}

// TestSupervisorClientConnection: the supervisor's client takes clientConnection's rate
// and content type, and its requests really ask the API server for protobuf (kube-proxy's
// default) or JSON.
func TestSupervisorClientConnection(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cc         config.ClientConnection
		wantAccept string
	}{
		{name: "defaults: protobuf", cc: config.ClientConnection{}, wantAccept: "application/vnd.kubernetes.protobuf,application/json"},
		{name: "json", cc: config.ClientConnection{QPS: 50, Burst: 100, ContentType: "application/json"}, wantAccept: "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			accepts := make(chan string, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case accepts <- r.Header.Get("Accept"):
				default:
				}
				http.NotFound(w, r)
			}))
			defer srv.Close()
			kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
			body := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: " + srv.URL + "}\n" +
				"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n"
			if err := os.WriteFile(kubeconfig, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := &config.Config{ClientConnection: tc.cc}
			cfg.Default()
			rc, err := restConfig(kubeconfig, cfg.ClientConnection)
			if err != nil {
				t.Fatal(err)
			}
			if rc.QPS != cfg.ClientConnection.QPS || rc.Burst != int(cfg.ClientConnection.Burst) {
				t.Errorf("QPS %v burst %d, want %v %d", rc.QPS, rc.Burst, cfg.ClientConnection.QPS, cfg.ClientConnection.Burst)
			}
			client, err := kubernetes.NewForConfig(rc)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = client.CoreV1().Nodes().Get(context.Background(), "node-1", metav1.GetOptions{})
			if got := <-accepts; got != tc.wantAccept {
				t.Errorf("Accept %q, want %q", got, tc.wantAccept)
			}
		})
	}
}
