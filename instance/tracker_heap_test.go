package instance

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestTrackerHeapPerService bounds the heap a Tracker keeps per Service of one
// EndpointSlice, besides the objects themselves (the informers' own): it holds every
// Service of the instance. The bound sits between a map of slices per Service (about
// 720 bytes a Service) and a list (about 520).
func TestTrackerHeapPerService(t *testing.T) {
	const n, maxBytes = 2000, 620
	svcs := make([]*corev1.Service, n)
	eps := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		svcs[i] = service(func(s *corev1.Service) { s.Name = fmt.Sprintf("svc-%d", i) })
		eps[i] = v4Slice(fmt.Sprintf("svc-%d-abcde", i), ep("10.0.0.1", thisNodeName))
		eps[i].Labels[discoveryv1.LabelServiceName] = svcs[i].Name
	}
	before := testutil.LiveHeap()
	tr := NewTracker(thisNode())
	for i := range n {
		tr.UpdateService(svcs[i])
		tr.UpdateEndpointSlice(eps[i])
	}
	tr.TakeDirty()
	perService := float64(testutil.LiveHeap()-before) / n
	runtime.KeepAlive(tr)
	t.Logf("tracker: %.0f bytes of heap per Service", perService)
	if perService > maxBytes {
		t.Errorf("the tracker keeps %.0f bytes per Service, want at most %d", perService, maxBytes)
	}
}

// TestWaitersLeaveNoRoomAfterSync: once a sync has answered every waiter, the waiter
// map keeps no room for them (a Go map keeps the buckets of its largest size: every
// Service waits at the first sync, and each later sync walks the map).
func TestWaitersLeaveNoRoomAfterSync(t *testing.T) {
	const n, maxBytes = 1500, 32 << 10
	p, _ := newTestProxy(t, nil)
	for i := range n {
		ip := fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
		p.UpdateService(service(func(s *corev1.Service) {
			s.Name, s.Spec.ClusterIP, s.Spec.ClusterIPs = fmt.Sprintf("svc-%d", i), ip, []string{ip}
		}))
	}
	if _, err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	before := testutil.LiveHeap()
	p.mu.Lock()
	waiting := len(p.waiting)
	p.waiting = map[types.NamespacedName]*waiter{}
	p.mu.Unlock()
	kept := int64(before) - int64(testutil.LiveHeap())
	runtime.KeepAlive(p)
	if waiting != 0 || kept > maxBytes {
		t.Errorf("after the sync: %d waiters, %d bytes of map kept; want none and at most %d", waiting, kept, maxBytes)
	}
}
