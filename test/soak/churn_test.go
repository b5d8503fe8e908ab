package soak

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestChurnReplays: the same seed makes the same changes, so SOAK_SEED replays a run;
// another seed makes others.
func TestChurnReplays(t *testing.T) {
	run := func(seed uint64) (any, map[string]int) {
		t.Helper()
		client := testutil.NewClientset()
		c := newChurn(client, seed, 20, t.Logf)
		ctx := context.Background()
		for range 20 {
			if err := c.apply(ctx, c.createOp(c.rng.Uint64())); err != nil {
				t.Fatal(err)
			}
		}
		for range 300 {
			if err := c.apply(ctx, c.nextOp()); err != nil {
				t.Fatal(err)
			}
		}
		svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		slices, err := client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Only the fake's bookkeeping (managed fields' times) may differ.
		for i := range svcs.Items {
			svcs.Items[i].ManagedFields = nil
		}
		for i := range slices.Items {
			slices.Items[i].ManagedFields = nil
		}
		return []any{svcs.Items, slices.Items}, c.Applied()
	}
	first, applied := run(7)
	again, _ := run(7)
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("seed 7 twice made different objects (-first +again):\n%s", diff)
	}
	if other, _ := run(8); cmp.Equal(first, other) {
		t.Error("seeds 7 and 8 made the same objects")
	}
	for _, w := range opWeights {
		if applied[w.kind] == 0 {
			t.Errorf("300 changes never made a %q change: %v", w.kind, applied)
		}
	}
}
