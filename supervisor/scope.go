package supervisor

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
)

// watchScope returns the label selectors of the node's Service watches: each watch
// receives the Services its selector matches, the node those of any watch. The
// EndpointSlice watches use the same selectors (and leave headless slices out): the
// EndpointSlice controller copies every label of a Service to its slices except its
// own reserved ones (k8s.io/kubernetes v1.36.3 staging/src/k8s.io/endpointslice/utils.go,
// setEndpointSliceLabels and isReservedLabelKey: only kubernetes.io/service-name,
// endpointslice.kubernetes.io/managed-by and service.kubernetes.io/headless are its
// own), so service.kubernetes.io/service-proxy-name and selector.LabelShadow reach the
// slices of a Service, in the controller's next sync after the Service changes.
//
// A single selector "" (everything) when a default instance runs: it serves unlabelled
// Services, and "unlabelled OR in (names)" cannot be one label selector. Two watches
// (!label and label in (names)) would save only the Services of other proxies, and a
// Service relabelled between the default and a named instance would leave one watch and
// enter the other in one write, with the two streams in no order. Also "" when scoped
// is false (the ServiceCIDR API is not served, so the address precedence needs every
// Service's cluster IP; with it, every cluster IP lies in a ServiceCIDR, which is
// reserved whole).
//
// Otherwise two: the Services labelled for a local instance's proxy names, and those a
// migration shadows for one (selector.LabelShadow), so a node running no default
// instance never receives unlabelled Services or those of proxies it does not run.
func watchScope(instances []config.Instance, scoped bool) []string {
	var names []string
	for _, s := range instances {
		if s.Default {
			return []string{""}
		}
		names = append(names, s.ProxyNames...)
	}
	if !scoped || len(names) == 0 {
		return []string{""}
	}
	slices.Sort(names)
	set := "(" + strings.Join(slices.Compact(names), ",") + ")"
	return []string{selector.LabelServiceProxyName + " in " + set, selector.LabelShadow + " in " + set}
}

// sliceSelector is the EndpointSlice watch's selector for a Service watch's one.
func sliceSelector(services string) string {
	if services == "" {
		return "!" + labelHeadless
	}
	return "!" + labelHeadless + "," + services
}

// leaveReadTimeout bounds the read of an object leaving every watch; an object that
// cannot be read in time is taken as gone (as before the read existed).
const leaveReadTimeout = 10 * time.Second

// getFunc reads an object from the apiserver at or after a resource version (from the
// watch cache); nil with no error when it does not exist.
type getFunc func(ctx context.Context, namespace, name, rv string) (metav1.Object, error)

// merger joins the events of the informers of one resource whose selectors may overlap
// into one stream: an object is changed while any watch holds it, at the newest version
// any has delivered, and deleted when none does.
//
// An object moving from one watch to another in one write (a migration moves the label
// and removes the shadow marker at once) leaves the first watch and enters the second in
// no particular order. Leaving every watch is therefore confirmed with a read at that
// version: an object that still exists and matches a selector is changed, not deleted
// (the second watch's event follows, at a version already delivered), so a handover
// between a shadow and an owner never falls into a gap. The read costs one GET per
// object leaving the node's scope, from the apiserver's watch cache.
//
// The read runs on the merger's own goroutine (run), never in a watch's handler or
// under its lock: one watch carries every tenant's Services, and a tenant deleting or
// unlabelling many of its own must not hold the others' events behind its reads (the
// client's rate limit makes each wait). Until its read answers, an object that left
// stays held, with no watch.
type merger struct {
	what   string
	logger klog.Logger
	// selectors are the watches' selectors by index; nil: a free index (Rescope). Read
	// and written under mu.
	selectors []labels.Selector
	get       getFunc
	changed   func(any)
	deleted   func(any)

	mu sync.Mutex
	// held are the objects some watch holds: which watches, and the newest version
	// delivered.
	held map[string]*heldObject
	// leaving are the objects that left every watch and wait for run's read, by key,
	// as the watch delivered them; leaveOrder is the order they left in.
	leaving    map[string]any
	leaveOrder []string
	wake       chan struct{} // run has leaving objects to read
}

type heldObject struct {
	by uint8 // bit i: watch i holds it
	rv uint64
}

func newMerger(what string, selectors []string, get getFunc, changed, deleted func(any)) (*merger, error) {
	m := &merger{what: what, logger: klog.Background(), get: get, changed: changed, deleted: deleted, held: map[string]*heldObject{},
		leaving: map[string]any{}, wake: make(chan struct{}, 1)}
	for _, s := range selectors {
		sel, err := labels.Parse(s)
		if err != nil {
			return nil, err
		}
		m.selectors = append(m.selectors, sel)
	}
	return m, nil
}

