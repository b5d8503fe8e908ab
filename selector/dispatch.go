package selector

import (
	"net/netip"
	"slices"
	"strings"
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
	// Guarded: the owner dropped parts of the Service: user addresses outside its
	// tenant ranges or refused by the node-wide address precedence.
	Guarded func(svc *corev1.Service, instance string, problems []string)
}

// Dispatcher routes watch events to the owning instances: the label's owner and, during
// a migration, a shadow (AnnotationShadow). When a Service moves it gives the new owner
// the Service with its current EndpointSlices at once, and tells the old owner to let go
// only after the new owner programmed it (or after HandoverTimeout), so there is no moment
// where neither serves it. Objects no local instance owns cost a map lookup. Safe for
// concurrent use.
type Dispatcher struct {
	// router and sinks are replaced whole by Reconfigure, under dispatchMu and mu, and
	// never written in place: read them holding either lock.
	router *Router
	sinks  map[string]Sink
	slices SliceLister
	events Events
	// HandoverTimeout bounds how long the old owner keeps a Service whose new owner has
	// not programmed it yet.
	HandoverTimeout time.Duration

	// addresses arbitrates the user-set addresses of every Service the node sees.
	addresses *addressBook
	// dispatchMu serializes the handling of Services, so that a Service re-dispatched
	// because another one changed (address precedence) never overtakes a newer version.
	// It guards reported.
	dispatchMu sync.Mutex
	// reported are the refusals last reported per Service, by instance ("" for the
	// label's refusal), so that each is reported (an event, a log line) once, not on
	// every update or re-dispatch of the Service while it lasts.
	reported map[types.NamespacedName]map[string]string

	mu     sync.Mutex
	owners map[types.NamespacedName]ownership
	// joining holds, per Service being handed to instances that did not have it, the
	// EndpointSlice events that arrived while those instances were given the Service's
	// current slices. They are applied after that snapshot, in order: applied before, an
	// older snapshot would overwrite them (a deleted slice would stay programmed).
	joining map[types.NamespacedName]map[string][]sliceEvent
	// shadows are the Services programmed in shadow, for the node status.
	shadows map[types.NamespacedName]*shadowState
	// releasing counts, per instance, the Services it is to let go of once their new
	// owners programmed them (release), for Holds.
	releasing map[string]int
}

// ownership is who programs one Service: the label's owner ("" if not local) and every
// instance that programs it (the owner and the shadow).
type ownership struct {
	owner string
	all   []string
	// synced tracks whether owner has programmed the Service since it became the owner.
	synced *shadowState
}

// shadowState tracks whether one instance has programmed one Service (in shadow, or as
// its owner) since it took it.
type shadowState struct {
	instance   string
	programmed bool
	// needSlices: the shadow was given a Service with a selector but none of its
	// EndpointSlices. On a node that watches only labelled objects they arrive once the
	// EndpointSlice controller has copied the shadow label to them, after the Service:
	// a sync before that programs the Service without endpoints (rejecting), and must
	// not count, or a migration moves the label onto a shadow that rejects (seen on the
	// real node: ~200 ms of refused connections). The first slice re-arms the wait (gen).
	needSlices bool
	gen        int
	// svc is the version last given to the shadow instance, to give again with a slice.
	svc *corev1.Service
	// watched: the first sync that programs it is waited for (through pending). One wait
	// is enough (any later version is programmed by the same sync or a later one), and
	// one per update would pile up while the instance cannot sync.
	watched bool
	// pending is the channel the instance closes when it has programmed the Service,
	// looked at when asked (done), never waited on: a goroutine waiting on it for every
	// Service of a starting node was 10,000 goroutines and their stacks until the first
	// sync, and one per shadow waited forever when the shadow's instance never synced or
	// the shadow went away. While needSlices holds, its closing does not count.
	pending <-chan struct{}
}

