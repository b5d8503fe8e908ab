package nodeaddrs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultDebounce is how long the writer waits after a Node's addresses change for more
// changes before it writes: Nodes joining together (a scale-up) cost one write.
const DefaultDebounce = time.Second

// Labels of the published ConfigMap: what it is, for `kubectl get -l`.
const (
	LabelComponent = "app.kubernetes.io/component"
	ComponentValue = "node-addresses"
)

// DefaultMaxEgress is the writer's default egress budget, in bytes a second: 50 MiB/s,
// a publish every ~2 s under sustained churn at 1,000 Nodes (107 kB lists), every ~51 s
// at 5,000 (536 kB), and no wait at 100 Nodes beyond ~20 ms.
const DefaultMaxEgress = 50 << 20

// PublishInterval is the least time between two writes of a list of listBytes read by
// readers watchers, under the egress budget budget (bytes a second): each write is sent
// whole to every reader, so it costs readers × listBytes of the API server's egress.
// It is 0 when budget is 0 or less (no budget).
func PublishInterval(readers, listBytes int, budget int64) time.Duration {
	if budget <= 0 || readers <= 0 || listBytes <= 0 {
		return 0
	}
	cost := float64(readers) * float64(listBytes)
	return time.Duration(math.Ceil(cost / float64(budget) * float64(time.Second)))
}

// DefaultSyncTimeout bounds the writer's first list of the Nodes and of its ConfigMap: a
// writer that cannot read them (no right to, no API server) fails rather than hold the
// Lease and publish nothing.
const DefaultSyncTimeout = time.Minute

// Writer watches every Node and keeps the ConfigMap Namespace/Name holding their
// addresses (Encode), writing it only when the list's text changes. It watches that
// ConfigMap too, so a list deleted or edited by hand is written back. Only one writer may
// run at a time (RunElected elects it).
type Writer struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the ConfigMap's name; default DefaultName.
	Name string
	// Debounce is the wait after a change before the write; default DefaultDebounce.
	Debounce time.Duration
	// MaxEgress is the budget, in bytes a second, of the API server's egress for the
	// list: a write sends the whole list to every reader (≈ the Nodes it names, each
	// one's supervisor watches it), so a write follows the one before by at least
	// PublishInterval(Nodes, list bytes, MaxEgress): a token bucket holding one publish.
	// A change after a quiet period is written after the debounce alone; under
	// sustained churn the next write waits for the budget and carries every change
	// gathered meanwhile. 0 or less: no budget (the debounce alone spaces writes).
	MaxEgress int64
	// Clock tells the time of the debounce, the budget and health; default the real
	// one (tests: a fake).
	Clock clock.Clock
	// SyncTimeout bounds the first list of the Nodes and of the ConfigMap; default
	// DefaultSyncTimeout.
	SyncTimeout time.Duration
	// Logger; default klog's.
	Logger klog.Logger
	// Written, when set, hears of each list written (tests): its Node count and size.
	Written func(nodes, bytes int)
	// Recorder, when set, hears of the writer's state (metrics).
	Recorder Recorder

	// state is what Healthy reports.
	state state
}

// Recorder hears of a writer's state; metrics.NodeAddressWriter is one.
type Recorder interface {
	// SetLeader records whether this writer holds the Lease.
	SetLeader(bool)
	// Published records that the ConfigMap holds the list of nodes Nodes (written now,
	// or found current).
	Published(nodes int, at time.Time)
	// PublishFailed counts a failed publish.
	PublishFailed()
	// BudgetWait records that a write waits wait for the egress budget (MaxEgress).
	BudgetWait(wait time.Duration)
}

// state is the writer's health: whether it leads, whether its publishes work and
// whether its watches do.
type state struct {
	mu        sync.Mutex
	leading   bool
	since     time.Time // when it started leading
	published time.Time // the last publish that worked, since it started leading
	err       error     // the last publish's error; nil after one that worked
	failing   time.Time // when the failures in err began
	// budgetSince is when the current wait for the egress budget began (zero: none);
	// budgetWaited the time spent in such waits since failing. A retry waiting for the
	// budget is not failing.
	budgetSince  time.Time
	budgetWaited time.Duration
	// watches is, per watch, its current run of list or watch failures.
	watches map[string]*watchFailure
}

