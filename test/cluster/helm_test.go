package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHelmChart runs deploy/helm/shardproxy's lifecycle with the Helm CLI (go.mod's
// helm.sh/helm/v3, built from its module) as docs/install.md tells an operator: `helm
// install` in replace mode (the image and the API server endpoint set as values) on
// every node; `helm upgrade` to a new image tag (the image retagged in both nodes'
// containerd), a rolling update of the DaemonSet, under client loops from every node, the
// outside and pods on every node to a Service with endpoints on both nodes, none of which
// may fail; then `helm uninstall`, whose post-delete hook DaemonSet deletes shardproxy's
// tables: afterwards nft lists no shardproxy table in any node's namespace.
func TestHelmChart(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	// The overlays' objects (the same names as the chart's) go first: Helm installs only
	// objects no one else owns.
	c.removeShardproxy(ctx, t)
	c.deleteOverlayObjects(ctx, t)
	const release, ns = "shardproxy", "kube-system"
	upgradeTag := shardproxyTag + "-helm"
	t.Cleanup(func() {
		// A test that failed half-way leaves neither the release nor its hook behind.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := c.Helm(ctx, "status", release, "-n", ns); err == nil && strings.Contains(out, "STATUS:") {
			_, _ = c.Helm(ctx, "uninstall", release, "-n", ns, "--wait", "--timeout", "90s")
		}
		_ = c.Client.AppsV1().DaemonSets(ns).Delete(ctx, "shardproxy-cleanup", metav1.DeleteOptions{})
		c.removeShardproxy(ctx, t)
	})

	t0 := time.Now()
	out, err := c.Helm(ctx, "install", release, c.ChartDir(), "--namespace", ns,
		"--set", "mode=replace",
		"--set", "image.repository=localhost/shardproxy",
		"--set", "image.tag="+shardproxyTag,
		"--set", "apiServer.host="+APIServerIP,
		"--set", fmt.Sprintf("apiServer.port=%d", APIPort),
		"--wait", "--timeout", "3m")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install:\n%s", out)
	if _, err := c.WaitDaemonSetRolledOut(ctx, ns, "shardproxy", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	installTook := time.Since(t0)
	for _, n := range c.Nodes {
		var tables []string
		err := poll(ctx, time.Minute, "the default instance's and the node's tables on "+n.Name, func() (bool, error) {
			var err error
			tables, err = n.NFTTables(ctx)
			return containsPrefix(tables, "ip shardproxy-default") && containsPrefix(tables, "ip shardproxy_node"), err
		})
		if err != nil {
			t.Fatalf("helm install: %v: %s has %q", err, n.Name, tables)
		}
	}
	fmt.Printf("cluster: helm install (replace mode, image %s): the DaemonSet rolled out on %d nodes in %v\n", shardproxyTag, len(c.Nodes), installTook.Round(time.Millisecond))

	const webNS = "helm"
	t.Cleanup(func() { deleteNamespace(t, c, webNS) })
	web := c.spreadWeb(ctx, t, webNS, "", 2)

	if err := c.TagImage(ctx, "localhost/shardproxy:"+shardproxyTag, "localhost/shardproxy:"+upgradeTag); err != nil {
		t.Fatal(err)
	}
	took, counters := c.fleetLoops(ctx, t, web, func() {
		out, err := c.Helm(ctx, "upgrade", release, c.ChartDir(), "--namespace", ns, "--reuse-values",
			"--set", "image.tag="+upgradeTag, "--wait", "--timeout", "3m")
		if err != nil {
			t.Error(err)
			return
		}
		t.Logf("helm upgrade:\n%s", out)
		if _, err := c.WaitDaemonSetRolledOut(ctx, ns, "shardproxy", 3*time.Minute); err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	for _, n := range c.Nodes {
		if img := shardproxyPod(ctx, t, c, n).Spec.Containers[0].Image; img != "localhost/shardproxy:"+upgradeTag {
			t.Errorf("after helm upgrade the pod on %s runs %s, want localhost/shardproxy:%s", n.Name, img, upgradeTag)
		}
	}
	what := fmt.Sprintf("helm upgrade to %s (%v)", upgradeTag, took.Round(time.Millisecond))
	if _, failed := reportLoops(t, what, counters); failed > 0 {
		c.dumpServing(ctx, t, web)
	}

	// Uninstall: the release's objects go, then its post-delete hook's DaemonSet cleans
	// every node; the operator waits for its rollout and deletes it (docs/install.md).
	t0 = time.Now()
	out, err = c.Helm(ctx, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "2m")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm uninstall:\n%s", out)
	err = poll(ctx, 2*time.Minute, "the release's shardproxy pods gone", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitDaemonSetRolledOut(ctx, ns, "shardproxy-cleanup", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	uninstallTook := time.Since(t0)
	for _, n := range c.Nodes {
		pod, err := podOn(ctx, c, n, ns, "app.kubernetes.io/name=shardproxy-cleanup")
		if err != nil {
			t.Fatal(err)
		}
		if img := pod.Spec.InitContainers[0].Image; img != "localhost/shardproxy:"+upgradeTag {
			t.Errorf("the cleanup hook on %s runs %s, want the release's image localhost/shardproxy:%s", n.Name, img, upgradeTag)
		}
		log, err := c.Kubectl(ctx, "", "logs", "-n", ns, pod.Name, "-c", "cleanup")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the cleanup hook's log on %s:\n%s", n.Name, log)
	}
	c.noShardproxyTables(ctx, t, "after helm uninstall")
	if out, err := c.Helm(ctx, "list", "--all", "--namespace", ns, "--short"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("helm list after uninstall: %q, %v; want no release", out, err)
	}
	if err := c.Client.AppsV1().DaemonSets(ns).Delete(ctx, "shardproxy-cleanup", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = poll(ctx, 2*time.Minute, "the cleanup hook's pods gone", func() (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy-cleanup"})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, "shardproxy-system", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after helm uninstall the namespace shardproxy-system: %v, want not found", err)
	}
	fmt.Printf("cluster: helm uninstall: the release gone and its cleanup hook rolled out in %v; no shardproxy table on %d nodes (nft list tables in each node's namespace)\n", uninstallTook.Round(time.Millisecond), len(c.Nodes))
	fmt.Printf("cluster: helm install -> upgrade -> uninstall took %v\n", time.Since(start).Round(time.Second))
}

// deleteOverlayObjects deletes what applying deploy/'s overlays left besides the
// DaemonSet (removeShardproxy's): the ServiceAccount, RBAC, the node-status namespace and
// policy, the configurations. Both overlays name their objects alike, but for the
// configuration's hash: every shardproxy-config-* ConfigMap of kube-system goes.
func (c *Cluster) deleteOverlayObjects(ctx context.Context, t *testing.T) {
	t.Helper()
	yaml, err := RenderOverlay(Overlay{Dir: c.OverlayDir(ReplaceOverlay), Image: "localhost/shardproxy:" + shardproxyTag, APIServer: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Kubectl(ctx, string(yaml), "delete", "--ignore-not-found", "--wait=true", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	cms, err := c.Client.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if strings.HasPrefix(cm.Name, "shardproxy-config-") {
			if err := c.Client.CoreV1().ConfigMaps("kube-system").Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
}