// done reports whether the instance has programmed the Service (for a shadow, a sync
// that had its EndpointSlices). Called with the Dispatcher's mu held.
func (st *shadowState) done() bool {
	if !st.programmed && !st.needSlices && st.pending != nil {
		select {
		case <-st.pending:
			st.programmed, st.pending = true, nil
		default:
		}
	}
	return st.programmed
}

// watch tells whether the caller is to start the goroutine that waits for the state's
// first programming. Called with the Dispatcher's mu held.
func (st *shadowState) watch() bool {
	if st.watched {
		return false
	}
	st.watched = true
	return true
}

// NewDispatcher returns a Dispatcher over one sink per instance of the router.
func NewDispatcher(router *Router, sinks map[string]Sink, slices SliceLister, events Events) *Dispatcher {
	return &Dispatcher{
		router: router, sinks: sinks, slices: slices, events: events,
		HandoverTimeout: 30 * time.Second,
		addresses:       newAddressBook(),
		owners:          map[types.NamespacedName]ownership{},
		joining:         map[types.NamespacedName]map[string][]sliceEvent{},
		reported:        map[types.NamespacedName]map[string]string{},
		shadows:         map[types.NamespacedName]*shadowState{},
		releasing:       map[string]int{},
	}
}

// Owner returns the instance that currently owns a Service by its label ("" if none).
func (d *Dispatcher) Owner(name types.NamespacedName) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.owners[name].owner
}

// Shadows returns, per instance, the Services it has programmed in shadow.
func (d *Dispatcher) Shadows() map[string][]types.NamespacedName {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string][]types.NamespacedName{}
	for name, st := range d.shadows {
		if st.done() {
			out[st.instance] = append(out[st.instance], name)
		}
	}
	return out
}

// ServiceChanged handles an added or updated Service, and then the Services whose user
// addresses it wins or gives back.
func (d *Dispatcher) ServiceChanged(svc *corev1.Service) {
	d.dispatchMu.Lock()
	defer d.dispatchMu.Unlock()
	affected := d.addresses.observe(svc, d.claimable(svc))
	d.serviceChanged(svc)
	d.redispatch(affected)
}

// claimable returns the user addresses of svc that count as its claims in the address
// precedence: those an instance serving it here admits by its tenant guards. A Service
// no local instance serves, or an address its instances' ranges do not admit, claims
// nothing; otherwise a tenant could squat another tenant's future external or
// load-balancer IP with an older Service that is never served.
func (d *Dispatcher) claimable(svc *corev1.Service) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, inst := range d.router.Route(svc).Owners() {
		if d.sinks[inst] == nil {
			continue
		}
		guarded, _ := d.router.Guard(inst, svc)
		for a := range userAddresses(guarded) {
			out[a] = true
		}
	}
	return out
}

// SetReserved tells the Dispatcher the addresses no Service's user addresses may take
// (sorted, for change detection); the Services that write user addresses are
// re-dispatched when they change.
func (d *Dispatcher) SetReserved(r Reserved) {
	d.dispatchMu.Lock()
	defer d.dispatchMu.Unlock()
	d.redispatch(d.addresses.setReserved(r))
}

// MarkListed tells the Dispatcher that the initial lists are in: from now on a Service's
// new claim on an address ranks after the claims already there (the holder keeps an
// address until it lets it go), ordered by resourceVersion. Before, claims are ranked
// by SeedHoldings, then by creation time.
func (d *Dispatcher) MarkListed() {
	d.addresses.markListed()
}

// SeedHoldings gives the holders of contested addresses that the nodes already running
// report (their Holdings), to rank the claims present at start as they do.
func (d *Dispatcher) SeedHoldings(hs []Holding) {
	d.dispatchMu.Lock()
	defer d.dispatchMu.Unlock()
	d.redispatch(d.addresses.seed(hs))
}

// Holdings returns the holder of every address, protocol and port that more than one
// local Service claims, sorted, for the node status.
func (d *Dispatcher) Holdings() []Holding {
	return d.addresses.holdings()
}

