package instance

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

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
