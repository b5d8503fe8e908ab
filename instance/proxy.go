package instance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// Clock is the time seam of the sync loop.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Options configure one proxy instance.
type Options struct {
	// Name is the instance's name (also in its table names).
	Name string
	// Logger receives the instance's log lines (with its name); default klog's.
	Logger logr.Logger
	// Tables is the table configuration; Family is set per family by the instance.
	Tables tables.Config
	// Families are the IP families to program (both, normally).
	Families []tables.Family
	// NFT opens the knftables interface of one family's table.
	NFT func(fam tables.Family, table string) (knftables.Interface, error)
	// ElementsPerCommand is how many set elements one nft command carries:
	// tables.MaxElementsPerCommand for the nft binary; 0 or 1, one each, as knftables'
	// Fake needs.
	ElementsPerCommand int
	// Direct, if set, opens the applier for the partial syncs that need no rule text
	// (tables.NetlinkWriter on a real node); nil sends everything through NFT.
	Direct func(cfg tables.Config) (tables.Applier, error)
	// MinSyncPeriod is the shortest time between two syncs.
	MinSyncPeriod time.Duration
	// SyncPeriod is the longest time without a sync (a partial one that checks the table
	// is still there).
	SyncPeriod time.Duration
	// FullSyncPeriod is the longest time between two full syncs.
	FullSyncPeriod time.Duration
	// TableCheckPeriod is how often the instance checks its tables were not deleted from
	// outside (cheap: lists chain names).
	TableCheckPeriod time.Duration
	// Node is this node, for local endpoints and topology.
	Node NodeInfo
	// MaxServiceElements bounds what one Service may bring into a family's table, in
	// cost units: an element is one, a rule ruleUnits, a ClientIP-affinity set
	// affinitySetUnits, a loadBalancerSourceRanges element sourceRangeUnits (costEstimate).
	// A Service over it is refused: not programmed, its model's Refused says why, and
	// every other Service is programmed. 0 is DefaultMaxServiceElements; negative is no
	// limit.
	MaxServiceElements int
	// MaxInstanceCost bounds the cost units of all the instance's programmed Services
	// together, and with them what a full sync makes the kernel do under its commit
	// lock, which every instance, kube-proxy and the CNI share. A Service that would take
	// the instance over it is refused as one over MaxServiceElements; the Services
	// already programmed keep their place (a Service is admitted in the order it
	// arrived, Services arriving together oldest first). 0 is DefaultMaxInstanceCost;
	// negative is no limit.
	MaxInstanceCost int
	// LoadBalancing is how the instance's Services pick endpoints, and which modes a
	// Service may ask for itself (LoadBalancingAnnotation).
	LoadBalancing LoadBalancing
	// Observer hears about every sync; may be nil.
	Observer Observer
	// FullSync, if set, is called as a full sync starts, and the function it returns as
	// that sync ends (the supervisor lowers the GC target meanwhile: the peak of the
	// heap comes during full syncs).
	FullSync func() (done func())
	// Clock defaults to the real clock.
	Clock Clock
}

// Observer is told what an instance does, for health, metrics and node-wide work.
type Observer interface {
	// Queued: a change is waiting for a sync.
	Queued(instance string)
	// Synced: a sync succeeded.
	Synced(res *SyncResult)
	// SyncFailed: a sync failed; the next one is a full sync.
	SyncFailed(instance string, err error)
}

// ChangedService is one Service a sync changed, before and after ("nil" when absent).
type ChangedService struct {
	Name          types.NamespacedName
	Before, After *ServiceModel
}

// SyncResult describes a successful sync.
type SyncResult struct {
	Instance string
	Full     bool
	// Stats per family.
	Stats map[tables.Family]tables.Stats
	// Changed lists the Services whose model changed.
	Changed []ChangedService
	// Services and Endpoints count what the instance serves now.
	Services, Endpoints int
	// HealthCheckNodePorts and LocalEndpoints of every LoadBalancer Service with
	// externalTrafficPolicy Local the instance owns. Read-only: results share them until
	// they change.
	HealthCheckNodePorts map[types.NamespacedName]int32
	LocalEndpoints       map[types.NamespacedName]LocalEndpoints
	// NoLocalInternal and NoLocalExternal count, per IP family, the Service ports with a
	// Local internal, respectively external, policy and no local endpoint.
	NoLocalInternal, NoLocalExternal map[tables.Family]int
	// ProgrammingLatencies are, per IP family, for each EndpointSlice change of that
	// family this sync programmed that carried
	// endpoints.kubernetes.io/last-change-trigger-time, the time from that trigger until
	// the sync finished (kube-proxy's network programming latency).
	ProgrammingLatencies map[tables.Family][]time.Duration
	Elapsed              time.Duration
}

