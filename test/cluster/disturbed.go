package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podState is what a disruption must not change about a backend pod for its Service's
// endpoints to have stayed put.
type podState struct {
	ip       string
	restarts int32
}

// BackendPods records the pods of the web Deployment in ns.
func (c *Cluster) BackendPods(ctx context.Context, ns string) (map[string]podState, error) {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		return nil, err
	}
	out := map[string]podState{}
	for _, p := range pods.Items {
		var restarts int32
		for _, cs := range p.Status.ContainerStatuses {
			restarts += cs.RestartCount
		}
		out[p.Name] = podState{ip: p.Status.PodIP, restarts: restarts}
	}
	return out, nil
}

// BackendsDisturbed says why ns's web pods did not stay as before since since (replaced,
// restarted, a new IP, or their readiness changed), or "" if they did: a proxy must
// refuse connections while a Service has no ready endpoint, so failures then are not the
// proxy's.
func (c *Cluster) BackendsDisturbed(ctx context.Context, ns string, before map[string]podState, since time.Time) (string, error) {
	after, err := c.BackendPods(ctx, ns)
	if err != nil {
		return "", err
	}
	for name, b := range before {
		a, ok := after[name]
		switch {
		case !ok:
			return fmt.Sprintf("pod %s is gone", name), nil
		case a != b:
			return fmt.Sprintf("pod %s went from %+v to %+v", name, b, a), nil
		}
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		return "", err
	}
	for _, p := range pods.Items {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && !cond.LastTransitionTime.Time.Before(since.Truncate(time.Second)) {
				return fmt.Sprintf("pod %s's readiness changed at %s", p.Name, cond.LastTransitionTime.Format(time.TimeOnly)), nil
			}
		}
	}
	return "", nil
}
