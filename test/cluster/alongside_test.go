package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAlongsideOverlay applies deploy/overlays/alongside-kube-proxy, with only the image
// changed through kustomize, to a node whose Service proxy is upstream kube-proxy
// (iptables mode, as the overlay's users run it): shardproxy reaches kube-apiserver
// through the kubernetes Service kube-proxy serves, becomes Ready on its own ports, and
// serves team-a's labeled Service while kube-proxy keeps the unlabeled one; traffic from
// the node, the outside and pods reaches both. The node is left without either proxy.
func TestAlongsideOverlay(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c.startKubeProxy(ctx, t, "iptables")
	t.Cleanup(func() { c.removeShardproxy(context.Background(), t) })

	took := applyOverlay(ctx, t, c, Overlay{Dir: c.OverlayDir(AlongsideOverlay), Image: "localhost/shardproxy:" + shardproxyTag})
	fmt.Printf("cluster: alongside-kube-proxy overlay (image %s) beside kube-proxy (iptables): pod Ready in %v\n", shardproxyTag, took.Round(time.Millisecond))

	labeled, err := c.DeployWeb(ctx, "team-a", agnhostImage, "team-a", 2)
	if err != nil {
		t.Fatal(err)
	}
	unlabeled, err := c.DeployWeb(ctx, "plain", agnhostImage, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ns := range []string{"team-a", "plain"} {
			_ = c.Client.AppsV1().Deployments(ns).Delete(context.Background(), "web", metav1.DeleteOptions{})
			_ = c.Client.CoreV1().Services(ns).Delete(context.Background(), "web", metav1.DeleteOptions{})
		}
	})
	for _, n := range c.Nodes {
		err = poll(ctx, time.Minute, "team-a's table on "+n.Name, func() (bool, error) {
			tables, err := n.NFTTables(ctx)
			return containsPrefix(tables, "ip shardproxy-team-a"), err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	n1 := c.Node(1)
	// The overlay's team-a instance balances by consistent hash of the client, so one
	// client sees one pod; kube-proxy picks at random.
	pods := map[*Web]int{labeled: 1, unlabeled: 2}
	for _, web := range []*Web{labeled, unlabeled} {
		took, err := c.WaitServedByAll(ctx, n1.NS, "http://"+web.ClusterIP+"/hostname", pods[web])
		if err != nil {
			c.dumpServing(ctx, t, web)
			t.Fatal(err)
		}
		fmt.Printf("cluster: alongside: %-7s %d pods answer through the ClusterIP %v after the Deployment is available\n", web.Namespace, pods[web], took.Round(time.Millisecond))
		for _, path := range trafficPaths(c, n1, web) {
			n := path.run(ctx, t, 20)
			fmt.Printf("cluster: alongside: %-7s %-20s %s\n", web.Namespace, path.name, n)
			if n.Failed.Load() > 0 || len(n.ServedBy()) < pods[web] {
				t.Errorf("%s, %s: %s; want every request answered, by %d pods at least", web.Namespace, path.name, n, pods[web])
			}
		}
	}
	// Which proxy serves which (on node-1): kube-proxy has no rule for the labeled
	// Service, and shardproxy's team-a table none for the unlabeled one.
	kubeProxyRules, err := n1.Run(ctx, "iptables-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	teamA, err := n1.Run(ctx, "nft", "list", "table", "ip", "shardproxy-team-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, check := range []struct {
		what, rules, ip string
		want            bool
	}{
		{"kube-proxy, unlabeled", kubeProxyRules, unlabeled.ClusterIP, true},
		{"kube-proxy, labeled", kubeProxyRules, labeled.ClusterIP, false},
		{"shardproxy team-a, labeled", teamA, labeled.ClusterIP, true},
		{"shardproxy team-a, unlabeled", teamA, unlabeled.ClusterIP, false},
	} {
		if got := containsWord(check.rules, check.ip); got != check.want {
			t.Errorf("%s: rules mention %s: %v, want %v", check.what, check.ip, got, check.want)
		}
	}
}

// dumpServing logs what node-1 and the API say about web's Service, for a failure.
func (c *Cluster) dumpServing(ctx context.Context, t *testing.T, web *Web) {
	t.Helper()
	slices, _ := c.Kubectl(ctx, "", "get", "endpointslices", "-n", web.Namespace, "-o", "wide")
	pods, _ := c.Kubectl(ctx, "", "get", "pods", "-n", web.Namespace, "-o", "wide")
	tables, _ := c.Node(1).Run(ctx, "nft", "list", "ruleset")
	var logs string
	if pod, err := podOn(ctx, c, c.Node(1), "kube-system", "app.kubernetes.io/name=shardproxy"); err == nil {
		logs, _ = c.Kubectl(ctx, "", "logs", "-n", "kube-system", pod.Name, "-c", "shardproxy", "--tail=60")
	}
	t.Logf("EndpointSlices:\n%s\npods:\n%s", slices, pods)
	t.Logf("shardproxy log:\n%s", logs)
	for _, line := range strings.Split(tables, "\n") {
		if strings.Contains(line, web.ClusterIP) || strings.Contains(line, "10.244.") {
			t.Logf("nft: %s", strings.TrimSpace(line))
		}
	}
}