// Proxy is one proxy instance: it tracks the Services and EndpointSlices it owns and
// keeps its tables in step on a bounded-frequency loop. The selector feeds it (it is a
// selector.Sink); Run does the syncing.
type Proxy struct {
	opts    Options
	logger  klog.Logger
	syncers map[tables.Family]*tables.Syncer

	// mu guards what the event handlers (the selector.Sink methods, SetNode,
	// Reconfigure) write. It is held only to record an event or to take a sync's inputs
	// (references, no model building, no I/O): the handlers are shared by every instance
	// on the node and must never wait for a sync.
	mu      sync.Mutex
	tracker *Tracker
	// waiting holds, per Service, the channel to close once it is programmed.
	waiting map[types.NamespacedName]*waiter
	// wantTables are the table settings Reconfigure asked for; reconfigured says the
	// syncers do not have them yet. reconfigMu serializes Reconfigure calls.
	reconfigMu   sync.Mutex
	wantTables   tables.Config
	reconfigured bool
	trigger      chan struct{}

	// syncMu serializes syncs; it guards the syncers and below.
	syncMu sync.Mutex
	// cfg is the table settings the syncers have.
	cfg tables.Config
	// appliedMu guards applied against Applied, which other instances' observers call:
	// it is held to record a sync's outcome, never across model building or nft.
	appliedMu sync.Mutex
	applied   map[types.NamespacedName]*ServiceModel
	lastFull  time.Time
	// The per-Service figures of applied and their totals, kept as applied changes so a
	// partial sync's SyncResult costs what changed, not what exists.
	sums     map[types.NamespacedName]summary
	total    summary
	hcPorts  map[types.NamespacedName]int32
	localEps map[types.NamespacedName]LocalEndpoints
	// costs are the cost units of each admitted Service (under both limits), totalCost
	// their sum; kept by model, under syncMu, whether or not the sync then succeeds (a
	// failed sync's full retry admits again in the same order).
	costs     map[types.NamespacedName]int
	totalCost int
	// overInstance are the Services refused for MaxInstanceCost alone; when roomFreed
	// (an admitted Service went or shrank) the next partial sync weighs them again.
	overInstance map[types.NamespacedName]bool
	roomFreed    bool
	// hcResult and localResult are the copies of hcPorts and localEps the SyncResults
	// share, made again only after hcChanged: copying them at every sync made each
	// partial sync copy every health-checked Service's entry (the supervisor's observer
	// still walks them per sync, as upstream's proxier does: ownership between
	// instances can change without this instance's maps changing).
	hcResult    map[types.NamespacedName]int32
	localResult map[types.NamespacedName]LocalEndpoints
	hcChanged   bool
	// triggers are the endpoint change times not yet programmed (kept across a failed
	// sync, reported by the next successful one).
	triggers []Trigger
}

// New creates an instance and opens its nftables interfaces; it changes nothing yet.
func New(opts Options) (*Proxy, error) {
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.TableCheckPeriod == 0 {
		opts.TableCheckPeriod = 2 * time.Second
	}
	if len(opts.Families) == 0 {
		opts.Families = []tables.Family{tables.IPv4, tables.IPv6}
	}
	if opts.MaxServiceElements == 0 {
		opts.MaxServiceElements = DefaultMaxServiceElements
	}
	if opts.MaxInstanceCost == 0 {
		opts.MaxInstanceCost = DefaultMaxInstanceCost
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	opts.Tables = opts.LoadBalancing.TableConfig(opts.Tables)
	p := &Proxy{
		opts:       opts,
		logger:     opts.Logger.WithValues("instance", opts.Name),
		syncers:    map[tables.Family]*tables.Syncer{},
		tracker:    NewTracker(opts.Node),
		waiting:    map[types.NamespacedName]*waiter{},
		wantTables: opts.Tables,
		trigger:    make(chan struct{}, 1),
		cfg:        opts.Tables,
		applied:    map[types.NamespacedName]*ServiceModel{},
		sums:       map[types.NamespacedName]summary{},
		hcPorts:    map[types.NamespacedName]int32{},
		localEps:   map[types.NamespacedName]LocalEndpoints{},
		costs:      map[types.NamespacedName]int{},

		overInstance: map[types.NamespacedName]bool{},
	}
	p.tracker.SetClock(opts.Clock.Now)
	p.tracker.build = opts.LoadBalancing.Build
	for _, fam := range opts.Families {
		cfg := opts.Tables
		cfg.Family = fam
		cfg.Instance = opts.Name
		nft, err := opts.NFT(fam, cfg.TableName())
		if err != nil {
			return nil, fmt.Errorf("instance %q: %w", opts.Name, err)
		}
		s, err := tables.NewSyncer(cfg, nft)
		if err != nil {
			return nil, fmt.Errorf("instance %q: %w", opts.Name, err)
		}
		s.SetElementsPerCommand(opts.ElementsPerCommand)
		if opts.Direct != nil {
			a, err := opts.Direct(cfg)
			if err != nil {
				return nil, fmt.Errorf("instance %q: %w", opts.Name, err)
			}
			s.SetDirect(a)
		}
		p.syncers[fam] = s
	}
	return p, nil
}

// Name returns the instance's name.
func (p *Proxy) Name() string { return p.opts.Name }

// RecreateTable makes the first full sync of family fam delete the table first, in the
// same transaction (tables.Syncer.RecreateOnNextFull). Call it before Run.
func (p *Proxy) RecreateTable(fam tables.Family) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if s := p.syncers[fam]; s != nil {
		s.RecreateOnNextFull()
	}
}

