package instance

import (
	"cmp"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/tables"
)

// Tracker holds the current Services and EndpointSlices and remembers which Services'
// models may have changed since the caller last asked. It keeps the objects it is given
// without copying them, as informer caches hand out shared read-only objects; callers
// must not modify an object after passing it in.
//
// A Tracker is not safe for concurrent use: feed it from one goroutine (or guard it).
type Tracker struct {
	node     NodeInfo
	services map[types.NamespacedName]*corev1.Service
	// slices holds EndpointSlices by the Service they belong to, in a list (a Service
	// has one or a few: a map each was 3 MB at 10,000 Services). Slices of a Service not
	// seen yet are kept, so it gets its endpoints on arrival.
	slices map[types.NamespacedName][]*discoveryv1.EndpointSlice
	// sliceOwner maps a slice's namespace/name to the Service it is filed under, so a
	// delete (whose object may be a stale tombstone) or a relabel finds the old entry,
	// and to when its current version was seen (recordTrigger).
	sliceOwner map[types.NamespacedName]sliceEntry
	dirty      map[types.NamespacedName]struct{}

	// now is the clock; since records when each Service was first tracked, and triggers
	// the endpoints.kubernetes.io/last-change-trigger-time of slice changes since the last
	// TakeTriggerTimes, for the network programming latency.
	now      func() time.Time
	since    map[types.NamespacedName]time.Time
	triggers []Trigger

	// build is Build; tests replace it to make model building fail.
	build func(*corev1.Service, []*discoveryv1.EndpointSlice, NodeInfo) *ServiceModel
}

// NewTracker returns an empty Tracker for the given node.
func NewTracker(node NodeInfo) *Tracker {
	t := &Tracker{
		services:   map[types.NamespacedName]*corev1.Service{},
		slices:     map[types.NamespacedName][]*discoveryv1.EndpointSlice{},
		sliceOwner: map[types.NamespacedName]sliceEntry{},
		dirty:      map[types.NamespacedName]struct{}{},
		now:        time.Now,
		since:      map[types.NamespacedName]time.Time{},
		build:      Build,
	}
	t.node = cloneNode(node)
	return t
}

// sliceEntry is where a slice is filed and when this Tracker saw its current version.
type sliceEntry struct {
	owner types.NamespacedName
	seen  time.Time
}

// SetClock replaces the clock used to timestamp when Services are first tracked and when
// slice changes are seen.
func (t *Tracker) SetClock(now func() time.Time) { t.now = now }

// UpdateService adds or updates a Service.
func (t *Tracker) UpdateService(svc *corev1.Service) {
	if svc == nil {
		return
	}
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	prev := t.services[name]
	t.services[name] = svc
	if prev == nil {
		t.since[name] = t.now()
	}
	// The same version again (a resync) changes nothing, unless the dispatcher rewrote
	// the user-set addresses: it hands a Service over again with the same version when
	// another Service wins or gives back one of its addresses.
	if prev != nil && sameVersion(prev.ResourceVersion, svc.ResourceVersion) && sameUserAddresses(prev, svc) {
		return
	}
	t.markDirty(name)
}

// sameUserAddresses reports whether two versions of a Service have the same externalIPs
// and load-balancer ingress.
func sameUserAddresses(a, b *corev1.Service) bool {
	return slices.Equal(a.Spec.ExternalIPs, b.Spec.ExternalIPs) &&
		slices.EqualFunc(a.Status.LoadBalancer.Ingress, b.Status.LoadBalancer.Ingress, func(x, y corev1.LoadBalancerIngress) bool {
			return x.IP == y.IP && x.Hostname == y.Hostname && ptrEqual(x.IPMode, y.IPMode)
		})
}

func ptrEqual[T comparable](a, b *T) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

// DeleteService forgets a Service. Its EndpointSlices are kept: they are deleted on
// their own, and a Service recreated under the same name would use them.
func (t *Tracker) DeleteService(name types.NamespacedName) {
	if _, ok := t.services[name]; !ok {
		return
	}
	t.markDirty(name)
	delete(t.services, name)
	delete(t.since, name)
}

// ForgetService forgets a Service and every EndpointSlice filed under it: the caller will
// not hear of those slices again (the Service moved to another instance, or is gone and
// its slices' events go nowhere), so keeping them would bring back endpoints that no
// longer exist if the Service returned.
func (t *Tracker) ForgetService(name types.NamespacedName) {
	t.DeleteService(name)
	for _, slice := range t.slices[name] {
		delete(t.sliceOwner, types.NamespacedName{Namespace: name.Namespace, Name: slice.Name})
	}
	delete(t.slices, name)
}

