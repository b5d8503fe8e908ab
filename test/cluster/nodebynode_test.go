package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeByNodeMigration stages the switch from upstream kube-proxy to shardproxy the
// other way operators do it, a node at a time (issue 30, item 5): node-1 runs kube-proxy
// v1.36.3 in iptables mode, a DaemonSet restricted by its node selector, and the other
// nodes run the replace overlay, restricted the same way; pods on every node reach a
// Service with endpoints on every node. Then node-1 is switched over under client loops
// from every node (node, outside, pod): its label changes, so that the DaemonSet
// controller removes kube-proxy's pod there and schedules shardproxy's; once shardproxy
// is Ready on node-1, `shardproxy cleanup --legacy iptables` runs on node-1 (as an
// operator runs it on the node) and removes kube-proxy's rules, which served meanwhile.
// No request may fail, and afterwards shardproxy alone has rules on node-1.
func TestNodeByNodeMigration(t *testing.T) {
	c := need(t)
	if len(c.Nodes) < 2 {
		t.Skipf("%d node: a node-by-node migration needs two ($%s)", len(c.Nodes), NodesEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c.removeShardproxy(ctx, t)
	cli := c.shardproxyCLI(ctx, t)
	n1 := c.Node(1)
	c.labelNode(ctx, t, n1, serviceProxyLabel, "kube-proxy")
	for _, n := range c.Nodes[1:] {
		c.labelNode(ctx, t, n, serviceProxyLabel, "shardproxy")
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			c.labelNode(context.Background(), t, n, serviceProxyLabel, "")
		}
	})
	c.startKubeProxyDaemonSet(ctx, t, map[string]string{serviceProxyLabel: "kube-proxy"})
	t.Cleanup(func() { c.removeShardproxy(context.Background(), t) })
	applyOverlay(ctx, t, c, Overlay{
		Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + shardproxyTag, APIServer: true,
		NodeSelector: map[string]string{serviceProxyLabel: "shardproxy"},
	})
	for _, n := range c.Nodes {
		kp, err := c.kubeProxyPods(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy", FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			t.Fatal(err)
		}
		wantKP := 0
		if n == n1 {
			wantKP = 1
		}
		if len(kp) != wantKP || len(sp.Items) != 1-wantKP {
			t.Fatalf("%s runs %d kube-proxy and %d shardproxy pods, want %d and %d", n.Name, len(kp), len(sp.Items), wantKP, 1-wantKP)
		}
	}

	const ns = "nodebynode"
	t.Cleanup(func() { deleteNamespace(t, c, ns) })
	web := c.spreadWeb(ctx, t, ns, "", 2)
	// Before: each node's proxy alone has rules for the Service; pods on every node
	// reach both endpoints through it.
	for _, n := range c.Nodes {
		owner := "shardproxy"
		if n == n1 {
			owner = "kube-proxy"
		}
		c.waitNodeProxy(ctx, t, n, web.ClusterIP, owner)
		cnt, err := c.PodLoopOn(ctx, n, ns, agnhostImage, "http://web."+ns+".svc.cluster.local/hostname", 40, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("cluster: node by node: before: pod on %s (%s) -> DNS name: %s\n", n.Name, owner, cnt)
		if cnt.Failed.Load() > 0 || len(cnt.ServedBy()) != 2 {
			t.Errorf("before the switch, a pod on %s (%s): %s; want every request answered, by both pods", n.Name, owner, cnt)
		}
	}

	var kubeProxyGone, shardproxyReady, cleanedUp time.Duration
	var cleanupOut string
	took, counters := c.fleetLoops(ctx, t, web, func() {
		start := time.Now()
		c.labelNode(ctx, t, n1, serviceProxyLabel, "shardproxy")
		err := poll(ctx, 2*time.Minute, "kube-proxy's pod gone from "+n1.Name, func() (bool, error) {
			pods, err := c.kubeProxyPods(ctx, n1)
			return err == nil && len(pods) == 0, nil
		})
		if err != nil {
			t.Error(err)
			return
		}
		kubeProxyGone = time.Since(start)
		if err := c.waitShardproxyReadyOn(ctx, n1, 2*time.Minute); err != nil {
			t.Error(err)
			return
		}
		shardproxyReady = time.Since(start)
		// On the node, as root: the CLI refuses while a kube-proxy runs in the node's
		// network namespace, so this also checks that it is gone.
		out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+n1.NS, cli, "cleanup", "--legacy", "iptables").CombinedOutput()
		cleanupOut = string(out)
		if err != nil {
			t.Errorf("shardproxy cleanup --legacy iptables on %s: %v\n%s", n1.Name, err, out)
			return
		}
		cleanedUp = time.Since(start)
	})
	t.Logf("shardproxy cleanup --legacy iptables on %s:\n%s", n1.Name, cleanupOut)
	if t.Failed() {
		t.FailNow()
	}
	what := fmt.Sprintf("node by node: %s switched from kube-proxy to shardproxy (%v: kube-proxy's pod gone at %v, shardproxy Ready at %v, kube-proxy's rules cleaned up at %v)",
		n1.Name, took.Round(time.Millisecond), kubeProxyGone.Round(time.Millisecond), shardproxyReady.Round(time.Millisecond), cleanedUp.Round(time.Millisecond))
	if _, failed := reportLoops(t, what, counters); failed > 0 {
		c.dumpServing(ctx, t, web)
	}
	// After: shardproxy alone, on every node; no KUBE- chain left on node-1.
	for _, n := range c.Nodes {
		c.waitNodeProxy(ctx, t, n, web.ClusterIP, "shardproxy")
	}
	nat, err := n1.Run(ctx, "iptables-save")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(nat, "\n") {
		if strings.HasPrefix(line, ":KUBE-SVC") || strings.HasPrefix(line, ":KUBE-SEP") || strings.HasPrefix(line, ":KUBE-SERVICES") || strings.HasPrefix(line, ":KUBE-NODEPORTS") {
			t.Errorf("after cleanup --legacy iptables %s still has kube-proxy's chain %s", n1.Name, line)
		}
	}
}
