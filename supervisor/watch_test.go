package supervisor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/shardproxy/shardproxy/selector"
)

// deliveredSink counts what the dispatcher hands an instance.
type deliveredSink struct {
	mu       sync.Mutex
	services map[types.NamespacedName]bool
	slices   map[string]bool
}

func (c *deliveredSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.services[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = true
	done := make(chan struct{})
	close(done)
	return done
}
func (c *deliveredSink) DeleteService(types.NamespacedName) {}
func (c *deliveredSink) UpdateEndpointSlice(sl *discoveryv1.EndpointSlice) {
	time.Sleep(20 * time.Microsecond) // an instance does some work per event
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slices[sl.Namespace+"/"+sl.Name] = true
}
func (c *deliveredSink) DeleteEndpointSlice(*discoveryv1.EndpointSlice) {}

// TestStartWaitsForHandlers: when Start returns, every Service and EndpointSlice of the
// initial lists has reached the instances, not only the informers' caches; otherwise an
// instance's first full sync (at a restart) programs part of the cluster, and Services
// whose slices are still on their way reject traffic until the next sync (seen at
// 10,000 Services: a first sync with 9,767 Services and 43,470 of 100,000 endpoints).
func TestStartWaitsForHandlers(t *testing.T) {
	const n = 3000
	var objs []runtime.Object
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs,
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Port: 80}}}},
			&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-x",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4})
	}
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	client := fake.NewClientset(objs...)
	w, err := NewWatches(client, "node-1", []string{""}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := selector.NewRouter([]selector.Spec{{Name: "default", Default: true}})
	if err != nil {
		t.Fatal(err)
	}
	sink := &deliveredSink{services: map[types.NamespacedName]bool{}, slices: map[string]bool{}}
	d := selector.NewDispatcher(router, map[string]selector.Sink{"default": sink}, w.SlicesOf, selector.Events{})
	if err := w.Connect(d, func(*corev1.Node, bool) {}, func() {}, func() {}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	services, slices := len(sink.services), len(sink.slices)
	sink.mu.Unlock()
	if services != n || slices != n {
		t.Errorf("when Start returned, the instance had %d of %d Services and %d of %d EndpointSlices", services, n, slices, n)
	}
}