func (p *Proxy) queue() {
	if p.opts.Observer != nil {
		p.opts.Observer.Queued(p.opts.Name)
	}
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// waiter is the channel UpdateService hands out for one Service. There is one per
// Service at a time, shared by every update until a sync programs them, so that waiters
// cannot pile up while the instance cannot sync, however often the Service changes.
type waiter struct {
	ch chan struct{}
	// taken: a sync in flight took the Service's changes. renewed: the Service was
	// updated since, so that sync does not program the latest version and must not
	// close the channel; the next one does.
	taken, renewed bool
}

// UpdateService adds or updates a Service; the channel closes once it is programmed
// (this version or a later one).
func (p *Proxy) UpdateService(svc *corev1.Service) <-chan struct{} {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	p.mu.Lock()
	p.tracker.UpdateService(svc)
	w := p.waiting[name]
	if w == nil {
		w = &waiter{ch: make(chan struct{})}
		p.waiting[name] = w
	}
	w.renewed = w.taken
	p.mu.Unlock()
	p.queue()
	return w.ch
}

// DeleteService removes a Service and its EndpointSlices (selector.Sink: the slices'
// later events are not sent to this instance; if the Service comes back, its current
// slices come with it).
func (p *Proxy) DeleteService(name types.NamespacedName) {
	p.mu.Lock()
	p.tracker.ForgetService(name)
	p.mu.Unlock()
	p.queue()
}

// UpdateEndpointSlice adds or updates an EndpointSlice.
func (p *Proxy) UpdateEndpointSlice(slice *discoveryv1.EndpointSlice) {
	p.mu.Lock()
	p.tracker.UpdateEndpointSlice(slice)
	p.mu.Unlock()
	p.queue()
}

// DeleteEndpointSlice removes an EndpointSlice.
func (p *Proxy) DeleteEndpointSlice(slice *discoveryv1.EndpointSlice) {
	p.mu.Lock()
	p.tracker.DeleteEndpointSlice(slice)
	p.mu.Unlock()
	p.queue()
}

// SetNode updates this node's labels (topology).
func (p *Proxy) SetNode(node NodeInfo) {
	p.mu.Lock()
	p.tracker.SetNode(node)
	p.mu.Unlock()
	p.queue()
}

// Run syncs until ctx is done: at once, then after every change (no closer together
// than MinSyncPeriod), at least every SyncPeriod, fully every FullSyncPeriod or after a
// failure (with backoff), and within TableCheckPeriod of its tables being deleted.
// It leaves the rules in place when it returns, and closes the sockets its syncs hold.
func (p *Proxy) Run(ctx context.Context) error {
	defer p.closeSyncers()
	backoff := time.Duration(0)
	var last time.Time
	check := time.NewTicker(p.opts.TableCheckPeriod)
	defer check.Stop()
	forceFull := true
	for {
		res, err := p.Sync(ctx, forceFull)
		last = p.opts.Clock.Now()
		forceFull = false
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			p.logger.Error(err, "Sync failed; retrying with a full sync", "backoff", backoff)
			if p.opts.Observer != nil {
				p.opts.Observer.SyncFailed(p.opts.Name, err)
			}
		} else {
			backoff = 0
			if res != nil && p.opts.Observer != nil {
				p.opts.Observer.Synced(res)
			}
		}

		tableGone, ok := p.waitForSync(ctx, check.C, backoff)
		if !ok {
			return nil
		}
		forceFull = tableGone
		// Bound the frequency: changes within MinSyncPeriod are batched.
		if d := p.opts.MinSyncPeriod - p.opts.Clock.Now().Sub(last); d > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
	}
}

// closeSyncers releases what the syncers hold open between syncs (netlink sockets).
func (p *Proxy) closeSyncers() {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	for fam, s := range p.syncers {
		if err := s.Close(); err != nil {
			p.logger.Error(err, "Closing the table's netlink socket", "family", fam)
		}
	}
}

// waitForSync waits for the next reason to sync; tableGone says a table was deleted
// from outside (the next sync must be full), ok is false once ctx is done. While
// backoff is set, changes wait for it to run out (or for SyncPeriod). Both timers are
// made once per wait: the table check comes round every TableCheckPeriod and changes
// may come at any rate, and neither may restart them, or a backoff as long as the check
// period would never run out.
func (p *Proxy) waitForSync(ctx context.Context, check <-chan time.Time, backoff time.Duration) (tableGone, ok bool) {
	periodic := time.NewTimer(p.opts.SyncPeriod)
	defer periodic.Stop()
	var retry <-chan time.Time
	if backoff > 0 {
		t := time.NewTimer(backoff)
		defer t.Stop()
		retry = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false, false
		case <-retry:
			return false, true
		case <-periodic.C:
			return false, true
		case <-check:
			if p.tablesMissing(ctx) {
				p.logger.Info("Table deleted from outside; rebuilding")
				return true, true
			}
		case <-p.trigger:
			if retry == nil {
				return false, true
			}
			// Still backing off: the retry picks the change up.
		}
	}
}

// tablesMissing reports whether one of the instance's tables is gone.
func (p *Proxy) tablesMissing(ctx context.Context) bool {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	for _, s := range p.syncers {
		if s.NeedsFull() {
			continue
		}
		if ok, err := s.TableExists(ctx); err == nil && !ok {
			return true
		}
	}
	return false
}

