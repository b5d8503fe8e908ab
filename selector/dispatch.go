package selector

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Sink receives the objects one instance owns.
type Sink interface {
	// UpdateService adds or updates a Service. The returned channel is closed once the
	// instance has programmed that version of it (successful sync).
	UpdateService(svc *corev1.Service) <-chan struct{}
	// DeleteService removes a Service and every EndpointSlice of it.
	DeleteService(name types.NamespacedName)
	UpdateEndpointSlice(slice *discoveryv1.EndpointSlice)
	DeleteEndpointSlice(slice *discoveryv1.EndpointSlice)
}

// SliceLister lists the current EndpointSlices of a Service.
type SliceLister func(namespace, service string) []*discoveryv1.EndpointSlice

// Events are the Dispatcher's notifications, for logs, events and metrics. Any may be nil.
type Events struct {
	// Handover: a Service moved from one instance to another ("" is no local instance).
	Handover func(svc types.NamespacedName, from, to string)
	// Rejected: the instance named by the label refused the Service.
	Rejected func(svc *corev1.Service, why string)
	// Guarded: the owner dropped parts of the Service (tenant guard).
	Guarded func(svc *corev1.Service, instance string, problems []string)
}

// Dispatcher routes watch events to the owning instance. When a Service is relabeled it
// gives the new owner the Service with its current EndpointSlices at once, and tells the
// old owner to let go only after the new owner programmed it (or after HandoverTimeout),
// so there is no moment where neither serves it. Objects no local instance owns cost a
// map lookup. Safe for concurrent use.
type Dispatcher struct {
	router *Router
	sinks  map[string]Sink
	slices SliceLister
	events Events
	// HandoverTimeout bounds how long the old owner keeps a Service whose new owner has
	// not programmed it yet.
	HandoverTimeout time.Duration

	mu     sync.Mutex
	owners map[types.NamespacedName]string
}

// NewDispatcher returns a Dispatcher over one sink per instance of the router.
func NewDispatcher(router *Router, sinks map[string]Sink, slices SliceLister, events Events) *Dispatcher {
	return &Dispatcher{
		router: router, sinks: sinks, slices: slices, events: events,
		HandoverTimeout: 30 * time.Second,
		owners:          map[types.NamespacedName]string{},
	}
}

// Owner returns the instance that currently owns a Service ("" if none).
func (d *Dispatcher) Owner(name types.NamespacedName) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owners[name]
}

// ServiceChanged handles an added or updated Service.
func (d *Dispatcher) ServiceChanged(svc *corev1.Service) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	dec := d.router.Route(svc)
	if dec.Instance != "" && d.sinks[dec.Instance] == nil {
		dec.Instance = ""
	}
	if dec.Rejected != "" && d.events.Rejected != nil {
		d.events.Rejected(svc, dec.Rejected)
	}

	d.mu.Lock()
	old := d.owners[name]
	if dec.Instance == "" {
		delete(d.owners, name)
	} else {
		d.owners[name] = dec.Instance
	}
	d.mu.Unlock()

	var programmed <-chan struct{}
	if dec.Instance != "" {
		guarded, problems := d.router.Guard(dec.Instance, svc)
		if len(problems) > 0 && d.events.Guarded != nil {
			d.events.Guarded(svc, dec.Instance, problems)
		}
		sink := d.sinks[dec.Instance]
		programmed = sink.UpdateService(guarded)
		if old != dec.Instance {
			for _, sl := range d.slices(svc.Namespace, svc.Name) {
				sink.UpdateEndpointSlice(sl)
			}
		}
	}
	if old == dec.Instance {
		return
	}
	if d.events.Handover != nil {
		d.events.Handover(name, old, dec.Instance)
	}
	if old == "" {
		return
	}
	if programmed == nil {
		d.sinks[old].DeleteService(name)
		return
	}
	go d.release(name, old, programmed)
}

// release tells the old owner to drop a Service once the new owner has it, unless the
// Service came back to the old owner meanwhile.
func (d *Dispatcher) release(name types.NamespacedName, old string, programmed <-chan struct{}) {
	timer := time.NewTimer(d.HandoverTimeout)
	defer timer.Stop()
	select {
	case <-programmed:
	case <-timer.C:
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.owners[name] == old {
		return
	}
	d.sinks[old].DeleteService(name)
}

// ServiceDeleted handles a deleted Service.
func (d *Dispatcher) ServiceDeleted(svc *corev1.Service) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	d.mu.Lock()
	old := d.owners[name]
	delete(d.owners, name)
	d.mu.Unlock()
	if old != "" {
		d.sinks[old].DeleteService(name)
	}
}

// SliceChanged handles an added or updated EndpointSlice: it goes to the owner of its
// Service, if any.
func (d *Dispatcher) SliceChanged(slice *discoveryv1.EndpointSlice) {
	if owner := d.sliceOwner(slice); owner != "" {
		d.sinks[owner].UpdateEndpointSlice(slice)
	}
}

// SliceDeleted handles a deleted EndpointSlice.
func (d *Dispatcher) SliceDeleted(slice *discoveryv1.EndpointSlice) {
	if owner := d.sliceOwner(slice); owner != "" {
		d.sinks[owner].DeleteEndpointSlice(slice)
	}
}

func (d *Dispatcher) sliceOwner(slice *discoveryv1.EndpointSlice) string {
	svc := slice.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owners[types.NamespacedName{Namespace: slice.Namespace, Name: svc}]
}
