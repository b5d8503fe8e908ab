package instance

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/shardproxy/shardproxy/tables"
)

// versioned sets an object's resource version.
func versioned[T interface{ SetResourceVersion(string) }](obj T, rv string) T {
	obj.SetResourceVersion(rv)
	return obj
}

// named returns the default Service renamed to ns/name.
func named(ns, name string) *corev1.Service {
	return service(func(s *corev1.Service) { s.Namespace, s.Name = ns, name })
}

// labelled returns the slice with its service-name label set to svc (removed if empty).
func labelled(slice *discoveryv1.EndpointSlice, svc string) *discoveryv1.EndpointSlice {
	if svc == "" {
		delete(slice.Labels, discoveryv1.LabelServiceName)
	} else {
		slice.Labels[discoveryv1.LabelServiceName] = svc
	}
	return slice
}

// clusterEndpoints returns the IPv4 cluster endpoints of the first port of a Service's
// current model, nil when it has none.
func clusterEndpoints(tr *Tracker, name types.NamespacedName) []tables.Endpoint {
	m := tr.Model(name)
	if m == nil || len(m.Ports[tables.IPv4]) == 0 {
		return nil
	}
	return m.Ports[tables.IPv4][0].ClusterEndpoints
}

func TestTracker(t *testing.T) {
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	zoneB := NodeInfo{Name: thisNodeName, Labels: map[string]string{corev1.LabelTopologyZone: "zone-b"}}

	// step is one call on the Tracker, the dirty set it must leave, and what the
	// models must look like then.
	type step struct {
		do        func(*Tracker)
		wantDirty []types.NamespacedName
		// wantEndpoints, when set, are the cluster endpoints of each Service's first
		// IPv4 port (nil: no model or none).
		wantEndpoints map[types.NamespacedName][]tables.Endpoint
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{
			name: "new service is dirty and TakeDirty clears the set",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(service()) }, wantDirty: []types.NamespacedName{webName}},
				{do: func(tr *Tracker) {}, wantDirty: nil},
			},
		},
		{
			name: "service update with the same resource version is not dirty",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(versioned(service(), "5")) }, wantDirty: []types.NamespacedName{webName}},
				{do: func(tr *Tracker) { tr.UpdateService(versioned(service(), "5")) }, wantDirty: nil},
				{do: func(tr *Tracker) { tr.UpdateService(versioned(service(), "6")) }, wantDirty: []types.NamespacedName{webName}},
			},
		},
		{
			name: "service update without resource version is always dirty",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(service()) }, wantDirty: []types.NamespacedName{webName}},
				{do: func(tr *Tracker) { tr.UpdateService(service()) }, wantDirty: []types.NamespacedName{webName}},
			},
		},
		{
			name: "deleted service is dirty and has no model",
			steps: []step{
				{
					do: func(tr *Tracker) {
						tr.UpdateService(service())
						tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
					},
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080")},
				},
				{
					do:            func(tr *Tracker) { tr.DeleteService(webName) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: nil},
				},
				{do: func(tr *Tracker) { tr.DeleteService(webName) }, wantDirty: nil},
			},
		},
		{
			name: "deleting an unknown service is not dirty",
			steps: []step{
				{do: func(tr *Tracker) { tr.DeleteService(webName) }, wantDirty: nil},
			},
		},
		{
			name: "slices of a service not seen yet are kept for its arrival",
			steps: []step{
				{
					do:        func(tr *Tracker) { tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b"))) },
					wantDirty: nil,
				},
				{
					do:            func(tr *Tracker) { tr.UpdateService(service()) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080")},
				},
			},
		},
		{
			name: "recreated service keeps its slices",
			steps: []step{
				{do: func(tr *Tracker) {
					tr.UpdateService(service())
					tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
					tr.DeleteService(webName)
				}, wantDirty: []types.NamespacedName{webName}},
				{
					do:            func(tr *Tracker) { tr.UpdateService(service()) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080")},
				},
			},
		},
		{
			name: "slice updates mark their service dirty unless the version is unchanged",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(service()); tr.UpdateService(named("ns", "other")) }, wantDirty: []types.NamespacedName{other, webName}},
				{
					do: func(tr *Tracker) {
						tr.UpdateEndpointSlice(versioned(v4Slice("web-1", ep("10.244.2.2", "node-b")), "7"))
					},
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080"), other: nil},
				},
				{
					do: func(tr *Tracker) {
						tr.UpdateEndpointSlice(versioned(v4Slice("web-1", ep("10.244.2.2", "node-b")), "7"))
					},
					wantDirty: nil,
				},
				{
					do: func(tr *Tracker) {
						tr.UpdateEndpointSlice(versioned(v4Slice("web-1", ep("10.244.2.3", "node-b")), "8"))
					},
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.3:8080")},
				},
			},
		},
		{
			name: "several slices of one service are merged",
			steps: []step{
				{
					do: func(tr *Tracker) {
						tr.UpdateService(service())
						tr.UpdateEndpointSlice(v4Slice("web-2", ep("10.244.2.3", "node-b")))
						tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
					},
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080", "10.244.2.3:8080")},
				},
				{
					do:            func(tr *Tracker) { tr.DeleteEndpointSlice(v4Slice("web-2")) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080")},
				},
			},
		},
		{
			name: "slice delete found by name when the tombstone's label is stale",
			steps: []step{
				{do: func(tr *Tracker) {
					tr.UpdateService(service())
					tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
				}, wantDirty: []types.NamespacedName{webName}},
				{
					do:            func(tr *Tracker) { tr.DeleteEndpointSlice(labelled(v4Slice("web-1"), "")) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: nil},
				},
				{do: func(tr *Tracker) { tr.DeleteEndpointSlice(v4Slice("web-1")) }, wantDirty: nil},
			},
		},
		{
			name: "relabelled slice moves to the other service",
			steps: []step{
				{do: func(tr *Tracker) {
					tr.UpdateService(service())
					tr.UpdateService(named("ns", "other"))
					tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
				}, wantDirty: []types.NamespacedName{other, webName}},
				{
					do: func(tr *Tracker) {
						tr.UpdateEndpointSlice(labelled(v4Slice("web-1", ep("10.244.2.2", "node-b")), "other"))
					},
					wantDirty: []types.NamespacedName{other, webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{
						webName: nil,
						other:   eps("10.244.2.2:8080"),
					},
				},
			},
		},
		{
			name: "slice losing its service label is dropped",
			steps: []step{
				{do: func(tr *Tracker) {
					tr.UpdateService(service())
					tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
				}, wantDirty: []types.NamespacedName{webName}},
				{
					do:            func(tr *Tracker) { tr.UpdateEndpointSlice(labelled(v4Slice("web-1", ep("10.244.2.2", "node-b")), "")) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: nil},
				},
			},
		},
		{
			name: "same names in another namespace are separate",
			steps: []step{
				{
					do: func(tr *Tracker) {
						tr.UpdateService(service())
						tr.UpdateService(named("prod", "web"))
						prodSlice := v4Slice("web-1", ep("10.244.3.2", "node-c"))
						prodSlice.Namespace = "prod"
						tr.UpdateEndpointSlice(prodSlice)
						tr.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.2.2", "node-b")))
						tr.DeleteEndpointSlice(prodSlice)
					},
					wantDirty: []types.NamespacedName{webName, {Namespace: "prod", Name: "web"}},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{
						webName:                          eps("10.244.2.2:8080"),
						{Namespace: "prod", Name: "web"}: nil,
					},
				},
			},
		},
		{
			name: "node zone change marks every service dirty",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(service()); tr.UpdateService(named("ns", "other")) }, wantDirty: []types.NamespacedName{other, webName}},
				{do: func(tr *Tracker) { tr.SetNode(zoneB) }, wantDirty: []types.NamespacedName{other, webName}},
				{do: func(tr *Tracker) { tr.SetNode(zoneB) }, wantDirty: nil},
				{do: func(tr *Tracker) { tr.SetNode(NodeInfo{Name: "node-z", Labels: zoneB.Labels}) }, wantDirty: []types.NamespacedName{other, webName}},
			},
		},
		{
			name: "node labels other than the zone do not matter",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(service()) }, wantDirty: []types.NamespacedName{webName}},
				{do: func(tr *Tracker) {
					node := thisNode()
					node.Labels["kubernetes.io/os"] = "linux"
					tr.SetNode(node)
				}, wantDirty: nil},
			},
		},
		{
			name: "node labels changed in place by the caller are still noticed",
			steps: []step{
				{do: func(tr *Tracker) { tr.UpdateService(service()) }, wantDirty: []types.NamespacedName{webName}},
				{do: func(tr *Tracker) {
					node := thisNode()
					tr.SetNode(node)
					node.Labels[corev1.LabelTopologyZone] = "zone-b"
					tr.SetNode(node)
				}, wantDirty: []types.NamespacedName{webName}},
			},
		},
		{
			name: "topology follows the node's zone",
			steps: []step{
				{
					do: func(tr *Tracker) {
						tr.UpdateService(service(func(s *corev1.Service) {
							s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
						}))
						tr.UpdateEndpointSlice(v4Slice("web-1",
							ep("10.244.2.2", "node-b", forZones(thisZone)),
							ep("10.244.3.2", "node-c", forZones("zone-b"))))
					},
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.2.2:8080")},
				},
				{
					do:            func(tr *Tracker) { tr.SetNode(zoneB) },
					wantDirty:     []types.NamespacedName{webName},
					wantEndpoints: map[types.NamespacedName][]tables.Endpoint{webName: eps("10.244.3.2:8080")},
				},
			},
		},
		{
			name: "nil objects ignored",
			steps: []step{
				{do: func(tr *Tracker) {
					tr.UpdateService(nil)
					tr.UpdateEndpointSlice(nil)
					tr.DeleteEndpointSlice(nil)
				}, wantDirty: nil},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(thisNode())
			for i, s := range tc.steps {
				s.do(tr)
				if diff := cmp.Diff(s.wantDirty, tr.TakeDirty(), modelOptions()); diff != "" {
					t.Errorf("step %d: dirty (-want +got):\n%s", i, diff)
				}
				for name, want := range s.wantEndpoints {
					if diff := cmp.Diff(want, clusterEndpoints(tr, name), modelOptions()); diff != "" {
						t.Errorf("step %d: %s cluster endpoints (-want +got):\n%s", i, name, diff)
					}
				}
			}
		})
	}
}

