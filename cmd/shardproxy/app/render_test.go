package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// renderNodeWideObjects are objects for testdata/config.yaml's default instance (its
// externalIPCIDRs are 192.0.2.0/24): this node, another Node and a ServiceCIDR whose
// addresses are inside those ranges, and a Service claiming them and a free one.
const renderNodeWideObjects = `apiVersion: v1
kind: Node
metadata: {name: node-1}
status:
  addresses: [{type: InternalIP, address: 192.168.100.1}]
---
apiVersion: v1
kind: Node
metadata: {name: node-2}
status:
  addresses: [{type: InternalIP, address: 192.0.2.20}]
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [192.0.2.128/25]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 172.30.0.10
  clusterIPs: [172.30.0.10]
  externalIPs: [192.0.2.11, 192.0.2.20, 192.0.2.130]
  ports: [{name: http, port: 80}]
`

// TestRenderReadsNodesAndServiceCIDRs: render reads every Node and the ServiceCIDRs of
// --from, and refuses their addresses as a running supervisor does.
func TestRenderReadsNodesAndServiceCIDRs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "objects.yaml"), []byte(renderNodeWideObjects), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI("render", "--config", "testdata/config.yaml", "--instance", "default", "--from", dir)
	if code != 0 {
		t.Fatalf("render failed (%d): %s", code, errOut)
	}
	tests := []struct {
		name, addr string
		served     bool
		warning    string
	}{
		{"a free address is served", "192.0.2.11", true, ""},
		{"another Node's address is refused", "192.0.2.20", false, "192.0.2.20 refused: it is an address of node node-2"},
		{"an address in a ServiceCIDR is refused", "192.0.2.130", false, "192.0.2.130 refused: it is inside the Service CIDR 192.0.2.128/25"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if served := strings.Contains(out, "{ "+tc.addr+" . tcp . 80 : "); served != tc.served {
				t.Errorf("%s served %v, want %v", tc.addr, served, tc.served)
			}
			if tc.warning != "" && !strings.Contains(errOut, "warning: shop/web: externalIP "+tc.warning) {
				t.Errorf("no warning %q in %q", tc.warning, errOut)
			}
		})
	}
}
