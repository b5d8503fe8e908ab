package conntrack

import (
	"context"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	netutils "k8s.io/utils/net"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/tables"
)

// cleanupTimeout bounds one family's cleanup after a sync.
const cleanupTimeout = 30 * time.Second

// Node is what a Sweeper reads of the node beyond the sync it cleans up after: the
// EndpointSlices the watch holds and which Services other local instances serve. The
// supervisor implements it.
type Node interface {
	// EndpointSlicesOf lists a Service's EndpointSlices as the watch holds them now.
	EndpointSlicesOf(name types.NamespacedName) []*discoveryv1.EndpointSlice
	// ServedElsewhere returns, for each of names that a local instance other than inst
	// serves now (by label or as a migration shadow), that instance's programmed model
	// of the Service, nil if it has not programmed it yet. Names no other local instance
	// serves, and all names while owners are not known yet, are left out.
	ServedElsewhere(inst string, names []types.NamespacedName) map[types.NamespacedName]*instance.ServiceModel
}

// Metrics counts the flows a Sweeper deleted and times its cleanups;
// *metrics.Metrics implements it.
type Metrics interface {
	// ConntrackDeleted counts n flows of family ("IPv4" or "IPv6") deleted for instance.
	ConntrackDeleted(instance string, family string, n int)
	// ObserveConntrackReconcile records how long one cleanup of family took.
	ObserveConntrackReconcile(family string, d time.Duration)
	// ConntrackCleanupFailed counts a cleanup of family after a sync of instance that
	// failed.
	ConntrackCleanupFailed(instance, family string)
}

// Sweeper is the conntrack cleanup of a node's instances: after each sync it decides
// which Service ports to compare, before and after, with which endpoints still serving
// besides the rules, and has its Cleaner delete the flows that made stale. There is one
// per node, shared by every instance; it is safe for concurrent use.
//
// Only Services an instance programs ever get here, so flows of foreign Services are
// never touched.
type Sweeper struct {
	cleaner *Cleaner
	node    Node
	metrics Metrics
	logger  klog.Logger
	// kept remembers the serving endpoints cleanups kept outside the rules.
	kept keptFlows
}

// NewSweeper returns a Sweeper deleting through cleaner, reading the node through node
// and counting deletions in m.
func NewSweeper(cleaner *Cleaner, node Node, m Metrics, logger klog.Logger) *Sweeper {
	return &Sweeper{cleaner: cleaner, node: node, metrics: m, logger: logger}
}

// sweepItem is one Service a cleanup compares.
type sweepItem struct {
	before, after       *instance.ServiceModel
	wasServing, serving Serving
}

// Synced removes the stale UDP/SCTP flows (and the unanswered TCP ones, see Cleanup) of
// the Services a successful sync of inst changed; full says it was a full sync.
//
// A Service inst let go of while another local instance serves it (a relabel, a released
// migration shadow) is compared with that instance's programmed model rather than with
// nothing: its endpoints are still served, and so are their flows. If that instance has
// not programmed it yet, its flows are left alone (conntrack keeps them working).
//
// Endpoints still serving outside the endpoint lists keep their flows (see keptFlows).
// A full sync reports only Services whose model changed, so after one every Service with
// kept endpoints is looked at again.
func (s *Sweeper) Synced(inst string, changed []instance.ChangedService, full bool) {
	logger := s.logger.WithValues("instance", inst)
	var letGo []types.NamespacedName
	for _, c := range changed {
		if c.After == nil {
			letGo = append(letGo, c.Name)
		}
	}
	var elsewhere map[types.NamespacedName]*instance.ServiceModel
	if len(letGo) > 0 {
		elsewhere = s.node.ServedElsewhere(inst, letGo)
	}

	var items []sweepItem
	seen := map[types.NamespacedName]bool{}
	for _, c := range changed {
		seen[c.Name] = true
		was := s.kept.take(inst, c.Name)
		after := c.After
		if after == nil {
			if other, ok := elsewhere[c.Name]; ok {
				if other == nil {
					logger.V(4).Info("Service handed to an instance that has not programmed it yet; keeping its flows",
						"service", c.Name)
					continue
				}
				after = other
			}
		}
		var serving Serving
		if after != nil {
			serving = servingEndpoints(s.node.EndpointSlicesOf(c.Name), c.Name)
		}
		s.kept.put(inst, c.Name, c.After, serving)
		items = append(items, sweepItem{before: c.Before, after: after, wasServing: was, serving: serving})
	}
	if full {
		for name, k := range s.kept.all(inst) {
			if seen[name] {
				continue
			}
			s.kept.take(inst, name)
			serving := servingEndpoints(s.node.EndpointSlicesOf(name), name)
			s.kept.put(inst, name, k.model, serving)
			items = append(items, sweepItem{before: k.model, after: k.model, wasServing: k.serving, serving: serving})
		}
	}
	if len(items) == 0 {
		return
	}
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		s.clean(logger, inst, fam, items)
	}
}