func TestTrackerServices(t *testing.T) {
	tr := NewTracker(thisNode())
	for _, svc := range []*corev1.Service{named("b", "x"), named("a", "z"), named("a", "y")} {
		tr.UpdateService(svc)
	}
	tr.UpdateEndpointSlice(labelled(v4Slice("orphan-1"), "orphan"))
	tr.DeleteService(types.NamespacedName{Namespace: "a", Name: "z"})
	want := []types.NamespacedName{{Namespace: "a", Name: "y"}, {Namespace: "b", Name: "x"}}
	if diff := cmp.Diff(want, tr.Services()); diff != "" {
		t.Errorf("Services (-want +got):\n%s", diff)
	}
	if m := tr.Model(types.NamespacedName{Namespace: "ns", Name: "orphan"}); m != nil {
		t.Errorf("Model of a Service never seen = %+v, want nil", m)
	}
}

// TestTrackerModelMatchesBuild checks the Tracker hands Build exactly the Service's own
// slices and its node.
func TestTrackerModelMatchesBuild(t *testing.T) {
	svc := service(dualStack)
	own := []*discoveryv1.EndpointSlice{
		v4Slice("web-1", ep("10.244.1.2", thisNodeName)),
		v6Slice("web-2", ep("fd00:10:244:2::2", "node-b")),
	}
	tr := NewTracker(thisNode())
	tr.UpdateService(svc)
	tr.UpdateService(named("ns", "other"))
	for _, s := range own {
		tr.UpdateEndpointSlice(s)
	}
	tr.UpdateEndpointSlice(labelled(v4Slice("other-1", ep("10.244.3.2", "node-c")), "other"))
	if diff := cmp.Diff(Build(svc, own, thisNode()), tr.Model(webName), modelOptions()); diff != "" {
		t.Errorf("Model differs from Build (-build +tracker):\n%s", diff)
	}
}