// handlers are the event handlers of watch i.
func (m *merger) handlers(i int) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.onChange(i, obj) },
		UpdateFunc: func(_, obj any) { m.onChange(i, obj) },
		DeleteFunc: func(obj any) { m.onDelete(i, obj) },
	}
}

func objectKey(o metav1.Object) string { return o.GetNamespace() + "/" + o.GetName() }

// resourceVersion parses a resource version; 0 when it is not a number (fakes).
func resourceVersion(o metav1.Object) uint64 {
	rv, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	return rv
}

func (m *merger) onChange(i int, obj any) {
	o, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.held[objectKey(o)]
	if h == nil {
		h = &heldObject{}
		m.held[objectKey(o)] = h
	}
	h.by |= 1 << i
	rv := resourceVersion(o)
	if rv != 0 && rv <= h.rv {
		return // another watch delivered this version or a newer one
	}
	h.rv = rv
	m.changed(obj)
}

func (m *merger) onDelete(i int, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := objectKey(o)
	h := m.held[key]
	if h == nil {
		return
	}
	h.by &^= 1 << i
	if h.by != 0 {
		return // another watch holds it: its events carry it on
	}
	if _, queued := m.leaving[key]; !queued {
		m.leaveOrder = append(m.leaveOrder, key)
	}
	m.leaving[key] = obj
	select {
	case m.wake <- struct{}{}:
	default: // run is already woken
	}
}

// run confirms, one at a time and in order, that the objects which left every watch
// left the node's scope, until ctx ends.
func (m *merger) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		}
		for {
			m.mu.Lock()
			if len(m.leaveOrder) == 0 {
				m.mu.Unlock()
				break
			}
			key := m.leaveOrder[0]
			m.leaveOrder = m.leaveOrder[1:]
			obj := m.leaving[key]
			delete(m.leaving, key)
			m.mu.Unlock()
			m.confirmLeave(ctx, key, obj)
		}
	}
}

// confirmLeave reads an object that left every watch (outside the lock) and delivers
// the outcome unless a watch took it back, or it left again, meanwhile.
func (m *merger) confirmLeave(ctx context.Context, key string, obj any) {
	o, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	cur := m.stillInScope(ctx, o)
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.held[key]
	if _, again := m.leaving[key]; h == nil || h.by != 0 || again {
		return // held again (its events carry it on), or a newer leave waits its turn
	}
	if cur != nil {
		if rv := resourceVersion(cur); rv == 0 || rv > h.rv {
			h.rv = rv
			m.changed(cur)
		}
		return
	}
	delete(m.held, key)
	m.deleted(obj)
}

// stillInScope reads an object that left a watch: the current version if it exists and
// another watch will receive it, else nil. A single watch needs no read.
func (m *merger) stillInScope(ctx context.Context, o metav1.Object) metav1.Object {
	m.mu.Lock()
	var sels []labels.Selector
	for _, sel := range m.selectors {
		if sel != nil {
			sels = append(sels, sel)
		}
	}
	m.mu.Unlock()
	if len(sels) < 2 {
		return nil
	}
	// Bounded: the objects that left after this one wait for the read.
	ctx, cancel := context.WithTimeout(ctx, leaveReadTimeout)
	defer cancel()
	cur, err := m.get(ctx, o.GetNamespace(), o.GetName(), o.GetResourceVersion())
	if err != nil && !apierrors.IsNotFound(err) {
		m.logger.Error(err, "Reading an object that left a watch; taking it as gone", "resource", m.what, "object", objectKey(o))
		return nil
	}
	if cur == nil || err != nil {
		return nil
	}
	for _, sel := range sels {
		if sel.Matches(labels.Set(cur.GetLabels())) {
			return cur
		}
	}
	return nil
}

// maxWatches is how many watches a merger joins at once (heldObject.by's bits).
const maxWatches = 8

// addWatch gives a new watch of selector sel an index, the lowest free one.
func (m *merger) addWatch(sel string) (int, error) {
	parsed, err := labels.Parse(sel)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, have := range m.selectors {
		if have == nil {
			m.selectors[i] = parsed
			return i, nil
		}
	}
	if len(m.selectors) >= maxWatches {
		return 0, fmt.Errorf("%s: %d watches at once", m.what, maxWatches)
	}
	m.selectors = append(m.selectors, parsed)
	return len(m.selectors) - 1, nil
}

// dropWatch forgets watch i, which has stopped: the objects it alone held are deleted
// (store is its cache, for their last versions), unless one waits for run's read,
// which then decides. Its index is free again.
func (m *merger) dropWatch(i int, store cache.Store) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.selectors[i] = nil
	for key, h := range m.held {
		if h.by&(1<<i) == 0 {
			continue
		}
		if h.by &^= 1 << i; h.by != 0 {
			continue
		}
		if _, leaving := m.leaving[key]; leaving {
			continue
		}
		delete(m.held, key)
		if obj, ok, _ := store.GetByKey(key); ok {
			m.deleted(obj)
		}
	}
}