// clean has the Cleaner delete the flows of one family that items made stale.
func (s *Sweeper) clean(logger klog.Logger, inst string, fam tables.Family, items []sweepItem) {
	ch := Change{WasServing: Serving{}, Serving: Serving{}}
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
		return
	}
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), cleanupTimeout)
	defer cancel()
	start := time.Now()
	n, err := s.cleaner.CleanupChange(ctx, ch)
	if err != nil {
		logger.Error(err, "Conntrack cleanup failed", "family", fam)
		s.metrics.ConntrackCleanupFailed(inst, fam.String())
	} else {
		// As upstream, a round that failed is not timed: its duration says nothing.
		s.metrics.ObserveConntrackReconcile(fam.String(), time.Since(start))
	}
	if n > 0 {
		s.metrics.ConntrackDeleted(inst, fam.String(), n)
	}
}

// keptFlows remembers, per instance and Service, the serving endpoints the last cleanup
// kept although the programmed model leaves them out (pods that started terminating
// while ready ones remain). Their flows must go once they stop serving, which need not
// change the model, so the next cleanup of the Service is told they were there. Only
// Services with such endpoints have an entry.
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
	serving Serving
}

// take removes and returns the entry of one Service of inst.
func (k *keptFlows) take(inst string, name types.NamespacedName) Serving {
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
func (k *keptFlows) put(inst string, name types.NamespacedName, model *instance.ServiceModel, serving Serving) {
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
// endpoint lists of the model's port it belongs to. It allocates only for the ports of
// serving (UDP and SCTP): a first full sync asks for every Service, most of them TCP
// only, and an index of every port's endpoints was a large share of the memory peak.
func servesOutsideLists(m *instance.ServiceModel, serving Serving) bool {
	for name, eps := range serving {
		if len(eps) == 0 {
			continue
		}
		listed := map[tables.Endpoint]bool{}
		for _, ports := range m.Ports {
			for _, sp := range ports {
				if sp.Name != name {
					continue
				}
				for _, ep := range sp.ClusterEndpoints {
					listed[ep] = true
				}
				for _, ep := range sp.LocalEndpoints {
					listed[ep] = true
				}
			}
		}
		for _, ep := range eps {
			if !listed[ep] {
				return true
			}
		}
	}
	return false
}

// servingEndpoints returns the serving endpoints of a Service's UDP and SCTP ports in
// its EndpointSlices, the way upstream's conntrack cleanup counts them: condition
// serving true or unset, whatever readiness, termination, topology or traffic policy.
// TCP ports are left out: their flows are never cleaned.
//
// tables.ServicePort carries only the endpoints the rules use, so this is read from the
// watch's cache, which may be newer than the model just programmed; that only ever keeps
// a flow the next sync of the Service decides on.
func servingEndpoints(slicesOfService []*discoveryv1.EndpointSlice, name types.NamespacedName) Serving {
	var out Serving
	for _, sl := range slicesOfService {
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
					out = Serving{}
				}
				out[key] = append(out[key], tables.Endpoint{IP: addr.Unmap(), Port: uint16(*p.Port)})
			}
		}
	}
	return out
}
