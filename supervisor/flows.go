package supervisor

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/tables"
)

// keptFlows remembers, per instance and Service, the serving endpoints the last conntrack
// cleanup kept although the programmed model leaves them out (pods that started
// terminating while ready ones remain). Their flows must go once they stop serving, which
// need not change the model, so the next cleanup of the Service is told they were there.
// Only Services with such endpoints have an entry.
type keptFlows struct {
	mu sync.Mutex
	// byInstance maps instance → Service → what was kept.
	byInstance map[string]map[types.NamespacedName]kept
}

// kept is one Service's entry in keptFlows.
type kept struct {
	// model is the programmed model the entry was taken with.
	model *instance.ServiceModel
	// serving are every serving endpoint of the Service then.
	serving conntrack.Serving
}

// take removes and returns the entry of one Service of inst.
func (k *keptFlows) take(inst string, name types.NamespacedName) conntrack.Serving {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.byInstance[inst][name]
	if !ok {
		return nil
	}
	delete(k.byInstance[inst], name)
	return e.serving
}

// put records serving for one Service of inst programmed as model, if any serving
// endpoint is outside the model's endpoint lists; otherwise nothing needs remembering.
func (k *keptFlows) put(inst string, name types.NamespacedName, model *instance.ServiceModel, serving conntrack.Serving) {
	if model == nil || !servesOutsideLists(model, serving) {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byInstance == nil {
		k.byInstance = map[string]map[types.NamespacedName]kept{}
	}
	if k.byInstance[inst] == nil {
		k.byInstance[inst] = map[types.NamespacedName]kept{}
	}
	k.byInstance[inst][name] = kept{model: model, serving: serving}
}

// all returns a copy of inst's entries.
func (k *keptFlows) all(inst string) map[types.NamespacedName]kept {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[types.NamespacedName]kept, len(k.byInstance[inst]))
	for n, e := range k.byInstance[inst] {
		out[n] = e
	}
	return out
}

// servesOutsideLists reports whether some endpoint of serving is in none of the
// endpoint lists of the model's port it belongs to.
func servesOutsideLists(m *instance.ServiceModel, serving conntrack.Serving) bool {
	listed := map[tables.ServicePortName]map[tables.Endpoint]bool{}
	for _, ports := range m.Ports {
		for _, sp := range ports {
			set := listed[sp.Name]
			if set == nil {
				set = map[tables.Endpoint]bool{}
				listed[sp.Name] = set
			}
			for _, ep := range slices.Concat(sp.ClusterEndpoints, sp.LocalEndpoints) {
				set[ep] = true
			}
		}
	}
	for name, eps := range serving {
		for _, ep := range eps {
			if !listed[name][ep] {
				return true
			}
		}
	}
	return false
}

// servingEndpoints returns the serving endpoints of a Service's UDP and SCTP ports from
// the EndpointSlices the watch holds now, the way upstream's conntrack cleanup counts
// them: condition serving true or unset, whatever readiness, termination, topology or
// traffic policy. TCP ports are left out: their flows are never cleaned.
//
// tables.ServicePort carries only the endpoints the rules use, so this is read from the
// watch's cache, which may be newer than the model just programmed; that only ever keeps
// a flow the next sync of the Service decides on.
func servingEndpoints(slicesOf selector.SliceLister, name types.NamespacedName) conntrack.Serving {
	if slicesOf == nil {
		return nil
	}
	var out conntrack.Serving
	for _, sl := range slicesOf(name.Namespace, name.Name) {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, p := range sl.Ports {
			if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
				continue
			}
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			var tp tables.Protocol
			switch proto {
			case corev1.ProtocolUDP:
				tp = tables.UDP
			case corev1.ProtocolSCTP:
				tp = tables.SCTP
			default:
				continue
			}
			key := tables.ServicePortName{Namespace: name.Namespace, Name: name.Name, Protocol: tp}
			if p.Name != nil {
				key.Port = *p.Name
			}
			for _, e := range sl.Endpoints {
				if len(e.Addresses) == 0 || (e.Conditions.Serving != nil && !*e.Conditions.Serving) {
					continue
				}
				ip := netutils.ParseIPSloppy(e.Addresses[0])
				addr, ok := netip.AddrFromSlice(ip)
				if ip == nil || !ok {
					continue
				}
				if out == nil {
					out = conntrack.Serving{}
				}
				out[key] = append(out[key], tables.Endpoint{IP: addr.Unmap(), Port: uint16(*p.Port)})
			}
		}
	}
	return out
}

