package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeUp checks what Start promised: every node Ready with an IPv4 and an IPv6
// address and pod CIDR, the cluster DNS pod Ready behind the kube-dns Service with an
// endpoint from the EndpointSlice controller.
func TestNodeUp(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if want := []string{n.IP, n.IPv6}; !slices.Equal(internal, want) {
			t.Errorf("node %s has InternalIPs %v, want %v", n.Name, internal, want)
		}
		if len(node.Spec.PodCIDRs) != 2 || !strings.Contains(node.Spec.PodCIDRs[1], ":") {
			t.Errorf("node %s has pod CIDRs %v, want one IPv4 and one IPv6", n.Name, node.Spec.PodCIDRs)
		}
		t.Logf("%s: %v, pod CIDRs %v", n.Name, internal, node.Spec.PodCIDRs)
	}
	slices, err := c.Client.DiscoveryV1().EndpointSlices("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kube-dns"})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				ready++
			}
		}
	}
	if ready == 0 {
		t.Errorf("kube-dns has no ready endpoint: %s", c.PodSummary(ctx, "kube-system"))
	}
}

// TestReplaceOverlay applies deploy/overlays/replace-kube-proxy as a user would, with only
// the image and the API server endpoint changed through kustomize, and checks the pod
// becomes Ready on every node, programs each node's own tables, serves the kubernetes and
// kube-dns Services to each node, and that `kubectl logs` shows node-1's pod's log. The
// later scenarios run on this deployment.
func TestReplaceOverlay(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	deployReplaceOverlay(ctx, t, c, shardproxyTag)

	for _, n := range c.Nodes {
		var tables []string
		err := poll(ctx, time.Minute, n.Name+"'s default instance's table", func() (bool, error) {
			var err error
			tables, err = n.NFTTables(ctx)
			return containsPrefix(tables, "ip shardproxy-default"), err
		})
		if err != nil {
			t.Fatalf("%v: %s has %q", err, n.Name, tables)
		}
		t.Logf("%s's tables: %v", n.Name, tables)

		// The kubernetes Service from the node: kube-apiserver answers through its ClusterIP.
		httpClient := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			DialContext:     c.Dialer(n.NS),
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		}}
		resp, err := httpClient.Get("https://10.96.0.1/readyz")
		if err != nil {
			t.Errorf("kubernetes Service from %s: %v", n.Name, err)
		} else {
			resp.Body.Close()
			t.Logf("https://10.96.0.1/readyz from %s: %s", n.Name, resp.Status)
		}

		// Cluster DNS through the kube-dns Service.
		resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return c.Dialer(n.NS)(ctx, network, net.JoinHostPort(DNSIP, "53"))
		}}
		addrs, err := resolver.LookupHost(ctx, "kubernetes.default.svc.cluster.local")
		if err != nil || len(addrs) != 1 || addrs[0] != "10.96.0.1" {
			t.Errorf("kubernetes.default through kube-dns from %s: %v, %v; want [10.96.0.1]", n.Name, addrs, err)
		}
	}

	pod := shardproxyPod(ctx, t, c, c.Node(1))
	logs, err := c.Kubectl(ctx, "", "logs", "-n", "kube-system", pod.Name, "-c", "shardproxy")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(logs, "\n"); lines == 0 {
		t.Errorf("kubectl logs printed nothing")
	} else {
		t.Logf("kubectl logs: %d lines", lines)
	}
	init, err := c.Kubectl(ctx, "", "logs", "-n", "kube-system", pod.Name, "-c", "conntrack-sysctls")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("init container log:\n%s", init)
}

// deployReplaceOverlay applies the replace overlay with the image tag and waits for it.
func deployReplaceOverlay(ctx context.Context, t *testing.T, c *Cluster, tag string) {
	t.Helper()
	took := applyOverlay(ctx, t, c, Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + tag, APIServer: true})
	fmt.Printf("cluster: replace-kube-proxy overlay (image %s) applied and its pod Ready in %v\n", tag, took.Round(time.Millisecond))
}

// applyOverlay applies o (Cluster.ApplyOverlay) and waits for the shardproxy DaemonSet,
// failing the test on error; it returns how long that took.
func applyOverlay(ctx context.Context, t *testing.T, c *Cluster, o Overlay) time.Duration {
	t.Helper()
	took, err := c.ApplyOverlay(ctx, o, "shardproxy", 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return took
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// agnhostImage is upstream's test image, built offline (hack/build-image.sh agnhost);
// TestMain sets its tag.
var agnhostImage string

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containsWord reports whether text has ip as a whole word (not 10.96.0.1 in 10.96.0.10).
func containsWord(text, ip string) bool {
	for _, f := range strings.FieldsFunc(text, func(r rune) bool {
		return r == ' ' || r == '\t' || r == '\n' || r == '/' || r == ',' || r == '{' || r == '}' || r == ':'
	}) {
		if f == ip {
			return true
		}
	}
	return false
}
