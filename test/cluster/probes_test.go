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
// kubelet: while the Node is being deleted, /healthz fails, so the kubelet marks the pod
// unready, and /livez does not, so the kubelet does not restart it (over longer than the
// liveness probe's failure threshold). The Node is then let go and the kubelet restarted,
// which registers it again, and the cluster is back as before.
func TestProbesGateThePod(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	deployReplaceOverlay(ctx, t, c, shardproxyTag)
	pod := shardproxyPod(ctx, t, c)
	restarts := pod.Status.ContainerStatuses[0].RestartCount

	patch := []byte(`{"metadata":{"finalizers":["` + holdFinalizer + `"]}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.restoreNode(t) })
	if err := c.Client.CoreV1().Nodes().Delete(ctx, NodeName, metav1.DeleteOptions{}); err != nil {
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
	t.Logf("Node being deleted: pod %s unready after %v", pod.Name, unready.Round(time.Second))
	if got := probe(ctx, c, "/healthz"); got != http.StatusServiceUnavailable {
		t.Errorf("/healthz answers %d while the Node is being deleted, want 503", got)
	}
	if got := probe(ctx, c, "/livez"); got != http.StatusOK {
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
	fmt.Printf("cluster: probes: Node being deleted: pod unready after %v, /healthz 503, /livez 200, still running with %d restarts 75s later\n", unready.Round(time.Second), restarts)
}

func shardproxyPod(ctx context.Context, t *testing.T, c *Cluster) *corev1.Pod {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=shardproxy"})
	if err != nil || len(pods.Items) != 1 || len(pods.Items[0].Status.ContainerStatuses) != 1 {
		t.Fatalf("want one shardproxy pod with its container status: %v, %v", pods, err)
	}
	return &pods.Items[0]
}

// probe returns the status code of the supervisor's health server on the node (the
// replace overlay's port), 0 if it does not answer.
func probe(ctx context.Context, c *Cluster, path string) int {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.Dialer(c.NodeNS)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+NodeIP+":10256"+path, nil)
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

// restoreNode lets the held Node go and restarts the kubelet, which registers it again,
// then waits for the node and the cluster's pods.
func (c *Cluster) restoreNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("releasing the Node: %v", err)
	}
	err := poll(ctx, time.Minute, "the Node gone", func() (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		t.Error(err)
	}
	if err := c.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.waitNodeReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeploymentAvailable(ctx, "kube-system", "coredns", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitDaemonSetRolledOut(ctx, "kube-system", "shardproxy", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}