// Sync runs one sync now: partial when possible, full when forced, after a failure,
// after Reconfigure, or when FullSyncPeriod has passed. Each step is its own function:
// take the changes (the only step under p.mu), build their models, program every
// family's tables, then, only if all succeeded, record what is now applied and answer
// the waiters. A failed sync records nothing and puts its waiters back for the next
// successful sync to answer.
func (p *Proxy) Sync(ctx context.Context, forceFull bool) (*SyncResult, error) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	start := p.opts.Clock.Now()
	plan := p.takeChanges(start, forceFull)
	if plan.full && p.opts.FullSync != nil {
		defer p.opts.FullSync()()
	}
	answered := false
	defer func() {
		// Also on a panic: the supervisor restarts the instance, whose first sync
		// answers them.
		if !answered {
			p.putWaitersBack(plan.waiting)
			p.keepOldestTriggers()
		}
	}()
	if plan.reconfig != nil {
		p.applyTables(*plan.reconfig)
	}
	p.buildModels(&plan)
	stats, err := p.syncFamilies(ctx, plan)
	if err != nil {
		return nil, err
	}
	answered = true
	res := &SyncResult{Instance: p.opts.Name, Full: plan.full, Stats: stats}
	p.appliedMu.Lock()
	if plan.full {
		p.recordFull(plan.all, start, res)
	} else {
		p.recordPartial(plan.changed, res)
	}
	p.appliedMu.Unlock()
	slices.SortFunc(res.Changed, func(a, b ChangedService) int { return compareNames(a.Name, b.Name) })
	p.summarize(res)
	p.answerWaiters(plan.waiting)
	p.finishSync(start, res)
	return res, nil
}

// syncPlan is what one sync programs, taken from the tracker by takeChanges.
type syncPlan struct {
	full bool
	// dirty are the Services changed since the last sync; snap holds their inputs (all
	// Services' when full).
	dirty []types.NamespacedName
	snap  *Snapshot
	// reconfig are the table settings Reconfigure asked for since the last sync (nil: none).
	reconfig *tables.Config
	// changed are the models of the dirty Services (nil: gone).
	changed map[types.NamespacedName]*ServiceModel
	// all are the models of every Service the instance owns; set only when full.
	all map[types.NamespacedName]*ServiceModel
	// waiting are the waiters this sync answers if it succeeds.
	waiting map[types.NamespacedName]*waiter
}

// takeChanges takes the tracker's changes and a snapshot of what their models are
// built from (of every Service when the sync is full). It holds p.mu, which the event
// handlers need, so it copies references and builds nothing. The lock is released by a
// defer: were it left locked by a panic (the supervisor restarts a panicking instance),
// the restarted Sync and the next event handler would block for good, and the handler is
// shared by every instance on the node.
func (p *Proxy) takeChanges(start time.Time, forceFull bool) syncPlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	plan := syncPlan{dirty: p.tracker.TakeDirty()}
	p.triggers = append(p.triggers, p.tracker.TakeTriggerTimes()...)
	if p.reconfigured {
		cfg := p.wantTables
		plan.reconfig = &cfg
		p.reconfigured = false
	}
	plan.full = plan.reconfig != nil || p.fullDue(start, forceFull)
	if plan.full {
		plan.snap = p.tracker.SnapshotAll()
	} else {
		if p.roomFreed {
			for n := range p.overInstance {
				if !slices.Contains(plan.dirty, n) {
					plan.dirty = append(plan.dirty, n)
				}
			}
		}
		plan.snap = p.tracker.Snapshot(plan.dirty)
	}
	p.roomFreed = false
	// Waiters this sync answers: those registered before it started.
	plan.waiting = make(map[types.NamespacedName]*waiter, len(p.waiting))
	for n, w := range p.waiting {
		w.taken, w.renewed = true, false
		plan.waiting[n] = w
	}
	return plan
}

// buildModels builds the models plan programs from its snapshot, without p.mu.
func (p *Proxy) buildModels(plan *syncPlan) {
	npAddrs := p.nodePortAddrs()
	if plan.full {
		// Every Service is weighed again (node port addresses may have changed): the
		// admitted keep their place, in the order admissionOrder gives.
		p.costs, p.totalCost, p.overInstance = map[types.NamespacedName]int{}, 0, map[types.NamespacedName]bool{}
		names := plan.snap.Services()
		p.admissionOrder(plan.snap, names)
		// Weigh them all in that order before any model is built; changedModels and
		// allModels then weigh each again, which keeps its place: a Service's own cost
		// is taken out before it is weighed.
		for _, n := range names {
			p.admit(plan.snap, n, npAddrs)
		}
	}
	p.admissionOrder(plan.snap, plan.dirty)
	if !plan.full {
		p.deferOverTransaction(plan, npAddrs)
	}
	plan.changed = p.changedModels(plan.snap, plan.dirty, npAddrs)
	if plan.full {
		p.roomFreed = false // every Service was weighed
	} else if p.roomFreed && len(p.overInstance) > 0 {
		p.queue() // the next sync weighs them again
	}
	if plan.full {
		plan.all = p.allModels(plan.snap, plan.changed, npAddrs)
		plan.changed = nil // a full sync programs and records all
	}
	// The tables are built next, at the heap's peak: a full sync's snapshot (every
	// Service's inputs) and dirty names are garbage by then.
	plan.snap, plan.dirty = nil, nil
}

// nodePortAddrs counts the NodePort addresses of each family, as the compiler serves
// them (never loopback or unspecified): the dispatch entries one node port brings.
func (p *Proxy) nodePortAddrs() map[tables.Family]int {
	out := map[tables.Family]int{}
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		out[fam] = len(tables.ServedNodePortIPs(fam, p.cfg.NodePortIPs))
	}
	return out
}

