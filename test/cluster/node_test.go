package cluster

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeUp checks what Start promised: the node Ready with its pod CIDR, the cluster DNS
// pod Ready behind the kube-dns Service with an endpoint from the EndpointSlice controller.
func TestNodeUp(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Spec.PodCIDR == "" {
		t.Errorf("node %s has no pod CIDR", NodeName)
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