// servedElsewhere reports whether another local instance programs the Service now, by
// label or as a migration shadow, and returns that instance's programmed model (nil if
// it has not programmed it yet). applied caches the instances' programmed models for
// one cleanup, since reading them copies the whole set.
func (o *observer) servedElsewhere(inst string, name types.NamespacedName, applied map[string]map[types.NamespacedName]*instance.ServiceModel) (*instance.ServiceModel, bool) {
	owner, known := o.services.serviceOwner(name)
	if !known {
		return nil, false
	}
	var others []string
	if owner != "" && owner != inst {
		others = append(others, owner)
	}
	for shadow, names := range o.services.serviceShadows() {
		if shadow != inst && slices.Contains(names, name) {
			others = append(others, shadow)
		}
	}
	for _, other := range others {
		models, ok := applied[other]
		if !ok {
			models = o.services.appliedBy(other)
			applied[other] = models
		}
		if m := models[name]; m != nil {
			return m, true
		}
	}
	return nil, len(others) > 0
}

// cleanConntrack removes stale UDP/SCTP flows of the changed Services. Only Services an
// instance programs ever get here, so flows of foreign Services are never touched.
//
// A Service inst let go of while another local instance serves it (a relabel, a released
// migration shadow) is compared with that instance's programmed model rather than with
// nothing: its endpoints are still served, and so are their flows. If that instance has
// not programmed it yet, its flows are left alone (conntrack keeps them working).
//
// Endpoints still serving outside the endpoint lists keep their flows (see keptFlows).
// A full sync reports only Services whose model changed, so after one every Service with
// kept endpoints is looked at again.
func (o *observer) cleanConntrack(inst string, changed []instance.ChangedService, full bool) {
	if o.cleaner == nil {
		return
	}
	slicesOf := o.services.endpointSlicesOf
	type item struct {
		before, after       *instance.ServiceModel
		wasServing, serving conntrack.Serving
	}
	var items []item
	seen := map[types.NamespacedName]bool{}
	applied := map[string]map[types.NamespacedName]*instance.ServiceModel{}
	for _, c := range changed {
		seen[c.Name] = true
		was := o.kept.take(inst, c.Name)
		after := c.After
		if after == nil {
			if other, elsewhere := o.servedElsewhere(inst, c.Name, applied); elsewhere {
				if other == nil {
					o.logger.V(4).Info("Service handed to an instance that has not programmed it yet; keeping its flows",
						"instance", inst, "service", c.Name)
					continue
				}
				after = other
			}
		}
		var serving conntrack.Serving
		if after != nil {
			serving = servingEndpoints(slicesOf, c.Name)
		}
		o.kept.put(inst, c.Name, c.After, serving)
		items = append(items, item{before: c.Before, after: after, wasServing: was, serving: serving})
	}
	if full {
		for name, k := range o.kept.all(inst) {
			if seen[name] {
				continue
			}
			o.kept.take(inst, name)
			serving := servingEndpoints(slicesOf, name)
			o.kept.put(inst, name, k.model, serving)
			items = append(items, item{before: k.model, after: k.model, wasServing: k.serving, serving: serving})
		}
	}
	if len(items) == 0 {
		return
	}
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		ch := conntrack.Change{WasServing: conntrack.Serving{}, Serving: conntrack.Serving{}}
		for _, it := range items {
			if it.before != nil {
				ch.Before = append(ch.Before, it.before.Ports[fam]...)
			}
			if it.after != nil {
				ch.After = append(ch.After, it.after.Ports[fam]...)
			}
			for k, v := range it.wasServing {
				ch.WasServing[k] = v
			}
			for k, v := range it.serving {
				ch.Serving[k] = v
			}
		}
		if len(ch.Before) == 0 && len(ch.After) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		n, err := o.cleaner.CleanupChange(ctx, ch)
		cancel()
		if err != nil {
			o.logger.Error(err, "Conntrack cleanup failed", "instance", inst, "family", fam)
		}
		if n > 0 {
			o.metrics.ConntrackDeleted(inst, fam.String(), n)
		}
	}
}
