package nodeaddrs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// DefaultDebounce is how long the writer waits after a Node's addresses change for more
// changes before it writes: Nodes joining together (a scale-up) cost one write.
const DefaultDebounce = time.Second

// Labels of the published ConfigMap: what it is, for `kubectl get -l`.
const (
	LabelComponent = "app.kubernetes.io/component"
	ComponentValue = "node-addresses"
)

// Writer watches every Node and keeps the ConfigMap Namespace/Name holding their
// addresses (Encode), writing it only when the list's text changes. Only one writer may
// run at a time (RunElected elects it).
type Writer struct {
	Client    kubernetes.Interface
	Namespace string
	// Name is the ConfigMap's name; default DefaultName.
	Name string
	// Debounce is the wait after a change before the write; default DefaultDebounce.
	Debounce time.Duration
	// Logger; default klog's.
	Logger klog.Logger
	// Written, when set, hears of each list written (tests, metrics): its Node count and
	// size.
	Written func(nodes, bytes int)
}

// Run watches the Nodes until ctx ends: once their first list is in, it writes the
// whole list (it may have changed while no writer ran), then each change after the
// debounce. Failed writes are retried with backoff. It returns nil when ctx ends, an
// error only if the Nodes cannot be watched.
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
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(w.Client, 0, informers.WithTransform(trimNode))
	nodes := factory.Core().V1().Nodes().Informer()
	reg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
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
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		factory.Shutdown()
	}()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced, reg.HasSynced) {
		return nil // ctx ended
	}
	select { // the initial list's events: the first publish covers them
	case <-changed:
	default:
	}
	logger.Info("Publishing the Nodes' addresses", "nodes", len(nodes.GetStore().ListKeys()))
	p := &publisher{w: w, logger: logger}
	backoff := writeBackoff()
	retry := time.Duration(0)
	for {
		if err := p.publish(ctx, list(nodes.GetStore(), logger)); err != nil {
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
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		select { // the changes the debounce gathered: this publish covers them
		case <-changed:
		default:
		}
	}
}

// writeBackoff spaces retries of a failed write: from 1 s, doubling, to a minute.
func writeBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: time.Minute}
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
	// last is the ConfigMap as last read or written; nil: read it first.
	last *corev1.ConfigMap
}

// publish writes nodes' list unless the ConfigMap holds it already.
func (p *publisher) publish(ctx context.Context, nodes []Node) error {
	text := Encode(nodes)
	if err := CheckSize(text); err != nil {
		// The previous list stays: supervisors keep reserving what it names. Nothing
		// smaller can be written until Nodes go away or lose addresses.
		return fmt.Errorf("%w: not written (%d Nodes); the list published before stays", err, len(nodes))
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
				created, err := cms.Create(ctx, cm, metav1.CreateOptions{})
				if err != nil {
					return fmt.Errorf("creating ConfigMap %s/%s: %w", p.w.Namespace, p.w.Name, err)
				}
				p.written(created, len(nodes))
				return nil
			case err != nil:
				return fmt.Errorf("reading ConfigMap %s/%s: %w", p.w.Namespace, p.w.Name, err)
			}
			p.last = cur
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
		updated, err := cms.Update(ctx, cm, metav1.UpdateOptions{})
		if err == nil {
			p.written(updated, len(nodes))
			return nil
		}
		p.last = nil
		if (apierrors.IsConflict(err) || apierrors.IsNotFound(err)) && attempt < 3 {
			continue // written or deleted by someone else: read it again
		}
		return fmt.Errorf("updating ConfigMap %s/%s: %w", p.w.Namespace, p.w.Name, err)
	}
}

func (p *publisher) written(cm *corev1.ConfigMap, nodes int) {
	p.last = cm
	size := len(cm.Data[DataKey])
	p.logger.V(2).Info("Published the Nodes' addresses", "nodes", nodes, "bytes", size, "resourceVersion", cm.ResourceVersion)
	if p.w.Written != nil {
		p.w.Written(nodes, size)
	}
}

// errNoNamespace is Run's error without a namespace.
var errNoNamespace = errors.New("nodeaddrs: no namespace for the published ConfigMap")