// changedModels builds the models of the dirty Services. Their problems are logged
// here, as soon as a changed model is built: the sync may fail, and its full retry
// rebuilds the model without it counting as changed.
func (p *Proxy) changedModels(snap *Snapshot, dirty []types.NamespacedName, npAddrs map[tables.Family]int) map[types.NamespacedName]*ServiceModel {
	models := make(map[types.NamespacedName]*ServiceModel, len(dirty))
	for _, n := range dirty {
		m := p.model(snap, n, npAddrs)
		models[n] = m
		if m != nil && m.Refused != "" {
			p.logger.Info("Refused a Service", "service", n, "reason", m.Refused)
		}
		if m != nil && len(m.Problems) > 0 {
			p.logger.Info("Skipped parts of a Service", "service", n, "problems", m.Problems)
		}
		if m != nil && len(m.Unmatched) > 0 {
			p.logger.Info("Skipped EndpointSlice ports that match no port of the Service", "service", n, "ports", m.Unmatched)
		}
	}
	return models
}

// fullDue reports whether this sync must be full: when forced, when FullSyncPeriod has
// passed since the last full sync, or when a family's syncer needs one (it has not
// synced yet, or its last sync failed).
func (p *Proxy) fullDue(start time.Time, forceFull bool) bool {
	if forceFull || p.opts.FullSyncPeriod > 0 && start.Sub(p.lastFull) >= p.opts.FullSyncPeriod {
		return true
	}
	for _, s := range p.syncers {
		if s.NeedsFull() {
			return true
		}
	}
	return false
}

// allModels returns the models of every Service of the snapshot that has one, reusing
// those changedModels just built.
func (p *Proxy) allModels(snap *Snapshot, changed map[types.NamespacedName]*ServiceModel, npAddrs map[tables.Family]int) map[types.NamespacedName]*ServiceModel {
	all := make(map[types.NamespacedName]*ServiceModel, len(snap.inputs))
	for _, n := range snap.Services() {
		m, built := changed[n]
		if !built {
			m = p.model(snap, n, npAddrs)
		}
		// A model equal to the applied one is replaced by it: a periodic full sync over
		// unchanged Services then holds one model per Service, not two, while it builds
		// the tables (at 100,000 Services the second set was ~200 MB of the resync's
		// peak), and recordFull finds them equal by pointer. Models are not changed
		// once built, and only this goroutine (under syncMu) writes applied.
		if old := p.applied[n]; m != nil && old != nil && sameModel(old, m) {
			m = old
		}
		if m != nil {
			all[n] = m
		}
	}
	return all
}

// syncFamilies programs the plan into every family's tables and returns each family's
// stats. The families' tables are independent: they are synced side by side, as
// upstream's per-family proxiers do, so a sync costs the slower family, not the sum.
func (p *Proxy) syncFamilies(ctx context.Context, plan syncPlan) (map[tables.Family]tables.Stats, error) {
	stats := map[tables.Family]tables.Stats{}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for fam, s := range p.syncers {
		wg.Go(func() {
			// A panic here would not reach the supervisor's recover (another goroutine)
			// and would take every instance down: make it this sync's failure.
			defer func() {
				if r := recover(); r != nil {
					mu.Lock()
					defer mu.Unlock()
					errs = append(errs, fmt.Errorf("%s sync panicked: %v\n%s", fam, r, debug.Stack()))
				}
			}()
			st, err := p.syncFamily(ctx, fam, s, plan)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			stats[fam] = st
		})
	}
	wg.Wait()
	return stats, errors.Join(errs...)
}

// syncFamily programs the plan into one family's tables: all of it when full, else the
// changed Services (nothing when none changed).
func (p *Proxy) syncFamily(ctx context.Context, fam tables.Family, s *tables.Syncer, plan syncPlan) (st tables.Stats, err error) {
	if plan.full {
		st, err = s.Full(ctx, portsOf(plan.all, fam))
	} else if len(plan.changed) > 0 {
		changes := map[tables.ServiceName][]*tables.ServicePort{}
		for n, m := range plan.changed {
			changes[tables.ServiceName{Namespace: n.Namespace, Name: n.Name}] = portsOfModel(m, fam)
		}
		st, err = s.Partial(ctx, changes)
	}
	for _, c := range st.Conflicts {
		p.logger.Info("Address conflict; the first Service keeps it", "conflict", c)
	}
	return st, err
}

// putWaitersBack releases a failed sync's waiters: they stay registered, for the next
// successful sync to answer.
func (p *Proxy) putWaitersBack(waiting map[types.NamespacedName]*waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range waiting {
		w.taken = false
	}
}

// keepOldestTriggers keeps, after a failed sync, only the oldest endpoint change of
// each family for the next successful sync to report: its latency is the longest, and
// the changes of every failed attempt do not pile up while the instance cannot sync.
// (Upstream drops them all on a failure.)
func (p *Proxy) keepOldestTriggers() {
	oldest := map[tables.Family]Trigger{}
	for _, t := range p.triggers {
		if o, ok := oldest[t.Family]; !ok || t.At.Before(o.At) {
			oldest[t.Family] = t
		}
	}
	p.triggers = slices.Collect(maps.Values(oldest))
}