// watchFailure is a run of one watch's failures: errors each within watchErrorGap of
// the one before.
type watchFailure struct {
	first, last time.Time
	err         error
}

// watchErrorGap ends a run of watch failures: the reflector retries within 30 s
// (client-go's backoff cap), so a watch with no error for longer has recovered.
const watchErrorGap = 90 * time.Second

// setLeading records that the writer started or stopped leading.
func (w *Writer) setLeading(leading bool) {
	w.state.mu.Lock()
	// A new term starts clean: a watch's failures of the last term are not this one's.
	w.state.leading, w.state.since, w.state.published, w.state.err, w.state.watches = leading, w.clock().Now(), time.Time{}, nil, nil
	w.state.budgetSince, w.state.budgetWaited = time.Time{}, 0
	w.state.mu.Unlock()
	if w.Recorder != nil {
		w.Recorder.SetLeader(leading)
	}
}

// published records a publish's result.
func (w *Writer) published(nodes int, err error) {
	now := w.clock().Now()
	w.state.mu.Lock()
	if err != nil {
		// A failure run begins at the first error, or when the error turns from a list
		// too large (not counted by Healthy) to another or back.
		if w.state.err == nil || errors.Is(w.state.err, ErrTooLarge) != errors.Is(err, ErrTooLarge) {
			w.state.failing, w.state.budgetWaited = now, 0
		}
		w.state.err = err
	} else {
		w.state.published, w.state.err, w.state.budgetWaited = now, nil, 0
	}
	w.state.mu.Unlock()
	if w.Recorder == nil {
		return
	}
	if err != nil {
		w.Recorder.PublishFailed()
	} else {
		w.Recorder.Published(nodes, now)
	}
}

// budgetWaiting records at now that a wait for the egress budget begins (true) or ends.
func (w *Writer) budgetWaiting(waiting bool, now time.Time) {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	st := &w.state
	if waiting {
		st.budgetSince = now
		return
	}
	if !st.budgetSince.IsZero() && st.err != nil {
		st.budgetWaited += now.Sub(laterOf(st.budgetSince, st.failing))
	}
	st.budgetSince = time.Time{}
}

// laterOf is the later of a and b.
func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// watchFailed records that watch what failed with err at now.
func (w *Writer) watchFailed(what string, err error, now time.Time) {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	if w.state.watches == nil {
		w.state.watches = map[string]*watchFailure{}
	}
	f := w.state.watches[what]
	if f == nil || now.Sub(f.last) > watchErrorGap {
		f = &watchFailure{first: now}
		w.state.watches[what] = f
	}
	f.last, f.err = now, err
}

// watchErrors joins the last error of each watch's current or last run of failures,
// each named; "no error seen" when none failed (the API server was slow rather than
// refusing).
func (w *Writer) watchErrors() error {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	var errs []error
	for _, what := range slices.Sorted(maps.Keys(w.state.watches)) {
		errs = append(errs, fmt.Errorf("%s: %w", what, w.state.watches[what].err))
	}
	if len(errs) == 0 {
		return errors.New("no list or watch failed: the API server did not answer in time")
	}
	return errors.Join(errs...)
}

// Healthy is nil unless the writer leads and cannot do its work for longer than the
// first sync's bound (SyncTimeout): its publishes have failed that long (not counting
// the retries' waits for the egress budget, MaxEgress), none has
// worked that long since it started leading, or a watch has failed that long (the
// list it would publish is stale). A list too large to write is not counted: a restart
// cannot shrink it, and the list before it stays published (the error is logged and
// counted). A writer standing by is healthy.
func (w *Writer) Healthy() error {
	return w.healthyAt(w.clock().Now())
}

