package supervisor

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestWatchesWaitEndsEverything: once Start's context ends, Wait returns only after
// every goroutine the watches started has ended, the mergers' reads of leaving objects
// among them (they were started untracked: a read in flight could deliver after the
// supervisor had stopped). synctest fails the test if any goroutine of the bubble is
// still there when it ends.
func TestWatchesWaitEndsEverything(t *testing.T) {
	teams := []config.Instance{{Name: "a", ProxyNames: []string{"team-a"}}, {Name: "b", ProxyNames: []string{"team-b"}}}
	for _, tc := range []struct {
		name      string
		instances []config.Instance
	}{
		{"one watch per resource", append([]config.Instance{{Name: "d", Default: true}}, teams...)},
		{"merged watches with their readers", teams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
				w, err := NewWatches(client, "node-1", watchScope(tc.instances, true), WatchOptions{ServiceCIDRs: true})
				if err != nil {
					t.Fatal(err)
				}
				router, err := selector.NewRouter([]selector.Spec{{Name: "default", Default: true}})
				if err != nil {
					t.Fatal(err)
				}
				d := selector.NewDispatcher(router, map[string]selector.Sink{}, w.SlicesOf, selector.Events{})
				if err := w.Connect(d, func(*corev1.Node, bool) {}, func() {}, func() {}, func() {}); err != nil {
					t.Fatal(err)
				}
				if len(tc.instances) == 2 && w.serviceMerger == nil {
					t.Fatal("no merger: the case does not test the readers")
				}
				ctx, cancel := context.WithCancel(t.Context())
				if err := w.Start(ctx, time.Minute); err != nil {
					t.Fatal(err)
				}
				cancel()
				w.Wait()
			})
		})
	}
}
