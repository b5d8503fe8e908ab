package supervisor

import (
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/tables"
)

// observer does the node-wide work after each instance sync: health, metrics,
// health-check node ports, conntrack cleanup and events. It is given what it writes to,
// and reads the rest of the node through localServices; it never reads the Supervisor.
type observer struct {
	health    *healthcheck.ProxyHealth
	metrics   *metrics.Metrics
	svcHC     *healthcheck.ServiceHealth
	changes   *changeCounter
	fullSyncs *firstFullSyncs
	recorder  Recorder
	logger    klog.Logger
	// conntrack cleans up conntrack flows after syncs; shared by every instance's
	// observer. Nil: conntrack cleanup is disabled.
	conntrack *conntrack.Sweeper
	services  localServices
	// fullSync is Deps.FullSync (may be nil): the conntrack cleanup after a full sync is
	// part of its peak (it compares every Service's ports).
	fullSync func() (done func())
}

var _ instance.Observer = &observer{}

// localServices is what the observer and conntrack cleanup (through conntrackNode) read
// of the rest of the node: who serves a Service now, what the other instances have
// programmed, and the EndpointSlices the watch holds. The Supervisor implements it.
type localServices interface {
	// serviceOwner is the instance that serves name by label ("": none); known is false
	// before the dispatcher runs, when nothing is known about owners.
	serviceOwner(name types.NamespacedName) (owner string, known bool)
	// serviceShadows lists, per instance, the Services it programs as migration shadows.
	serviceShadows() map[string][]types.NamespacedName
	// appliedModel is what inst has programmed for name (nil: nothing, or no such
	// instance).
	appliedModel(inst string, name types.NamespacedName) *instance.ServiceModel
	// endpointSlicesOf lists a Service's EndpointSlices as the watch holds them now.
	endpointSlicesOf(namespace, service string) []*discoveryv1.EndpointSlice
}

// newObserver returns the observer of s's instances.
func (s *Supervisor) newObserver() *observer {
	return &observer{
		health: s.health, metrics: s.metrics, svcHC: s.svcHC, changes: s.changes,
		fullSyncs: s.fullSyncs, recorder: s.deps.Recorder, logger: s.logger,
		conntrack: s.conntrack, services: s, fullSync: s.deps.FullSync,
	}
}

func (s *Supervisor) serviceOwner(name types.NamespacedName) (string, bool) {
	if s.dispatcher == nil {
		return "", false
	}
	return s.dispatcher.Owner(name), true
}

func (s *Supervisor) serviceShadows() map[string][]types.NamespacedName {
	if s.dispatcher == nil {
		return nil
	}
	return s.dispatcher.Shadows()
}

func (s *Supervisor) appliedModel(inst string, name types.NamespacedName) *instance.ServiceModel {
	if p := s.Instance(inst); p != nil {
		return p.AppliedModel(name)
	}
	return nil
}

func (s *Supervisor) endpointSlicesOf(namespace, service string) []*discoveryv1.EndpointSlice {
	if s.slicesOf == nil {
		return nil
	}
	return s.slicesOf(namespace, service)
}

// instanceFamilies are the IP families every instance programs: the supervisor leaves
// instance.Options.Families at its default, both.
func instanceFamilies() []tables.Family { return []tables.Family{tables.IPv4, tables.IPv6} }

// Queued: an instance queues a change for all its families at once.
func (o *observer) Queued(inst string) {
	o.health.QueuedUpdate(inst)
	now := time.Now()
	for _, fam := range instanceFamilies() {
		o.metrics.SetLastQueued(inst, fam.String(), now)
	}
}

// SyncFailed counts the failure in every family: a sync programs the families side by
// side and fails, and is retried, as a whole.
func (o *observer) SyncFailed(inst string, err error) {
	o.health.SetInstanceError(inst, err)
	o.health.SyncFinished(inst)
	for _, fam := range instanceFamilies() {
		o.metrics.SyncFailed(inst, fam.String())
	}
}