func (w *Writer) healthyAt(now time.Time) error {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	st, bound := &w.state, w.syncTimeout()
	if !st.leading {
		return nil
	}
	failed := now.Sub(st.failing) - st.budgetWaited
	if !st.budgetSince.IsZero() {
		failed -= now.Sub(laterOf(st.budgetSince, st.failing))
	}
	if st.err != nil && !errors.Is(st.err, ErrTooLarge) && failed > bound {
		return fmt.Errorf("leading, and publishing has failed since %s: %w", st.failing.UTC().Format(time.RFC3339), st.err)
	}
	if st.published.IsZero() && st.err == nil && now.Sub(st.since) > bound {
		return fmt.Errorf("leading since %s, and nothing published yet", st.since.UTC().Format(time.RFC3339))
	}
	for _, what := range slices.Sorted(maps.Keys(st.watches)) {
		f := st.watches[what]
		if now.Sub(f.last) <= watchErrorGap && f.last.Sub(f.first) > bound {
			return fmt.Errorf("leading, and watching %s has failed since %s: %w", what, f.first.UTC().Format(time.RFC3339), f.err)
		}
	}
	return nil
}

func (w *Writer) clock() clock.Clock {
	if w.Clock != nil {
		return w.Clock
	}
	return clock.RealClock{}
}

func (w *Writer) syncTimeout() time.Duration {
	if w.SyncTimeout > 0 {
		return w.SyncTimeout
	}
	return DefaultSyncTimeout
}

// Run watches the Nodes and the ConfigMap until ctx ends: once their first lists are
// in, it writes the whole list (it may have changed while no writer ran), then after
// the debounce each change of a Node's addresses, and each change of the ConfigMap's
// text by anyone else (or its deletion), each write no sooner after the one before
// than the egress budget allows (MaxEgress). Failed writes are retried with backoff. It
// returns nil when ctx ends, and an error when it cannot start: no namespace, or the
// first lists not in within SyncTimeout (the error names what the lists failed on).
func (w *Writer) Run(ctx context.Context) error {
	if w.Namespace == "" {
		return errNoNamespace
	}
	if w.Name == "" {
		w.Name = DefaultName
	}
	if w.Debounce <= 0 {
		w.Debounce = DefaultDebounce
	}
	if w.Logger.GetSink() == nil {
		w.Logger = klog.Background()
	}
	logger := w.Logger.WithValues("configMap", w.Namespace+"/"+w.Name)
	clk := w.clock()
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	p := &publisher{w: w, logger: logger}
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(w.Client, 0, informers.WithTransform(trimNode))
	cmFactory := informers.NewSharedInformerFactoryWithOptions(w.Client, 0, informers.WithNamespace(w.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.Name).String()
		}))
	nodes := nodeFactory.Core().V1().Nodes().Informer()
	cms := cmFactory.Core().V1().ConfigMaps().Informer()
	for _, inf := range []struct {
		what string
		inf  cache.SharedIndexInformer
	}{{"Nodes", nodes}, {"ConfigMap " + w.Namespace + "/" + w.Name, cms}} {
		if err := inf.inf.SetWatchErrorHandlerWithContext(w.watchErrorHandler(inf.what)); err != nil {
			return fmt.Errorf("watching %s: %w", inf.what, err)
		}
	}
	nodeReg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { notify() },
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := obj.(*corev1.Node)
			if !ok1 || !ok2 || !slices.Equal(o.Status.Addresses, n.Status.Addresses) {
				notify()
			}
		},
		DeleteFunc: func(any) { notify() },
	})
	if err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	// The ConfigMap as the watch sees it: a text other than the one last written or
	// read (someone else's edit, or an older version the watch had not yet passed),
	// or a deletion, makes the next publish read it again and write it if it is not
	// the list. The writer's own writes carry the text it knows and cost nothing.
	seen := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if ok && (cm.Name != w.Name || p.knows(cm.Data[DataKey])) {
			return // another ConfigMap (only a fake ignores the field selector), or known
		}
		p.reread.Store(true)
		notify()
	}
	cmReg, err := cms.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
		DeleteFunc: func(obj any) {
			if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name != w.Name {
				return
			}
			p.reread.Store(true)
			notify()
		},
	})
	if err != nil {
		return fmt.Errorf("watching ConfigMap %s/%s: %w", w.Namespace, w.Name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		nodeFactory.Shutdown()
		cmFactory.Shutdown()
	}()
	// The informers log with the writer's logger (client-go takes it from the
	// context), not klog's global one.
	ctx = klog.NewContext(ctx, logger)
	nodeFactory.StartWithContext(ctx)
	cmFactory.StartWithContext(ctx)
	syncCtx, syncDone := context.WithTimeout(ctx, w.syncTimeout())
	synced := cache.WaitForCacheSync(syncCtx.Done(), nodes.HasSynced, nodeReg.HasSynced, cms.HasSynced, cmReg.HasSynced)
	syncDone()
	if !synced {
		if ctx.Err() != nil {
			return nil
		}
		err := fmt.Errorf("listing the Nodes and ConfigMap %s/%s: not done within %v: %w", w.Namespace, w.Name,
			w.syncTimeout(), w.watchErrors())
		w.published(0, err)
		return err
	}
	select { // the initial lists' events: the first publish covers them
	case <-changed:
	default:
	}
	logger.Info("Publishing the Nodes' addresses", "nodes", len(nodes.GetStore().ListKeys()))
	backoff := writeBackoff()
	retry := time.Duration(0)
	for {
		if p.reread.Swap(false) {
			p.forget()
		}
		all := list(nodes.GetStore(), logger)
		if wait, interval := p.budgetWait(all, clk.Now()); wait > 0 {
			// Under churn: the write waits for the budget, and then carries every
			// change gathered meanwhile (the list is read again).
			logger.V(2).Info("Waiting for the egress budget before publishing the Nodes' addresses", "wait", wait,
				"interval", interval, "nodes", len(all), "maxEgress", w.MaxEgress)
			if w.Recorder != nil {
				w.Recorder.BudgetWait(wait)
			}
			w.budgetWaiting(true, clk.Now())
			t := clk.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
			w.budgetWaiting(false, clk.Now())
			select { // the changes gathered meanwhile: the list read next covers them
			case <-changed:
			default:
			}
			continue
		}
		err := p.publish(ctx, all)
		w.published(len(all), err)
		if err != nil {
			retry = backoff.Step()
			logger.Error(err, "Publishing the Nodes' addresses failed; retrying", "backoff", retry)
		} else {
			retry, backoff = 0, writeBackoff()
		}
		wait := retry
		if wait == 0 {
			// Nothing to retry: wait for a change, then the debounce.
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
			}
			wait = w.Debounce
		}
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		select { // the changes the debounce gathered: this publish covers them
		case <-changed:
		default:
		}
	}
}

