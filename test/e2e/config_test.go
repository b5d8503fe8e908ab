package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestConfigFromKubeProxyConfigMap: `shardproxy config from-kube-proxy --from-cluster`
// reads kubeadm's kube-proxy ConfigMap from the real apiserver through a kubeconfig, and
// `shardproxy check` accepts what it prints.
func TestConfigFromKubeProxyConfigMap(t *testing.T) {
	e := environment(t)
	ctx := context.Background()
	data, err := os.ReadFile("../../supervisor/config/fromkubeproxy/testdata/kubeadm-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(data, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Name = "kube-proxy-e2e" // the coexist suite's kube-proxy may own kube-system/kube-proxy
	if _, err := e.Client.CoreV1().ConfigMaps("kube-system").Create(ctx, &cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.CoreV1().ConfigMaps("kube-system").Delete(ctx, cm.Name, metav1.DeleteOptions{}) })

	out, err := e.TP.Exec(e.TP.Node, e.Binary, "config", "from-kube-proxy", "--from-cluster",
		"--kubeconfig", e.CP.Kubeconfig, "--configmap", "kube-system/"+cm.Name)
	if err != nil {
		t.Fatalf("config from-kube-proxy: %v", err)
	}
	for _, want := range []string{"(ConfigMap kube-system/kube-proxy-e2e, mode iptables)", "clusterCIDRs: [10.244.0.0/16]", "# - featureGates: KubeProxyDrainingTerminatingNodes=true"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	path := filepath.Join(t.TempDir(), "converted.yaml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if checked, err := e.TP.Exec(e.TP.Node, "env", "NODE_NAME=node-1", e.Binary, "check", "--skip-probe", "--config", path); err != nil {
		t.Errorf("check of the converted configuration: %v\n%s", err, checked)
	}
}