func (o *observer) Synced(res *instance.SyncResult) {
	if res.Full && o.fullSync != nil {
		defer o.fullSync()()
	}
	inst := res.Instance
	o.health.Updated(inst, ipFamilies(res.Stats)...)
	o.health.SetInstanceError(inst, nil)
	o.health.SetInstanceCounts(inst, res.Services, res.Endpoints)
	o.changes.synced(inst)
	o.observeFamilies(res)
	o.metrics.SetOwned(inst, res.Services, res.Endpoints)
	o.svcHC.SyncServices(inst, o.healthChecks(inst, res.HealthCheckNodePorts))
	o.svcHC.SyncEndpoints(inst, localEndpoints(res.LocalEndpoints))
	if o.conntrack != nil {
		o.conntrack.Synced(inst, res.Changed, res.Full)
	}
	if res.Full {
		o.fullSyncs.fullSynced(inst)
	}
	for _, c := range res.Changed {
		if c.After != nil && c.After.Refused != "" {
			// Once when the Service becomes refused, not on each change while it is.
			if c.Before == nil || c.Before.Refused == "" {
				o.recorder.Eventf(c.Name, corev1.EventTypeWarning, "ServiceTooLarge",
					"instance %s refused the Service: %s", inst, c.After.Refused)
			}
			continue
		}
		if c.After == nil || len(c.After.Problems) == 0 {
			continue
		}
		if c.Before != nil && slices.Equal(c.Before.Problems, c.After.Problems) {
			continue
		}
		o.recorder.Eventf(c.Name, corev1.EventTypeWarning, "InvalidServiceParts",
			"instance %s skipped parts of the Service: %s", inst, strings.Join(c.After.Problems, "; "))
	}
}

// observeFamilies records a sync's kube-proxy series per IP family, as upstream's
// per-family proxiers do. The families are synced side by side after the model is built
// once for both, so a family's duration is the sync's common part (its wall time less
// the longest family's own) plus that family's own time.
func (o *observer) observeFamilies(res *instance.SyncResult) {
	inst := res.Instance
	ops := 0
	var longest time.Duration
	for _, st := range res.Stats {
		ops += st.Operations
		longest = max(longest, st.Elapsed)
	}
	o.metrics.ObserveSyncOperations(inst, res.Full, ops)
	common := max(res.Elapsed-longest, 0)
	now := time.Now()
	for fam, st := range res.Stats {
		family := fam.String()
		o.metrics.ObserveSync(inst, family, res.Full, common+st.Elapsed)
		o.metrics.SetLastSync(inst, family, now)
		for _, d := range res.ProgrammingLatencies[fam] {
			o.metrics.ObserveNetworkProgramming(inst, family, d)
		}
		o.metrics.SetNoLocalEndpoints(inst, family, res.NoLocalInternal[fam], res.NoLocalExternal[fam])
	}
}

// ipFamilies lists the IP families a sync programmed (the keys of its Stats), as the
// API spells them (kube-proxy's health status keys), in order.
func ipFamilies(stats map[tables.Family]tables.Stats) []corev1.IPFamily {
	fams := make([]corev1.IPFamily, 0, len(stats))
	for _, fam := range slices.Sorted(maps.Keys(stats)) {
		fams = append(fams, corev1.IPFamily(fam.String()))
	}
	return fams
}

// localEndpoints converts an instance's local endpoint counts for the health checks.
func localEndpoints(in map[types.NamespacedName]instance.LocalEndpoints) map[types.NamespacedName]healthcheck.LocalEndpoints {
	out := make(map[types.NamespacedName]healthcheck.LocalEndpoints, len(in))
	for name, n := range in {
		out[name] = healthcheck.LocalEndpoints{IPv4: n.IPv4, IPv6: n.IPv6}
	}
	return out
}

// healthChecks are the health checks inst serves: those of the Services it owns, each in
// the IP families the Service has (upstream's per-family proxiers serve each family's).
func (o *observer) healthChecks(inst string, ports map[types.NamespacedName]int32) map[types.NamespacedName]healthcheck.HealthCheck {
	owned := o.ownedHealthChecks(inst, ports)
	if len(owned) == 0 {
		return nil
	}
	out := make(map[types.NamespacedName]healthcheck.HealthCheck, len(owned))
	for name, port := range owned {
		hc := healthcheck.HealthCheck{Port: port, IPv4: true, IPv6: true}
		if m := o.services.appliedModel(inst, name); m != nil {
			_, hc.IPv4 = m.Ports[tables.IPv4]
			_, hc.IPv6 = m.Ports[tables.IPv6]
		}
		out[name] = hc
	}
	return out
}

// ownedHealthChecks keeps the health-check node ports of the Services inst owns by
// label: a Service it only shadows during a migration keeps its health check where it is
// (on the legacy proxy or the owning instance) until the label moves.
func (o *observer) ownedHealthChecks(inst string, ports map[types.NamespacedName]int32) map[types.NamespacedName]int32 {
	var out map[types.NamespacedName]int32
	for name := range ports {
		if owner, known := o.services.serviceOwner(name); !known {
			return ports
		} else if owner != inst {
			if out == nil {
				out = maps.Clone(ports)
			}
			delete(out, name)
		}
	}
	if out == nil {
		return ports
	}
	return out
}