// redispatch hands Services again to their instances, with their user addresses as the
// address book now rules. Their own records are unchanged, so this goes no deeper.
func (d *Dispatcher) redispatch(svcs []*corev1.Service) {
	for _, svc := range svcs {
		d.serviceChanged(svc)
	}
}

// serviceChanged routes svc to this node's instances, hands it over from the ones
// that no longer serve it once the new ones programmed it, and arms the waits for its
// owner's and shadow's first programming.
func (d *Dispatcher) serviceChanged(svc *corev1.Service) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	dec := d.routeLocal(name, svc)
	want := dec.Owners()
	c := d.claim(name, dec, want)
	added := d.deliver(svc, name, dec, want, c)
	if c.old.owner != dec.Instance && d.events.Handover != nil {
		d.events.Handover(name, c.old.owner, dec.Instance)
	}
	d.letGo(name, c.old.all, want, added)
}

// routeLocal routes svc, leaving out instances this node does not run, and reports a
// rejection.
func (d *Dispatcher) routeLocal(name types.NamespacedName, svc *corev1.Service) Decision {
	dec := d.router.Route(svc)
	if dec.Instance != "" && d.sinks[dec.Instance] == nil {
		dec.Instance = ""
	}
	if dec.Shadow != "" && d.sinks[dec.Shadow] == nil {
		dec.Shadow = ""
	}
	if d.report(name, "", dec.Rejected) && d.events.Rejected != nil {
		d.events.Rejected(svc, dec.Rejected)
	}
	return dec
}

// claimed is what claim recorded for a Service: its ownership before, and the states
// that wait for its owner's and its shadow's first programming (watch*: that this
// update is the one to arm them).
type claimed struct {
	old                     ownership
	ownerSynced, shadow     *shadowState
	watchOwner, watchShadow bool
}

// claim records the Service's new owners (want) and shadow, and queues its
// EndpointSlices for the instances that newly serve it.
func (d *Dispatcher) claim(name types.NamespacedName, dec Decision, want []string) claimed {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := claimed{old: d.owners[name]}
	if len(want) == 0 {
		delete(d.owners, name)
	} else {
		synced := c.old.synced
		if dec.Instance == "" || dec.Instance != c.old.owner || synced == nil {
			synced = &shadowState{instance: dec.Instance}
		}
		d.owners[name] = ownership{owner: dec.Instance, all: want, synced: synced}
	}
	c.ownerSynced = d.owners[name].synced
	c.watchOwner = c.ownerSynced != nil && c.ownerSynced.watch()
	for _, inst := range want {
		if !slices.Contains(c.old.all, inst) {
			d.queueSlices(name, inst)
		}
	}
	if dec.Shadow != "" {
		if c.shadow = d.shadows[name]; c.shadow == nil || c.shadow.instance != dec.Shadow {
			c.shadow = &shadowState{instance: dec.Shadow}
			d.shadows[name] = c.shadow
		}
		c.watchShadow = c.shadow.watch()
	} else {
		delete(d.shadows, name)
	}
	return c
}

// deliver gives svc, guarded for each, to the instances of want, an instance new to it
// its EndpointSlices first, and returns the channels that close once the new ones
// programmed it.
func (d *Dispatcher) deliver(svc *corev1.Service, name types.NamespacedName, dec Decision, want []string, c claimed) []<-chan struct{} {
	var added []<-chan struct{}
	arbitrated, refusals := withoutRefused(svc, d.addresses.refused(svc))
	for _, inst := range want {
		guarded, problems := d.router.Guard(inst, arbitrated)
		problems = append(slices.Clip(refusals), problems...)
		if d.report(name, inst, strings.Join(problems, "; ")) && d.events.Guarded != nil {
			d.events.Guarded(svc, inst, problems)
		}
		sink := d.sinks[inst]
		isNew := !slices.Contains(c.old.all, inst)
		if isNew {
			// The EndpointSlices go first: the instance may sync between any two calls,
			// and the channel UpdateService returns closes at the first sync after it.
			// Given the Service first, that sync could program it without endpoints
			// (rejecting its traffic) and still count as "programmed": a migration would
			// then move the label, or a handover release the old owner, too early.
			for _, sl := range d.slices(svc.Namespace, svc.Name) {
				sink.UpdateEndpointSlice(sl)
			}
			d.joined(name, inst)
		}
		programmed := sink.UpdateService(guarded)
		if isNew {
			added = append(added, programmed)
		}
		if inst == dec.Shadow {
			d.armShadow(svc, c.shadow, guarded, c.watchShadow, programmed)
		}
		if inst == dec.Instance && c.watchOwner {
			d.mu.Lock()
			c.ownerSynced.pending = programmed
			d.mu.Unlock()
		}
	}
	return added
}

