package cluster

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// holdFinalizer keeps the Node object while it is being deleted.
const holdFinalizer = "shardproxy.io/test-hold"

// TestProbesGateThePod checks that the DaemonSet's probes do what deploy/ says on a real
// kubelet: while the last node's Node is being deleted, /healthz fails there, so its
// kubelet marks that node's pod unready, and /livez does not, so the kubelet does not
// restart it (over longer than the liveness probe's failure threshold). The Node is then
// let go and the kubelet restarted, which registers it again, and the cluster is back as
// before. The last node, not
// node-1: node-1 holds the control plane, whose pods do not depend on it anyway.
func TestProbesGateThePod(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	deployReplaceOverlay(ctx, t, c, shardproxyTag)
	n := c.Nodes[len(c.Nodes)-1]
	pod := shardproxyPod(ctx, t, c, n)
	restarts := pod.Status.ContainerStatuses[0].RestartCount

	patch := []byte(`{"metadata":{"finalizers":["` + holdFinalizer + `"]}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.restoreNode(t, n) })
	if err := c.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := poll(ctx, 90*time.Second, "the shardproxy pod unready", func() (bool, error) {
		p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && !podReady(p), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	unready := time.Since(start)
	t.Logf("Node %s being deleted: pod %s unready after %v", n.Name, pod.Name, unready.Round(time.Second))
	if got := probe(ctx, c, n, "/healthz"); got != http.StatusServiceUnavailable {
		t.Errorf("/healthz answers %d while the Node is being deleted, want 503", got)
	}
	if got := probe(ctx, c, n, "/livez"); got != http.StatusOK {
		t.Errorf("/livez answers %d while the Node is being deleted, want 200", got)
	}
	// The liveness probe would restart the container after 6 failures 10s apart: watch
	// for longer than that.
	watchUntil := time.Now().Add(75 * time.Second)
	for time.Now().Before(watchUntil) {
		p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs := p.Status.ContainerStatuses[0]
		if podReady(p) || cs.RestartCount != restarts || cs.State.Running == nil {
			t.Fatalf("pod ready %v, restarts %d (was %d), running %v: want unready, running, not restarted", podReady(p), cs.RestartCount, restarts, cs.State.Running != nil)
		}
		time.Sleep(5 * time.Second)
	}
	fmt.Printf("cluster: probes: Node %s being deleted: pod unready after %v, /healthz 503, /livez 200, still running with %d restarts 75s later\n", n.Name, unready.Round(time.Second), restarts)
}

// shardproxyPod is the shardproxy DaemonSet's pod on node n, with its container status.
func shardproxyPod(ctx context.Context, t *testing.T, c *Cluster, n *Node) *corev1.Pod {
	t.Helper()
	pod, err := podOn(ctx, c, n, "kube-system", "app.kubernetes.io/name=shardproxy")
	if err != nil || len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("want one shardproxy pod on %s with its container status: %v, %v", n.Name, pod, err)
	}
	return pod
}

// podOn is the one pod of ns matching selector on node n.
func podOn(ctx context.Context, c *Cluster, n *Node, ns, selector string) (*corev1.Pod, error) {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return nil, err
	}
	if len(pods.Items) != 1 {
		return nil, fmt.Errorf("%d pods %s in %s on %s, want 1", len(pods.Items), selector, ns, n.Name)
	}
	return &pods.Items[0], nil
}

// probe returns the status code of the supervisor's health server on node n (the
// replace overlay's port), 0 if it does not answer.
func probe(ctx context.Context, c *Cluster, n *Node, path string) int {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.Dialer(n.NS)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.IP+":10256"+path, nil)
	if err != nil {
		return 0
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// restoreNode lets node n's held Node go, creates it again with its pod CIDRs (which its
// CNI bridge hands out and the other nodes route: the controller manager would give a
// new Node others) and restarts its kubelet, which registers into it; then it waits for
// the nodes and the cluster's pods.
func (c *Cluster) restoreNode(t *testing.T, n *Node) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("releasing the Node: %v", err)
	}
	err := poll(ctx, time.Minute, "the Node gone", func() (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		t.Error(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}, Spec: corev1.NodeSpec{PodCIDR: n.PodCIDRs[0], PodCIDRs: n.PodCIDRs}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := n.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitNodesReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeploymentAvailable(ctx, "kube-system", "coredns", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitDaemonSetRolledOut(ctx, "kube-system", "shardproxy", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}