// UpdateEndpointSlice adds or updates an EndpointSlice. Slices are grouped by their
// kubernetes.io/service-name label; a slice without it belongs to no Service.
func (t *Tracker) UpdateEndpointSlice(slice *discoveryv1.EndpointSlice) {
	if slice == nil {
		return
	}
	key := types.NamespacedName{Namespace: slice.Namespace, Name: slice.Name}
	owner, labelled := selector.ServiceOf(slice)
	if old, ok := t.sliceOwner[key]; ok && (!labelled || old.owner != owner) {
		t.removeSlice(key)
	}
	if !labelled {
		return
	}
	var prev *discoveryv1.EndpointSlice
	list := t.slices[owner]
	if i := sliceIndex(list, slice.Name); i >= 0 {
		prev, list[i] = list[i], slice
	} else {
		t.slices[owner] = append(list, slice)
	}
	if prev != nil && sameVersion(prev.ResourceVersion, slice.ResourceVersion) {
		return // filed already, and seen when it was new
	}
	last := t.sliceOwner[key].seen // zero for a slice new to this Service
	now := t.now()
	t.sliceOwner[key] = sliceEntry{owner: owner, seen: now}
	t.recordTrigger(owner, slice, last, now)
	t.markDirty(owner)
}

// DeleteEndpointSlice forgets an EndpointSlice. Only its namespace and name are used,
// so the last known state of a deleted object (a tombstone) is enough.
func (t *Tracker) DeleteEndpointSlice(slice *discoveryv1.EndpointSlice) {
	if slice == nil {
		return
	}
	key := types.NamespacedName{Namespace: slice.Namespace, Name: slice.Name}
	if e, ok := t.sliceOwner[key]; ok {
		t.recordTrigger(e.owner, slice, e.seen, t.now())
	}
	t.removeSlice(key)
}

// recordTrigger keeps a slice event's last-change-trigger-time for the network
// programming latency. Like upstream, only changes this Tracker could have seen count: a
// time from before the Service was first tracked (the initial list, a Service handed over
// from another instance, a new Service's first slice) would measure how long we were not
// watching, not how long programming took.
//
// Whoever may write EndpointSlices writes the annotation, a tenant's own controller too,
// so the time is held to what the event itself shows, on this Tracker's clock:
//   - not after seen, when the change reached us: a change cannot have been triggered
//     after we saw it, and a time in the future (or a skewed clock) would make the
//     latency negative. Such a time counts as seen: the latency is then our own part.
//   - after last, when we saw the slice's previous version (or since, for a slice new to
//     the Service): the EndpointSlice controller writes the first change its previous
//     version did not hold, so an older time is not this version's trigger but a stale
//     or forged one (a delete's tombstone carries the last update's, already counted),
//     and counting it would add all the time the slice sat unchanged. It is left out, as
//     a time before since is. (An honest change made between the controller's write of
//     the previous version and our seeing it is left out too: that gap is the watch
//     delay, milliseconds.)
//
// What a writer can still claim is any time between the previous version and this one:
// at most the time its slice sat unchanged, never a negative latency or the time before.
func (t *Tracker) recordTrigger(owner types.NamespacedName, slice *discoveryv1.EndpointSlice, last, seen time.Time) {
	since, ok := t.since[owner]
	if !ok {
		return
	}
	v := slice.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if v == "" {
		return
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !at.After(since) || !at.After(last) {
		return
	}
	if at.After(seen) {
		at = seen
	}
	// Each family's endpoints come from the slices of its address type, so a change is
	// programmed in that family's tables only (as upstream's per-family proxiers see it).
	fam := tables.IPv4
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4:
	case discoveryv1.AddressTypeIPv6:
		fam = tables.IPv6
	default:
		return
	}
	t.triggers = append(t.triggers, Trigger{Family: fam, At: at})
}

// Trigger is an endpoint change's endpoints.kubernetes.io/last-change-trigger-time and
// the IP family of its EndpointSlice.
type Trigger struct {
	Family tables.Family
	At     time.Time
}

// TakeTriggerTimes returns the triggers of the slice changes recorded since the last
// call and forgets them.
func (t *Tracker) TakeTriggerTimes() []Trigger {
	out := t.triggers
	t.triggers = nil
	return out
}