// answerWaiters closes, after a successful sync, the channels of the Services it
// programmed, except those updated again while it ran: they stay for the next sync.
func (p *Proxy) answerWaiters(waiting map[types.NamespacedName]*waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, w := range waiting {
		w.taken = false
		if w.renewed {
			continue
		}
		close(w.ch)
		if p.waiting[n] == w {
			delete(p.waiting, n)
		}
	}
	if len(p.waiting) == 0 {
		// A map keeps the room of its largest size (at the first sync every Service
		// waits), and takeChanges walks all of it: a new one, as in TakeDirty.
		p.waiting = map[types.NamespacedName]*waiter{}
	}
}

// recordFull records a full sync: res.Changed gets every Service whose model differs
// from the applied one (for conntrack cleanup and node-wide state), and the applied
// models and their totals are rebuilt from all.
func (p *Proxy) recordFull(all map[types.NamespacedName]*ServiceModel, start time.Time, res *SyncResult) {
	for n, m := range all {
		if !sameModel(p.applied[n], m) {
			res.Changed = append(res.Changed, ChangedService{Name: n, Before: p.applied[n], After: m})
		}
	}
	for n, m := range p.applied {
		if _, ok := all[n]; !ok {
			res.Changed = append(res.Changed, ChangedService{Name: n, Before: m})
		}
	}
	p.applied = map[types.NamespacedName]*ServiceModel{}
	p.sums = map[types.NamespacedName]summary{}
	p.total = summary{}
	clear(p.hcPorts)
	clear(p.localEps)
	p.hcChanged = true
	for n, m := range all {
		p.setApplied(n, m)
	}
	p.lastFull = start
}

// recordPartial records a partial sync: every changed Service is in res.Changed (the
// tracker marked it dirty) and its model becomes the applied one.
func (p *Proxy) recordPartial(changed map[types.NamespacedName]*ServiceModel, res *SyncResult) {
	for n, m := range changed {
		res.Changed = append(res.Changed, ChangedService{Name: n, Before: p.applied[n], After: m})
		p.setApplied(n, m)
	}
}

// finishSync sets the elapsed time and the programming latencies of the endpoint
// changes this sync programmed (triggers kept since a failed sync included), and logs
// the sync.
func (p *Proxy) finishSync(start time.Time, res *SyncResult) {
	end := p.opts.Clock.Now()
	res.Elapsed = end.Sub(start)
	for _, t := range p.triggers {
		if _, programmed := p.syncers[t.Family]; !programmed {
			continue
		}
		if res.ProgrammingLatencies == nil {
			res.ProgrammingLatencies = map[tables.Family][]time.Duration{}
		}
		res.ProgrammingLatencies[t.Family] = append(res.ProgrammingLatencies[t.Family], end.Sub(t.At))
	}
	p.triggers = nil
	overNetlink := 0
	for _, st := range res.Stats {
		if st.Direct {
			overNetlink++
		}
	}
	p.logger.V(2).Info("Synced", "full", res.Full, "changed", len(res.Changed), "services", res.Services,
		"endpoints", res.Endpoints, "elapsed", res.Elapsed, "familiesOverNetlink", overNetlink)
}

// model builds the model of Service n from snap. A Service that would bring more than
// MaxServiceElements cost units into a table, or take the instance's Services over
// MaxInstanceCost, gets a model with no ports that says why it was refused, as upstream
// skips a Service it cannot program: it costs neither the building of its model nor the
// transaction of every other Service. A panic while building it (a bug some input
// reaches) costs only that Service: it is logged with its stack and the Service gets a
// model with no ports and the panic as its Problem, so the sync goes on with every
// other Service and the Service's old rules are removed like those of any Service that
// cannot be programmed.
func (p *Proxy) model(snap *Snapshot, n types.NamespacedName, npAddrs map[tables.Family]int) (m *ServiceModel) {
	defer func() {
		if r := recover(); r != nil {
			p.logger.Error(fmt.Errorf("panic: %v", r), "Building a Service's model panicked; Service skipped",
				"service", n, "stack", string(debug.Stack()))
			m = &ServiceModel{
				Name:     n,
				Problems: []string{fmt.Sprintf("internal error while building the rules (%v); Service skipped", r)},
			}
		}
	}()
	if refused := p.admit(snap, n, npAddrs); refused != "" {
		return &ServiceModel{Name: n, Refused: refused}
	}
	return snap.Model(n)
}

// admit weighs Service n of snap (costEstimate) against both limits, records its cost
// if it is admitted, forgets it if not (or if it is gone), and returns why it was
// refused ("" when admitted).
func (p *Proxy) admit(snap *Snapshot, n types.NamespacedName, npAddrs map[tables.Family]int) string {
	was := p.costs[n]
	p.totalCost -= was
	delete(p.costs, n)
	delete(p.overInstance, n)
	in, ok := snap.inputs[n]
	if !ok {
		p.roomFreed = p.roomFreed || was > 0
		return ""
	}
	mode, _ := p.opts.LoadBalancing.modeOf(in.svc)
	cost := costEstimate(in.svc, in.slices, npAddrs, mode)
	units := cost.units()
	if limit := p.opts.MaxServiceElements; limit > 0 && units > limit {
		return fmt.Sprintf("it would bring about %v into one table, over the limit of %d per Service (maxServiceElements); not programmed",
			cost, limit)
	}
	if limit := p.opts.MaxInstanceCost; limit > 0 && p.totalCost+units > limit {
		p.overInstance[n] = true
		p.roomFreed = p.roomFreed || was > 0
		return fmt.Sprintf("it would bring about %v into the instance's tables, which hold %d of their limit of %d (maxInstanceCost); not programmed",
			cost, p.totalCost, limit)
	}
	p.roomFreed = p.roomFreed || units < was
	p.costs[n] = units
	p.totalCost += units
	return ""
}

