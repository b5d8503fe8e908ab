package supervisor

import (
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/instance"
)

// observer does the node-wide work after each instance sync: health, metrics,
// health-check node ports, conntrack cleanup and events.
type observer struct {
	s *Supervisor
}

var _ instance.Observer = &observer{}

func (o *observer) Queued(inst string) {
	o.s.health.QueuedUpdate(inst)
	o.s.metrics.SetLastQueued(inst, time.Now())
}

func (o *observer) SyncFailed(inst string, err error) {
	o.s.health.SetInstanceError(inst, err)
	o.s.metrics.SyncFailed(inst)
}

func (o *observer) Synced(res *instance.SyncResult) {
	s := o.s
	inst := res.Instance
	s.health.Updated(inst)
	s.health.SetInstanceError(inst, nil)
	s.health.SetInstanceCounts(inst, res.Services, res.Endpoints)
	s.changes.synced(inst)
	ops := 0
	for _, st := range res.Stats {
		ops += st.Operations
	}
	s.metrics.ObserveSync(inst, res.Full, res.Elapsed, ops)
	s.metrics.SetLastSync(inst, time.Now())
	for _, d := range res.ProgrammingLatencies {
		s.metrics.ObserveNetworkProgramming(inst, d)
	}
	s.metrics.SetOwned(inst, res.Services, res.Endpoints)
	s.metrics.SetNoLocalEndpoints(inst, res.NoLocalInternal, res.NoLocalExternal)
	s.svcHC.SyncServices(inst, o.ownedHealthChecks(inst, res.HealthCheckNodePorts))
	s.svcHC.SyncEndpoints(inst, res.LocalEndpoints)
	o.cleanConntrack(inst, res.Changed, res.Full)
	if res.Full {
		s.fullSyncs.fullSynced(inst)
	}
	for _, c := range res.Changed {
		if c.After == nil || len(c.After.Problems) == 0 {
			continue
		}
		if c.Before != nil && slices.Equal(c.Before.Problems, c.After.Problems) {
			continue
		}
		s.deps.Recorder.Eventf(c.Name, corev1.EventTypeWarning, "InvalidServiceParts",
			"instance %s skipped parts of the Service: %s", inst, strings.Join(c.After.Problems, "; "))
	}
}

// ownedHealthChecks keeps the health-check node ports of the Services inst owns by
// label: a Service it only shadows during a migration keeps its health check where it is
// (on the legacy proxy or the owning instance) until the label moves.
func (o *observer) ownedHealthChecks(inst string, ports map[types.NamespacedName]int32) map[types.NamespacedName]int32 {
	d := o.s.dispatcher
	if d == nil {
		return ports
	}
	var out map[types.NamespacedName]int32
	for name := range ports {
		if d.Owner(name) != inst {
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