// removeSlice drops a slice from the Service it is filed under.
func (t *Tracker) removeSlice(key types.NamespacedName) {
	e, ok := t.sliceOwner[key]
	if !ok {
		return
	}
	owner := e.owner
	delete(t.sliceOwner, key)
	list := t.slices[owner]
	if i := sliceIndex(list, key.Name); i >= 0 {
		list = slices.Delete(list, i, i+1) // Snapshots hold copies
	}
	if len(list) == 0 {
		delete(t.slices, owner)
	} else {
		t.slices[owner] = list
	}
	t.markDirty(owner)
}

// sliceIndex is the index of the slice named name in list, -1 if none.
func sliceIndex(list []*discoveryv1.EndpointSlice, name string) int {
	return slices.IndexFunc(list, func(s *discoveryv1.EndpointSlice) bool { return s.Name == name })
}

// SetNode updates what the Tracker knows about this node. Every Service is marked dirty
// when something Build reads changes: the node name (local endpoints, node hints) or
// the zone label (zone hints); other labels do not matter.
func (t *Tracker) SetNode(node NodeInfo) {
	changed := node.Name != t.node.Name || node.zone() != t.node.zone()
	t.node = cloneNode(node)
	if !changed {
		return
	}
	for name := range t.services {
		t.markDirty(name)
	}
}

// TakeDirty returns the names of Services whose model may have changed since the last
// call, sorted, and clears the set. A name may belong to a Service that was deleted
// since: its Model is nil.
func (t *Tracker) TakeDirty() []types.NamespacedName {
	out := slices.SortedFunc(maps.Keys(t.dirty), compareNames)
	// A new map, not clear(): a map keeps the buckets of its largest size (the first sync
	// marks every Service dirty), and walking them made every later sync O(cluster).
	t.dirty = map[types.NamespacedName]struct{}{}
	return out
}

// Model builds the current model of one Service (nil if it has none or is unknown).
func (t *Tracker) Model(name types.NamespacedName) *ServiceModel {
	return t.Snapshot([]types.NamespacedName{name}).Model(name)
}

// Snapshot copies what building the models of the named Services reads, so they can be
// built while the Tracker goes on taking events (and whatever lock guards it is free).
// It copies references, not objects: the Tracker's objects are read-only. Unknown names
// are left out (their Model is nil).
func (t *Tracker) Snapshot(names []types.NamespacedName) *Snapshot {
	s := &Snapshot{node: t.node, build: t.build, inputs: make(map[types.NamespacedName]inputs, len(names))}
	for _, name := range names {
		if svc := t.services[name]; svc != nil {
			// Build orders slices by name itself; the map order does not leak.
			s.inputs[name] = inputs{svc: svc, slices: slices.Clone(t.slices[name])}
		}
	}
	return s
}

// SnapshotAll is Snapshot of every tracked Service.
func (t *Tracker) SnapshotAll() *Snapshot {
	return t.Snapshot(t.Services())
}

// Snapshot is what building some Services' models reads, taken from a Tracker at one
// moment. It is not changed after it is taken: safe to read from several goroutines.
type Snapshot struct {
	node   NodeInfo
	build  func(*corev1.Service, []*discoveryv1.EndpointSlice, NodeInfo) *ServiceModel
	inputs map[types.NamespacedName]inputs
}

// inputs are one Service and its EndpointSlices.
type inputs struct {
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
}

// Model builds the model of one Service of the snapshot (nil if it has none or is not in
// the snapshot).
func (s *Snapshot) Model(name types.NamespacedName) *ServiceModel {
	in, ok := s.inputs[name]
	if !ok {
		return nil
	}
	return s.build(in.svc, in.slices, s.node)
}

// Services lists the Services in the snapshot, sorted.
func (s *Snapshot) Services() []types.NamespacedName {
	return slices.SortedFunc(maps.Keys(s.inputs), compareNames)
}

// Services lists every tracked Service name, sorted.
func (t *Tracker) Services() []types.NamespacedName {
	return slices.SortedFunc(maps.Keys(t.services), compareNames)
}

// markDirty records that a Service's model may have changed. Slices of a Service the
// Tracker has not seen do not count: its model is nil before and after.
func (t *Tracker) markDirty(name types.NamespacedName) {
	if _, ok := t.services[name]; ok {
		t.dirty[name] = struct{}{}
	}
}

// sameVersion reports whether two resource versions are known to name the same object
// state; an empty version (objects not from the apiserver) is never the same.
func sameVersion(a, b string) bool {
	return a != "" && a == b
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// cloneNode copies the labels so a caller reusing its map cannot change them behind
// SetNode's change detection.
func cloneNode(node NodeInfo) NodeInfo {
	node.Labels = maps.Clone(node.Labels)
	return node
}