// deferOverTransaction keeps a partial sync's transaction under twice
// MaxServiceElements cost units (what the Services it removes had plus what they bring
// now): once the dirty Services, in admission order, reach it, the rest are left dirty
// for the next sync, queued at once, and their waiters wait for it. A Service gone is
// never deferred (its removal comes first, whatever it costs), nor the first one (one
// Service is at most MaxServiceElements). A full sync is one transaction whatever it
// holds: MaxInstanceCost bounds it.
func (p *Proxy) deferOverTransaction(plan *syncPlan, npAddrs map[tables.Family]int) {
	limit := 2 * p.opts.MaxServiceElements
	if limit <= 0 {
		return
	}
	sum := 0
	for i, n := range plan.dirty {
		units := p.costs[n]
		in, ok := plan.snap.inputs[n]
		if ok {
			mode, _ := p.opts.LoadBalancing.modeOf(in.svc)
			if u := costEstimate(in.svc, in.slices, npAddrs, mode).units(); u <= p.opts.MaxServiceElements {
				units += u
			}
		}
		if ok && i > 0 && sum+units > limit {
			deferred := plan.dirty[i:]
			plan.dirty = plan.dirty[:i]
			p.mu.Lock()
			for _, d := range deferred {
				p.tracker.markDirty(d)
				if w := plan.waiting[d]; w != nil {
					w.taken = false
					delete(plan.waiting, d)
				}
			}
			p.mu.Unlock()
			p.logger.V(2).Info("Deferred Services to the next sync, over the transaction's bound",
				"deferred", len(deferred), "units", sum, "bound", limit)
			p.queue()
			return
		}
		sum += units
	}
}

// admissionOrder sorts names in the order admit weighs them: those programmed
// first (a Service programmed keeps its place when another arrives or grows), then the
// oldest (creation time, then UID: never the name, which a user chooses). Names not in
// snap (deleted) go first: forgetting them frees room.
func (p *Proxy) admissionOrder(snap *Snapshot, names []types.NamespacedName) {
	key := func(n types.NamespacedName) (rank int, created time.Time, uid types.UID) {
		in, ok := snap.inputs[n]
		switch {
		case !ok:
			return 0, time.Time{}, ""
		case p.applied[n] != nil && p.applied[n].Refused == "":
			rank = 1
		default:
			rank = 2
		}
		return rank, in.svc.CreationTimestamp.Time, in.svc.UID
	}
	slices.SortStableFunc(names, func(a, b types.NamespacedName) int {
		ra, ca, ua := key(a)
		rb, cb, ub := key(b)
		if c := cmp.Compare(ra, rb); c != 0 {
			return c
		}
		if c := ca.Compare(cb); c != 0 {
			return c
		}
		if c := cmp.Compare(ua, ub); c != 0 {
			return c
		}
		return compareNames(a, b)
	})
}

// Applied returns the models last programmed (for status, conntrack cleanup and tests).
// It does not wait for a sync in progress.
func (p *Proxy) Applied() map[types.NamespacedName]*ServiceModel {
	p.appliedMu.Lock()
	defer p.appliedMu.Unlock()
	return maps.Clone(p.applied)
}

// AppliedCount is how many Services the last successful sync programmed.
func (p *Proxy) AppliedCount() int {
	p.appliedMu.Lock()
	defer p.appliedMu.Unlock()
	return len(p.applied)
}

// AppliedModel returns the model last programmed for Service n (nil: none), without
// copying the others as Applied does: the supervisor reads a few Services' after every
// sync, and copying 100,000 models' map each time was most of its garbage. It does not
// wait for a sync in progress.
func (p *Proxy) AppliedModel(n types.NamespacedName) *ServiceModel {
	p.appliedMu.Lock()
	defer p.appliedMu.Unlock()
	return p.applied[n]
}

func (p *Proxy) summarize(res *SyncResult) {
	res.Services = len(p.applied)
	res.Endpoints = p.total.endpoints
	res.NoLocalInternal = make(map[tables.Family]int, len(p.syncers))
	res.NoLocalExternal = make(map[tables.Family]int, len(p.syncers))
	for fam := range p.syncers {
		res.NoLocalInternal[fam] = p.total.noLocalInternal[familyIndex(fam)]
		res.NoLocalExternal[fam] = p.total.noLocalExternal[familyIndex(fam)]
	}
	if p.hcChanged || p.hcResult == nil {
		p.hcResult, p.localResult = maps.Clone(p.hcPorts), maps.Clone(p.localEps)
		p.hcChanged = false
	}
	res.HealthCheckNodePorts, res.LocalEndpoints = p.hcResult, p.localResult
}

// summary is what one applied Service adds to a SyncResult.
type summary struct {
	endpoints int
	// noLocalInternal and noLocalExternal count per family, by familyIndex.
	noLocalInternal, noLocalExternal [2]int
}