// watchErrorHandler records (and logs, as client-go's default does) each failure of
// the watch of what.
func (w *Writer) watchErrorHandler(what string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, r *cache.Reflector, err error) {
		w.watchFailed(what, err, time.Now())
		cache.DefaultWatchErrorHandler(ctx, r, err)
	}
}

// writeBackoff spaces retries of a failed write: from 1 s, doubling, to 15 s, so that
// a write that fails for a while is retried well within the health bound (SyncTimeout)
// and a passing outage does not fail the liveness probe.
func writeBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 15 * time.Second}
}

// list is the store's Nodes, each as FromNode takes it; a Node with more addresses than
// are published is logged.
func list(store cache.Store, logger klog.Logger) []Node {
	var out []Node
	for _, o := range store.List() {
		if n, ok := o.(*corev1.Node); ok {
			node, dropped := FromNode(n)
			if dropped > 0 {
				logger.Info("Node lists more addresses than are published; the rest are not reserved", "node", n.Name,
					"published", len(node.Addrs), "dropped", dropped)
			}
			out = append(out, node)
		}
	}
	return out
}

// trimNode keeps only a Node's name and addresses in the writer's cache.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

// publisher writes the list, remembering the object it last wrote or read so that an
// unchanged list costs no request and a changed one one update.
type publisher struct {
	w      *Writer
	logger klog.Logger
	// last is the ConfigMap as last read or written; nil: read it first. Only publish
	// and forget, on Run's goroutine, use it.
	last *corev1.ConfigMap
	// text is last's list, or the list being written, for the ConfigMap watch's
	// handler (another goroutine): an event with this text is the writer's own write,
	// or one it has read.
	text atomic.Pointer[string]
	// reread, set by the ConfigMap watch's handler, makes the next publish read the
	// ConfigMap again.
	reread atomic.Bool
	// lastWrite is when the publisher last wrote the list (zero: not yet in this
	// term): the egress budget counts from it.
	lastWrite time.Time
}

