package selector

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Reconfigure replaces the instances the Dispatcher routes to, for a live configuration
// change. router and sinks are the new set. changed names the instances whose routing,
// guards or sink the change touches (added, removed, restarted, rerouted); replaced,
// among them, those kept by name whose sink is new (restarted with new settings): they
// are given every Service they serve again, with its EndpointSlices, as a new instance
// is. services are every Service of the watches: each that a changed instance served or
// now serves is routed again, with the usual handover (an instance that no longer serves
// a Service lets go of it once the new owner programmed it), and its address claims are
// weighed again. A Service only unchanged instances serve, before and after, is not
// given to them again: they do not sync for a change that is not theirs.
//
// The sink of an instance the new set leaves out stays until that instance has let go of
// everything (Holds is 0); the caller then drops it with Forget.
func (d *Dispatcher) Reconfigure(router *Router, sinks map[string]Sink, replaced, changed []string, services []*corev1.Service) {
	d.dispatchMu.Lock()
	defer d.dispatchMu.Unlock()
	d.mu.Lock()
	next := maps.Clone(sinks)
	for inst, sink := range d.sinks {
		if _, kept := next[inst]; !kept {
			next[inst] = sink
		}
	}
	d.router, d.sinks = router, next
	d.forgetReplaced(replaced)
	d.mu.Unlock()
	for _, svc := range services {
		if !d.touches(svc, changed) {
			continue
		}
		affected := d.addresses.observe(svc, d.claimable(svc))
		d.serviceChanged(svc)
		d.redispatch(affected)
	}
}

// touches reports whether a change of the changed instances concerns svc: one of them
// served it or serves it now, or its owners change. Called with dispatchMu held.
func (d *Dispatcher) touches(svc *corev1.Service, changed []string) bool {
	dec := d.router.Route(svc)
	now := dec.Owners()
	d.mu.Lock()
	had := d.owners[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}].all
	d.mu.Unlock()
	if len(now) != len(had) || !slices.Equal(slices.Sorted(slices.Values(now)), slices.Sorted(slices.Values(had))) {
		return true
	}
	return slices.ContainsFunc(now, func(inst string) bool { return slices.Contains(changed, inst) })
}

// forgetReplaced makes the Dispatcher treat the replaced instances as new to every
// Service: their old sink is gone with what it was given. Called with mu held.
func (d *Dispatcher) forgetReplaced(replaced []string) {
	if len(replaced) == 0 {
		return
	}
	for name, own := range d.owners {
		if !slices.ContainsFunc(own.all, func(inst string) bool { return slices.Contains(replaced, inst) }) {
			continue
		}
		own.all = slices.DeleteFunc(slices.Clone(own.all), func(inst string) bool { return slices.Contains(replaced, inst) })
		if slices.Contains(replaced, own.owner) {
			own.synced = nil // the new sink has programmed nothing yet
		}
		d.owners[name] = own
		if q := d.joining[name]; q != nil {
			for _, inst := range replaced {
				delete(q, inst)
			}
		}
	}
	for name, st := range d.shadows {
		if slices.Contains(replaced, st.instance) {
			delete(d.shadows, name)
		}
	}
}

// Holds counts the Services an instance serves or has yet to let go of: 0 once an
// instance left out by Reconfigure has handed everything over.
func (d *Dispatcher) Holds(inst string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.releasing[inst]
	for _, own := range d.owners {
		if slices.Contains(own.all, inst) {
			n++
		}
	}
	return n
}

// Forget drops the sink of an instance the routing no longer names, once it holds
// nothing (Holds); it reports whether it did.
func (d *Dispatcher) Forget(inst string) bool {
	d.dispatchMu.Lock()
	defer d.dispatchMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.router.Has(inst) || d.releasing[inst] > 0 {
		return false
	}
	for _, own := range d.owners {
		if slices.Contains(own.all, inst) {
			return false
		}
	}
	next := maps.Clone(d.sinks)
	delete(next, inst)
	d.sinks = next
	delete(d.releasing, inst)
	return true
}