// familyIndex indexes a summary's per-family counts.
func familyIndex(fam tables.Family) int {
	if fam == tables.IPv6 {
		return 1
	}
	return 0
}

func summaryOf(m *ServiceModel) summary {
	var s summary
	seen := map[tables.Endpoint]bool{}
	for fam, ports := range m.Ports {
		i := familyIndex(fam)
		for _, sp := range ports {
			for _, e := range sp.ClusterEndpoints {
				seen[e] = true
			}
			for _, e := range sp.LocalEndpoints {
				seen[e] = true
			}
			if sp.InternalLocal && len(sp.LocalEndpoints) == 0 {
				s.noLocalInternal[i]++
			}
			if sp.ExternalLocal && len(sp.LocalEndpoints) == 0 {
				s.noLocalExternal[i]++
			}
		}
	}
	s.endpoints = len(seen)
	return s
}

// setApplied records m as the programmed model of n (nil: none) and keeps the totals.
func (p *Proxy) setApplied(n types.NamespacedName, m *ServiceModel) {
	if old, ok := p.sums[n]; ok {
		p.total.endpoints -= old.endpoints
		for i := range old.noLocalInternal {
			p.total.noLocalInternal[i] -= old.noLocalInternal[i]
			p.total.noLocalExternal[i] -= old.noLocalExternal[i]
		}
	}
	oldPort, oldLocal := p.hcPorts[n], p.localEps[n]
	defer func() {
		if p.hcPorts[n] != oldPort || p.localEps[n] != oldLocal {
			p.hcChanged = true
		}
	}()
	delete(p.applied, n)
	delete(p.sums, n)
	delete(p.hcPorts, n)
	delete(p.localEps, n)
	if m == nil {
		return
	}
	s := summaryOf(m)
	p.applied[n] = m
	p.sums[n] = s
	p.total.endpoints += s.endpoints
	for i := range s.noLocalInternal {
		p.total.noLocalInternal[i] += s.noLocalInternal[i]
		p.total.noLocalExternal[i] += s.noLocalExternal[i]
	}
	if m.HealthCheckNodePort != 0 {
		p.hcPorts[n] = m.HealthCheckNodePort
		p.localEps[n] = m.LocalEndpoints
	}
}

func portsOf(all map[types.NamespacedName]*ServiceModel, fam tables.Family) map[tables.ServiceName][]*tables.ServicePort {
	out := make(map[tables.ServiceName][]*tables.ServicePort, len(all))
	for n, m := range all {
		if ports := portsOfModel(m, fam); len(ports) > 0 {
			out[tables.ServiceName{Namespace: n.Namespace, Name: n.Name}] = ports
		}
	}
	return out
}

func portsOfModel(m *ServiceModel, fam tables.Family) []*tables.ServicePort {
	if m == nil {
		return nil
	}
	return m.Ports[fam]
}

func sameModel(a, b *ServiceModel) bool { return a == b || reflect.DeepEqual(a, b) }

// NodePortIPs are the node addresses the instance serves NodePorts on, as last set by
// New or Reconfigure (its health-check node ports listen there too).
func (p *Proxy) NodePortIPs() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.wantTables.NodePortIPs)
}

// Reconfigure changes the node-dependent table settings (NodePort addresses, node IPs,
// pod CIDRs for detect-local) and queues a full sync, which applies them. It does not
// wait for a sync in progress (the node's event handler calls it for every instance).
// Settings that mutate leaves as they are queue nothing: the supervisor calls it for
// every instance on each change of the node's addresses, and only the instances the
// change concerns should pay a full sync. A change of table name or slot is refused,
// and nothing changes.
func (p *Proxy) Reconfigure(mutate func(*tables.Config)) error {
	// mutate may list the node's interfaces: not under p.mu.
	p.reconfigMu.Lock()
	defer p.reconfigMu.Unlock()
	p.mu.Lock()
	cfg := p.wantTables
	p.mu.Unlock()
	before := cfg
	before.NodePortIPs, before.NodeIPs = slices.Clone(cfg.NodePortIPs), slices.Clone(cfg.NodeIPs)
	before.Local.CIDRs = slices.Clone(cfg.Local.CIDRs)
	mutate(&cfg)
	if cfg.TablePrefix != p.opts.Tables.TablePrefix || cfg.Slot != p.opts.Tables.Slot {
		return fmt.Errorf("instance %q: table prefix and slot cannot change while running", p.opts.Name)
	}
	if reflect.DeepEqual(cfg, before) {
		return nil
	}
	p.mu.Lock()
	p.wantTables = cfg
	p.reconfigured = true
	p.mu.Unlock()
	select {
	case p.trigger <- struct{}{}:
	default:
	}
	return nil
}

// applyTables gives the syncers the table settings Reconfigure asked for; syncMu must be
// held. Each syncer's next sync is then full. Reconfigure refused what a syncer would
// refuse, so an error here is a bug: logged, the syncer keeps its old settings.
func (p *Proxy) applyTables(cfg tables.Config) {
	for fam, s := range p.syncers {
		c := cfg
		c.Family = fam
		c.Instance = p.opts.Name
		if err := s.Reconfigure(c); err != nil {
			p.logger.Error(err, "Reconfiguring tables", "family", fam)
		}
	}
	p.cfg = cfg
}