// letGo removes the Service from the instances of had that no longer serve it: at once
// when no instance takes it over, else once the new ones programmed it (added).
func (d *Dispatcher) letGo(name types.NamespacedName, had, want []string, added []<-chan struct{}) {
	var removed []string
	for _, inst := range had {
		if !slices.Contains(want, inst) {
			removed = append(removed, inst)
		}
	}
	switch {
	case len(removed) == 0:
	case len(added) == 0:
		// Nobody new takes over (the Service left every local instance, or only its
		// shadow went away): let go at once.
		for _, inst := range removed {
			d.sinks[inst].DeleteService(name)
		}
	default:
		d.mu.Lock()
		for _, inst := range removed {
			d.releasing[inst]++
		}
		d.mu.Unlock()
		go d.release(name, removed, added)
	}
}

// report records what is refused of a Service for one instance ("" for the label's
// refusal) and tells whether it is to be reported: not empty, and not reported last
// time. Called with dispatchMu held.
func (d *Dispatcher) report(name types.NamespacedName, inst, refusal string) bool {
	last := d.reported[name]
	if last[inst] == refusal {
		return false
	}
	if refusal == "" {
		delete(last, inst)
		if len(last) == 0 {
			delete(d.reported, name)
		}
		return false
	}
	if last == nil {
		last = map[string]string{}
		d.reported[name] = last
	}
	last[inst] = refusal
	return true
}

// armShadow records the version given to a shadow and, for its first one, the sync that
// programs it (pending), which counts only once the instance has the Service's
// EndpointSlices (needSlices). needSlices is set before the slices are listed, so a
// slice arriving meanwhile re-arms the wait rather than being missed.
func (d *Dispatcher) armShadow(svc *corev1.Service, st *shadowState, guarded *corev1.Service, first bool, programmed <-chan struct{}) {
	d.mu.Lock()
	st.svc = guarded
	gen := st.gen
	if first {
		st.needSlices = len(svc.Spec.Selector) > 0
		st.pending = programmed
	}
	need := st.needSlices
	d.mu.Unlock()
	if !first {
		return
	}
	if need && len(d.slices(svc.Namespace, svc.Name)) > 0 {
		d.mu.Lock()
		if st.gen == gen {
			st.needSlices = false
		}
		d.mu.Unlock()
	}
}

// sliceReachedShadow re-arms the wait of a shadow that had none of its Service's slices,
// now that one was given to it: programmed is the sync after the slice. Until the
// Service is given again, no sync counts (pending is nil), since an earlier one may
// have programmed it without the slice.
func (d *Dispatcher) sliceReachedShadow(name types.NamespacedName, given []string) {
	d.mu.Lock()
	st := d.shadows[name]
	if st == nil || !st.needSlices || st.svc == nil || !slices.Contains(given, st.instance) {
		d.mu.Unlock()
		return
	}
	st.needSlices = false
	st.pending = nil
	st.gen++
	gen, svc, sink := st.gen, st.svc, d.sinks[st.instance]
	d.mu.Unlock()
	programmed := sink.UpdateService(svc)
	d.mu.Lock()
	if st.gen == gen {
		st.pending = programmed
	}
	d.mu.Unlock()
}

