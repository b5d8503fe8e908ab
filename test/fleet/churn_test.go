package fleet

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestChurn checks the churn step's mechanics on a fake clientset: one Node change per
// interval, a join (a Ready Node with its own InternalIP) beside the one there, then the
// leave of the older, each giving a set of Nodes not seen before; the count returned
// matching the changes made, the Nodes there at the end named for the caller to delete;
// no interval, no change.
func TestChurn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		window   time.Duration
		min, max int
	}{
		{name: "one change per interval, a join beside the last, then the older leaves", interval: 20 * time.Millisecond, window: 400 * time.Millisecond, min: 3, max: 21},
		{name: "no interval makes no change", interval: 0, window: 100 * time.Millisecond, max: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			client := testutil.NewClientset()
			w, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			window, stop := context.WithTimeout(ctx, tc.window)
			changes, joined, err := churn(ctx, window, client, tc.interval)
			stop()
			if err != nil {
				t.Fatal(err)
			}
			if changes < tc.min || changes > tc.max {
				t.Fatalf("%d changes in %v at one per %v, want %d to %d", changes, tc.window, tc.interval, tc.min, tc.max)
			}
			var events []watch.Event
			for len(events) < changes {
				select {
				case ev := <-w.ResultChan():
					events = append(events, ev)
				case <-ctx.Done():
					t.Fatalf("%d Node events for %d changes", len(events), changes)
				}
			}
			// The Nodes there, oldest first: a join while fewer than two, else the
			// older leaves; every set of addresses is new.
			var there []string
			addrs, sets := map[string]bool{}, map[string]bool{}
			for i, ev := range events {
				node := ev.Object.(*corev1.Node)
				switch {
				case len(there) < 2 && ev.Type == watch.Added:
					there = append(there, node.Name)
					if len(node.Status.Addresses) == 0 || node.Status.Addresses[0].Type != corev1.NodeInternalIP || addrs[node.Status.Addresses[0].Address] {
						t.Errorf("Node %s joined with addresses %v, want an InternalIP of its own", node.Name, node.Status.Addresses)
					} else {
						addrs[node.Status.Addresses[0].Address] = true
					}
					if len(node.Status.Conditions) == 0 || node.Status.Conditions[0].Type != corev1.NodeReady {
						t.Errorf("Node %s joined not Ready: %v", node.Name, node.Status.Conditions)
					}
				case len(there) == 2 && ev.Type == watch.Deleted && node.Name == there[0]:
					there = there[1:]
				default:
					t.Fatalf("change %d: %s %s with %v there", i, ev.Type, node.Name, there)
				}
				set := fmt.Sprint(there)
				if sets[set] {
					t.Errorf("change %d: the Nodes %v were there before", i, there)
				}
				sets[set] = true
			}
			if !slices.Equal(joined, there) {
				t.Fatalf("after %d changes: churn left %v, the events %v", changes, joined, there)
			}
			if err := deleteChurnNodes(ctx, client, joined); err != nil {
				t.Fatal(err)
			}
			if left, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil || len(left.Items) != 0 {
				t.Errorf("after deleteChurnNodes: %d Nodes, %v", len(left.Items), err)
			}
		})
	}
}