// triggered sets a slice's endpoints.kubernetes.io/last-change-trigger-time and version.
func triggered(slice *discoveryv1.EndpointSlice, rv string, at time.Time) *discoveryv1.EndpointSlice {
	slice.ResourceVersion = rv
	slice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
	return slice
}

// TestTrackerTriggerTimes checks which slice changes count toward the network
// programming latency, and with what time: changes after the Service was first tracked
// and after the slice's previous version was seen, once each, never later than the
// change was seen (the annotation is whatever the slice's writer put there).
func TestTrackerTriggerTimes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	tests := []struct {
		name string
		// do feeds the Tracker; at sets the clock (the Service was tracked at sec(0)).
		do   func(tr *Tracker, at func(int))
		want []Trigger
	}{{
		name: "an endpoint change after the Service was tracked counts",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(5)}},
	}, {
		name: "a trigger from before the Service was tracked does not (initial list, handover)",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(-5)))
		},
	}, {
		name: "the same version twice counts once",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
			at(7)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(5)}},
	}, {
		name: "a deleted slice with a change newer than the version seen counts with it",
		do: func(tr *Tracker, at func(int)) {
			at(3)
			tr.UpdateEndpointSlice(v4Slice("web-1"))
			at(8)
			tr.DeleteEndpointSlice(triggered(v4Slice("web-1"), "3", sec(7)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(7)}},
	}, {
		name: "a deleted slice's tombstone does not count its last update's trigger again",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
			at(3600)
			tr.DeleteEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(5)}},
	}, {
		name: "an IPv6 slice's change is an IPv6 trigger",
		do: func(tr *Tracker, at func(int)) {
			at(7)
			tr.UpdateEndpointSlice(triggered(v6Slice("web-6"), "2", sec(6)))
		},
		want: []Trigger{{Family: tables.IPv6, At: sec(6)}},
	}, {
		name: "a slice of a Service not tracked does not count",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(labelled(triggered(v4Slice("x-1"), "2", sec(5)), "unknown"))
		},
	}, {
		name: "a malformed or missing annotation does not count",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			s := v4Slice("web-1")
			s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: "yesterday"}
			tr.UpdateEndpointSlice(s)
			tr.UpdateEndpointSlice(v4Slice("web-2"))
		},
	}, {
		name: "a trigger after the change was seen counts as seen",
		do: func(tr *Tracker, at func(int)) {
			at(10)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(11)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(10)}},
	}, {
		name: "a trigger in the far future counts as seen",
		do: func(tr *Tracker, at func(int)) {
			at(10)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(10)}},
	}, {
		name: "a trigger from before the slice's previous version was seen does not count",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
			at(86400) // a day unchanged, then a version whose trigger claims the old time
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "3", sec(6)))
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "4", sec(1)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(5)}},
	}, {
		name: "a trigger between the previous version and this one counts",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "2", sec(5)))
			at(60)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "3", sec(50)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(5)}, {Family: tables.IPv4, At: sec(50)}},
	}, {
		name: "a slice moved to this Service from another is new to it",
		do: func(tr *Tracker, at func(int)) {
			at(6)
			tr.UpdateEndpointSlice(labelled(triggered(v4Slice("web-1"), "2", sec(5)), "other"))
			at(60)
			tr.UpdateEndpointSlice(triggered(v4Slice("web-1"), "3", sec(2)))
		},
		want: []Trigger{{Family: tables.IPv4, At: sec(2)}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			tr := NewTracker(thisNode())
			tr.SetClock(func() time.Time { return now })
			tr.UpdateService(service())
			tc.do(tr, func(n int) { now = sec(n) })
			if diff := cmp.Diff(tc.want, tr.TakeTriggerTimes()); diff != "" {
				t.Errorf("TakeTriggerTimes (-want +got):\n%s", diff)
			}
			if got := tr.TakeTriggerTimes(); len(got) != 0 {
				t.Errorf("second TakeTriggerTimes = %v, want none", got)
			}
		})
	}
}

// TestTrackerRedispatchedAddresses: the same version of a Service again is a resync and
// changes nothing, but the same version with other user-set addresses (the dispatcher
// took one away or gave one back, after another Service changed) must be synced.
func TestTrackerRedispatchedAddresses(t *testing.T) {
	base := named("a", "web")
	base.ResourceVersion = "7"
	base.Spec.ExternalIPs = []string{"192.0.2.5"}
	base.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
	name := types.NamespacedName{Namespace: "a", Name: "web"}
	for _, tc := range []struct {
		name   string
		change func(*corev1.Service)
		dirty  bool
	}{
		{"a resync of the same version", func(*corev1.Service) {}, false},
		{"an externalIP taken away", func(s *corev1.Service) { s.Spec.ExternalIPs = nil }, true},
		{"a load-balancer IP taken away", func(s *corev1.Service) { s.Status.LoadBalancer.Ingress = nil }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(thisNode())
			tr.UpdateService(base)
			tr.TakeDirty()
			again := base.DeepCopy()
			tc.change(again)
			tr.UpdateService(again)
			if got := slices.Contains(tr.TakeDirty(), name); got != tc.dirty {
				t.Errorf("dirty after the same version again: %v, want %v", got, tc.dirty)
			}
		})
	}
}