// OwnerProgrammed returns the instance that owns a Service by its label ("" if none
// local) and whether it has programmed the Service since it became the owner: the
// evidence a rollback to another local proxy waits on before the shadow goes.
func (d *Dispatcher) OwnerProgrammed(name types.NamespacedName) (owner string, programmed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	own := d.owners[name]
	return own.owner, own.owner != "" && own.synced != nil && own.synced.done()
}

// release tells the old owners to drop a Service once every new owner has it, unless the
// Service came back to them meanwhile.
func (d *Dispatcher) release(name types.NamespacedName, old []string, added []<-chan struct{}) {
	timer := time.NewTimer(d.HandoverTimeout)
	defer timer.Stop()
wait:
	for _, programmed := range added {
		select {
		case <-programmed:
		case <-timer.C:
			break wait
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, inst := range old {
		d.releasing[inst]--
		if !slices.Contains(d.owners[name].all, inst) {
			d.sinks[inst].DeleteService(name)
		}
	}
}

// ServiceDeleted handles a deleted Service.
func (d *Dispatcher) ServiceDeleted(svc *corev1.Service) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	d.dispatchMu.Lock()
	defer d.dispatchMu.Unlock()
	defer d.redispatch(d.addresses.forget(name))
	delete(d.reported, name)
	d.mu.Lock()
	old := d.owners[name]
	delete(d.owners, name)
	delete(d.shadows, name)
	d.mu.Unlock()
	for _, inst := range old.all {
		d.sinks[inst].DeleteService(name)
	}
}

// SliceChanged handles an added or updated EndpointSlice: it goes to the owners of its
// Service, if any.
func (d *Dispatcher) SliceChanged(slice *discoveryv1.EndpointSlice) {
	d.dispatchSlice(sliceEvent{slice: slice})
}

// SliceDeleted handles a deleted EndpointSlice.
func (d *Dispatcher) SliceDeleted(slice *discoveryv1.EndpointSlice) {
	d.dispatchSlice(sliceEvent{slice: slice, deleted: true})
}

// sliceEvent is one EndpointSlice change, as the watch delivered it.
type sliceEvent struct {
	slice   *discoveryv1.EndpointSlice
	deleted bool
}

func (ev sliceEvent) apply(sink Sink) {
	if ev.deleted {
		sink.DeleteEndpointSlice(ev.slice)
	} else {
		sink.UpdateEndpointSlice(ev.slice)
	}
}

// dispatchSlice gives a slice event to the owners of its Service, or queues it for an
// owner that is being given the Service's slices (joining).
func (d *Dispatcher) dispatchSlice(ev sliceEvent) {
	name, ok := ServiceOf(ev.slice)
	if !ok {
		return
	}
	var now []string
	d.mu.Lock()
	queues, sinks := d.joining[name], d.sinks
	for _, inst := range d.owners[name].all {
		if q, joining := queues[inst]; joining {
			queues[inst] = append(q, ev)
			continue
		}
		now = append(now, inst)
	}
	d.mu.Unlock()
	for _, inst := range now {
		ev.apply(sinks[inst])
	}
	if !ev.deleted {
		d.sliceReachedShadow(name, now)
	}
}

// queueSlices starts holding back the slice events of a Service for an instance that is
// about to be given its current slices. Called with mu held.
func (d *Dispatcher) queueSlices(name types.NamespacedName, inst string) {
	if d.joining[name] == nil {
		d.joining[name] = map[string][]sliceEvent{}
	}
	d.joining[name][inst] = nil
}

// joined applies, once an instance has the Service's slice snapshot, the slice events
// held back meanwhile, and lets later ones through. It holds mu while it applies them so
// that no later event overtakes them (Sink calls do not block).
func (d *Dispatcher) joined(name types.NamespacedName, inst string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range d.joining[name][inst] {
		ev.apply(d.sinks[inst])
	}
	delete(d.joining[name], inst)
	if len(d.joining[name]) == 0 {
		delete(d.joining, name)
	}
}
