package instance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime/debug"
	"slices"
	"sync"
	"time"

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
	// Observer hears about every sync; may be nil.
	Observer Observer
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
	// externalTrafficPolicy Local the instance owns.
	HealthCheckNodePorts map[types.NamespacedName]int32
	LocalEndpoints       map[types.NamespacedName]int
	// NoLocalEndpoints counts Service ports with a Local policy and no local endpoint.
	NoLocalInternal, NoLocalExternal int
	// ProgrammingLatencies are, for each EndpointSlice change this sync programmed that
	// carried endpoints.kubernetes.io/last-change-trigger-time, the time from that
	// trigger until the sync finished (kube-proxy's network programming latency).
	ProgrammingLatencies []time.Duration
	Elapsed              time.Duration
}

// Proxy is one proxy instance: it tracks the Services and EndpointSlices it owns and
// keeps its tables in step on a bounded-frequency loop. The selector feeds it (it is a
// selector.Sink); Run does the syncing.
type Proxy struct {
	opts    Options
	logger  klog.Logger
	syncers map[tables.Family]*tables.Syncer

	mu      sync.Mutex
	tracker *Tracker
	// waiting are the channels to close once the given Service is programmed.
	waiting map[types.NamespacedName][]chan struct{}
	trigger chan struct{}

	// syncMu serializes syncs with reconfiguration; it guards the syncers and below.
	syncMu   sync.Mutex
	applied  map[types.NamespacedName]*ServiceModel
	lastFull time.Time
	// The per-Service figures of applied and their totals, kept as applied changes so a
	// partial sync's SyncResult costs what changed, not what exists.
	sums     map[types.NamespacedName]summary
	total    summary
	hcPorts  map[types.NamespacedName]int32
	localEps map[types.NamespacedName]int
	// triggers are the endpoint change times not yet programmed (kept across a failed
	// sync, reported by the next successful one).
	triggers []time.Time
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
	p := &Proxy{
		opts:     opts,
		logger:   klog.Background().WithValues("instance", opts.Name),
		syncers:  map[tables.Family]*tables.Syncer{},
		tracker:  NewTracker(opts.Node),
		waiting:  map[types.NamespacedName][]chan struct{}{},
		trigger:  make(chan struct{}, 1),
		applied:  map[types.NamespacedName]*ServiceModel{},
		sums:     map[types.NamespacedName]summary{},
		hcPorts:  map[types.NamespacedName]int32{},
		localEps: map[types.NamespacedName]int{},
	}
	p.tracker.SetClock(opts.Clock.Now)
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

func (p *Proxy) queue() {
	if p.opts.Observer != nil {
		p.opts.Observer.Queued(p.opts.Name)
	}
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// UpdateService adds or updates a Service; the channel closes once it is programmed.
func (p *Proxy) UpdateService(svc *corev1.Service) <-chan struct{} {
	ch := make(chan struct{})
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	p.mu.Lock()
	p.tracker.UpdateService(svc)
	p.waiting[name] = append(p.waiting[name], ch)
	p.mu.Unlock()
	p.queue()
	return ch
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
// It leaves the rules in place when it returns.
func (p *Proxy) Run(ctx context.Context) error {
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
// or when FullSyncPeriod has passed. Each step is its own function: take the changes
// (under p.mu), program every family's tables, then, only if all succeeded, record
// what is now applied and answer the waiters. A failed sync records nothing and puts
// its waiters back for the next successful sync to answer.
func (p *Proxy) Sync(ctx context.Context, forceFull bool) (*SyncResult, error) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	start := p.opts.Clock.Now()
	plan := p.takeChanges(start, forceFull)
	stats, err := p.syncFamilies(ctx, plan)
	if err != nil {
		p.putWaitersBack(plan.waiting)
		return nil, err
	}
	res := &SyncResult{Instance: p.opts.Name, Full: plan.full, Stats: stats}
	if plan.full {
		p.recordFull(plan.all, start, res)
	} else {
		p.recordPartial(plan.changed, res)
	}
	slices.SortFunc(res.Changed, func(a, b ChangedService) int { return compareNames(a.Name, b.Name) })
	p.summarize(res)
	for _, chs := range plan.waiting {
		for _, ch := range chs {
			close(ch)
		}
	}
	p.finishSync(start, res)
	return res, nil
}

// syncPlan is what one sync programs, taken from the tracker by takeChanges.
type syncPlan struct {
	full bool
	// changed are the models of the Services changed since the last sync (nil: gone).
	changed map[types.NamespacedName]*ServiceModel
	// all are the models of every Service the instance owns; set only when full.
	all map[types.NamespacedName]*ServiceModel
	// waiting are the channels to close once this sync succeeds.
	waiting map[types.NamespacedName][]chan struct{}
}

// takeChanges takes the tracker's changes and builds the models this sync programs. It
// holds p.mu, released by a defer: were it left locked by a panic (the supervisor
// restarts a panicking instance), the restarted Sync and the next event handler would
// block for good, and the handler is shared by every instance on the node.
func (p *Proxy) takeChanges(start time.Time, forceFull bool) syncPlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	dirty := p.tracker.TakeDirty()
	p.triggers = append(p.triggers, p.tracker.TakeTriggerTimes()...)
	plan := syncPlan{changed: p.changedModels(dirty)}
	plan.full = p.fullDue(start, forceFull)
	if plan.full {
		plan.all = p.allModels(plan.changed)
	}
	// Channels to close after this sync: only those registered before it started.
	plan.waiting = p.waiting
	p.waiting = map[types.NamespacedName][]chan struct{}{}
	return plan
}

// changedModels builds the models of the dirty Services; p.mu must be held. Their
// problems are logged here, as soon as a changed model is built: the sync may fail, and
// its full retry rebuilds the model without it counting as changed.
func (p *Proxy) changedModels(dirty []types.NamespacedName) map[types.NamespacedName]*ServiceModel {
	models := make(map[types.NamespacedName]*ServiceModel, len(dirty))
	for _, n := range dirty {
		m := p.model(n)
		models[n] = m
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

// allModels returns the models of every Service the tracker knows that has one, reusing
// those changedModels just built; p.mu must be held.
func (p *Proxy) allModels(changed map[types.NamespacedName]*ServiceModel) map[types.NamespacedName]*ServiceModel {
	all := map[types.NamespacedName]*ServiceModel{}
	for _, n := range p.tracker.Services() {
		m, built := changed[n]
		if !built {
			m = p.model(n)
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

// putWaitersBack returns a failed sync's waiters to p.waiting, ahead of those registered
// since: they are answered by the next successful sync.
func (p *Proxy) putWaitersBack(waiting map[types.NamespacedName][]chan struct{}) {
	p.mu.Lock()
	for n, chs := range waiting {
		p.waiting[n] = append(chs, p.waiting[n]...)
	}
	p.mu.Unlock()
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
		res.ProgrammingLatencies = append(res.ProgrammingLatencies, end.Sub(t))
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

// model builds the current model of Service n; p.mu must be held. A panic while building
// it (a bug some input reaches) costs only that Service: it is logged with its stack and
// the Service gets a model with no ports and the panic as its Problem, so the sync goes on
// with every other Service and the Service's old rules are removed like those of any
// Service that cannot be programmed.
func (p *Proxy) model(n types.NamespacedName) (m *ServiceModel) {
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
	return p.tracker.Model(n)
}

// Applied returns the models last programmed (for status and tests).
func (p *Proxy) Applied() map[types.NamespacedName]*ServiceModel {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	return maps.Clone(p.applied)
}

func (p *Proxy) summarize(res *SyncResult) {
	res.Services = len(p.applied)
	res.Endpoints = p.total.endpoints
	res.NoLocalInternal = p.total.noLocalInternal
	res.NoLocalExternal = p.total.noLocalExternal
	res.HealthCheckNodePorts = maps.Clone(p.hcPorts)
	res.LocalEndpoints = maps.Clone(p.localEps)
}

// summary is what one applied Service adds to a SyncResult.
type summary struct {
	endpoints                        int
	noLocalInternal, noLocalExternal int
}

func summaryOf(m *ServiceModel) summary {
	var s summary
	seen := map[tables.Endpoint]bool{}
	for _, ports := range m.Ports {
		for _, sp := range ports {
			for _, e := range sp.ClusterEndpoints {
				seen[e] = true
			}
			for _, e := range sp.LocalEndpoints {
				seen[e] = true
			}
			if sp.InternalLocal && len(sp.LocalEndpoints) == 0 {
				s.noLocalInternal++
			}
			if sp.ExternalLocal && len(sp.LocalEndpoints) == 0 {
				s.noLocalExternal++
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
		p.total.noLocalInternal -= old.noLocalInternal
		p.total.noLocalExternal -= old.noLocalExternal
	}
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
	p.total.noLocalInternal += s.noLocalInternal
	p.total.noLocalExternal += s.noLocalExternal
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

func sameModel(a, b *ServiceModel) bool { return reflect.DeepEqual(a, b) }

// Reconfigure changes the node-dependent table settings (NodePort addresses, node IPs,
// pod CIDRs for detect-local) and queues a full sync.
func (p *Proxy) Reconfigure(mutate func(*tables.Config)) error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	var errs []error
	for fam, s := range p.syncers {
		cfg := p.opts.Tables
		mutate(&cfg)
		cfg.Family = fam
		cfg.Instance = p.opts.Name
		if err := s.Reconfigure(cfg); err != nil {
			errs = append(errs, err)
		}
	}
	mutate(&p.opts.Tables)
	select {
	case p.trigger <- struct{}{}:
	default:
	}
	return errors.Join(errs...)
}
