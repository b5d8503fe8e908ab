package supervisor

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/selector"
)

// changeCounter feeds kube-proxy's change metrics per instance: every Service and
// EndpointSlice change handed to the instance counts in the _total counters, and the
// _pending gauges are, as upstream's, the number of distinct Services with a change not
// yet synced. Pending is cleared by a successful sync; a change that arrives while a sync
// runs may be cleared with it although the next sync programs it.
type changeCounter struct {
	metrics *metrics.Metrics

	mu sync.Mutex
	// services and endpoints map instance → the Services with a pending Service,
	// respectively EndpointSlice, change.
	services  map[string]map[types.NamespacedName]struct{}
	endpoints map[string]map[types.NamespacedName]struct{}
}

func newChangeCounter(m *metrics.Metrics) *changeCounter {
	return &changeCounter{
		metrics:   m,
		services:  map[string]map[types.NamespacedName]struct{}{},
		endpoints: map[string]map[types.NamespacedName]struct{}{},
	}
}

// serviceChanged counts a change of Service name handed to inst.
func (c *changeCounter) serviceChanged(inst string, name types.NamespacedName) {
	c.changed(inst, name, c.services, 1, 0)
}

// endpointsChanged counts a change of an EndpointSlice of Service name handed to inst.
func (c *changeCounter) endpointsChanged(inst string, name types.NamespacedName) {
	c.changed(inst, name, c.endpoints, 0, 1)
}

func (c *changeCounter) changed(inst string, name types.NamespacedName, pending map[string]map[types.NamespacedName]struct{}, services, endpoints int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pending[inst] == nil {
		pending[inst] = map[types.NamespacedName]struct{}{}
	}
	pending[inst][name] = struct{}{}
	c.metrics.AddChanges(inst, services, endpoints)
	c.metrics.SetPendingChanges(inst, len(c.services[inst]), len(c.endpoints[inst]))
}

// synced clears inst's pending changes after a successful sync.
func (c *changeCounter) synced(inst string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.services, inst)
	delete(c.endpoints, inst)
	c.metrics.SetPendingChanges(inst, 0, 0)
}

// countingSink is an instance's selector.Sink that counts what the dispatcher hands it.
// It counts before passing the change on, so a sync that programs the change always
// clears it.
type countingSink struct {
	selector.Sink
	instance string
	counter  *changeCounter
}

func (s *countingSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	s.counter.serviceChanged(s.instance, types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name})
	return s.Sink.UpdateService(svc)
}

func (s *countingSink) DeleteService(name types.NamespacedName) {
	s.counter.serviceChanged(s.instance, name)
	s.Sink.DeleteService(name)
}

func (s *countingSink) UpdateEndpointSlice(slice *discoveryv1.EndpointSlice) {
	name, _ := selector.ServiceOf(slice)
	s.counter.endpointsChanged(s.instance, name)
	s.Sink.UpdateEndpointSlice(slice)
}

func (s *countingSink) DeleteEndpointSlice(slice *discoveryv1.EndpointSlice) {
	name, _ := selector.ServiceOf(slice)
	s.counter.endpointsChanged(s.instance, name)
	s.Sink.DeleteEndpointSlice(slice)
}