// budgetWait is how long the write of nodes' list must still wait at now for the egress
// budget, and the interval the budget sets for it: 0 without a budget, before this
// term's first write, when the list would not be written (the ConfigMap holds it, or
// it is too large) or once the interval since the last write has passed.
func (p *publisher) budgetWait(nodes []Node, now time.Time) (wait, interval time.Duration) {
	if p.w.MaxEgress <= 0 || p.lastWrite.IsZero() {
		return 0, 0
	}
	text := Encode(nodes)
	if CheckSize(text) != nil || p.last != nil && p.last.Data[DataKey] == text {
		return 0, 0
	}
	interval = PublishInterval(len(nodes), len(text), p.w.MaxEgress)
	return p.lastWrite.Add(interval).Sub(now), interval
}

// knows reports whether text is the list the publisher last wrote or read.
func (p *publisher) knows(text string) bool {
	t := p.text.Load()
	return t != nil && *t == text
}

// remember sets the ConfigMap as last read or written; nil forgets it.
func (p *publisher) remember(cm *corev1.ConfigMap) {
	p.last = cm
	if cm == nil {
		p.text.Store(nil)
		return
	}
	text := cm.Data[DataKey]
	p.text.Store(&text)
}

// writing makes text known before it is written: the watch may bring the write's event
// before its response.
func (p *publisher) writing(text string) { p.text.Store(&text) }

// forget makes the next publish read the ConfigMap first.
func (p *publisher) forget() { p.remember(nil) }

// publish writes nodes' list unless the ConfigMap holds it already.
func (p *publisher) publish(ctx context.Context, nodes []Node) error {
	text := Encode(nodes)
	if err := CheckSize(text); err != nil {
		// The previous list stays: supervisors keep reserving what it names. Nothing
		// smaller can be written until Nodes go away or lose addresses.
		return fmt.Errorf("publishing the addresses of %d Nodes to %s/%s: %w: not written; the list published before stays",
			len(nodes), p.w.Namespace, p.w.Name, err)
	}
	if p.last != nil && p.last.Data[DataKey] == text {
		return nil
	}
	cms := p.w.Client.CoreV1().ConfigMaps(p.w.Namespace)
	for attempt := 0; ; attempt++ {
		if p.last == nil {
			cur, err := cms.Get(ctx, p.w.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				cm := &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: p.w.Name, Namespace: p.w.Namespace,
						Labels: map[string]string{LabelComponent: ComponentValue}},
					Data: map[string]string{DataKey: text},
				}
				p.writing(text)
				created, err := cms.Create(ctx, cm, metav1.CreateOptions{})
				if err != nil {
					p.forget()
				}
				if apierrors.IsAlreadyExists(err) && attempt < 3 {
					continue // created by someone else since: read it
				}
				if err != nil {
					return fmt.Errorf("creating ConfigMap %s/%s: %w", p.w.Namespace, p.w.Name, err)
				}
				p.written(created, len(nodes))
				return nil
			case err != nil:
				return fmt.Errorf("reading ConfigMap %s/%s: %w", p.w.Namespace, p.w.Name, err)
			}
			p.remember(cur)
			if cur.Data[DataKey] == text {
				return nil
			}
		}
		cm := p.last.DeepCopy()
		cm.Data = map[string]string{DataKey: text}
		if cm.Labels == nil {
			cm.Labels = map[string]string{}
		}
		cm.Labels[LabelComponent] = ComponentValue
		p.writing(text)
		updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if err == nil {
			p.written(updated, len(nodes))
			return nil
		}
		p.forget()
		if (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) && attempt < 3 {
			continue // written or deleted by someone else: read it again
		}
		return fmt.Errorf("updating ConfigMap %s/%s: %w", p.w.Namespace, p.w.Name, err)
	}
}

func (p *publisher) written(cm *corev1.ConfigMap, nodes int) {
	p.remember(cm)
	p.lastWrite = p.w.clock().Now()
	size := len(cm.Data[DataKey])
	p.logger.V(2).Info("Published the Nodes' addresses", "nodes", nodes, "bytes", size, "resourceVersion", cm.ResourceVersion)
	if p.w.Written != nil {
		p.w.Written(nodes, size)
	}
}

// errNoNamespace is Run's error without a namespace.
var errNoNamespace = errors.New("running the node address writer: no namespace for the published ConfigMap")
