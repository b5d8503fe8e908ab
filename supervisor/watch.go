package supervisor

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/selector"
)

// labelHeadless marks EndpointSlices of headless Services: no proxy rules come from them.
const labelHeadless = "service.kubernetes.io/headless"

// byServiceIndex indexes EndpointSlices by "namespace/service".
const byServiceIndex = "by-service"

// NodeHandler hears about this node's Node object.
type NodeHandler func(node *corev1.Node, deleted bool)

// Watches are the node's API watches: exactly one informer per resource, whatever the
// number of instances.
type Watches struct {
	factory     informers.SharedInformerFactory
	nodeFactory informers.SharedInformerFactory
	services    cache.SharedIndexInformer
	slices      cache.SharedIndexInformer
	node        cache.SharedIndexInformer
	serviceCIDR cache.SharedIndexInformer
	// handlers are Connect's event handlers: Start waits until each has been given the
	// whole initial list, not only until the caches hold it.
	handlers []cache.ResourceEventHandlerRegistration
}

// NewWatches creates the informers (nothing runs before Start). serviceCIDRs is false
// when the apiserver does not serve networking.k8s.io/v1 ServiceCIDRs.
func NewWatches(client kubernetes.Interface, nodeName string, serviceCIDRs bool) (*Watches, error) {
	w := &Watches{}
	w.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = "!" + labelHeadless
		}), informers.WithTransform(trimForCache))
	w.nodeFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}), informers.WithTransform(trimForCache))
	w.services = w.factory.Core().V1().Services().Informer()
	w.slices = w.factory.Discovery().V1().EndpointSlices().Informer()
	if err := w.slices.AddIndexers(cache.Indexers{byServiceIndex: func(obj any) ([]string, error) {
		sl, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return nil, nil
		}
		name, ok := selector.ServiceOf(sl)
		if !ok {
			return nil, nil
		}
		return []string{name.String()}, nil
	}}); err != nil {
		return nil, fmt.Errorf("indexing EndpointSlices: %w", err)
	}
	w.node = w.nodeFactory.Core().V1().Nodes().Informer()
	if serviceCIDRs {
		w.serviceCIDR = w.factory.Networking().V1().ServiceCIDRs().Informer()
	}
	return w, nil
}

// lastApplied is the annotation `kubectl apply` keeps a whole copy of the object in.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// trimForCache drops what no instance reads from the objects the informers keep:
// managedFields and kubectl's last-applied copy, often most of a small object's size,
// and the per-endpoint Pod references of EndpointSlices (README.md has the figures).
func trimForCache(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		if ann := m.GetAnnotations(); ann[lastApplied] != "" {
			trimmed := make(map[string]string, len(ann)-1)
			for k, v := range ann {
				if k != lastApplied {
					trimmed[k] = v
				}
			}
			m.SetAnnotations(trimmed)
		}
	}
	if sl, ok := obj.(*discoveryv1.EndpointSlice); ok {
		// Every endpoint the EndpointSlice controller writes names its Pod (targetRef);
		// no proxy reads it, nor the hostname or the deprecated topology. The slice's
		// owner reference is the Service, known by label anyway.
		sl.OwnerReferences = nil
		for i := range sl.Endpoints {
			ep := &sl.Endpoints[i]
			ep.TargetRef, ep.Hostname, ep.DeprecatedTopology = nil, nil, nil
		}
	}
	return obj, nil
}

// SlicesOf lists the current EndpointSlices of a Service (a selector.SliceLister).
func (w *Watches) SlicesOf(namespace, service string) []*discoveryv1.EndpointSlice {
	objs, err := w.slices.GetIndexer().ByIndex(byServiceIndex, namespace+"/"+service)
	if err != nil {
		return nil
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, sl)
		}
	}
	return out
}

// ServiceCIDRs lists the cluster's Service CIDRs (empty without the API).
func (w *Watches) ServiceCIDRs() []string {
	if w.serviceCIDR == nil {
		return nil
	}
	var out []string
	for _, o := range w.serviceCIDR.GetStore().List() {
		if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
			out = append(out, sc.Spec.CIDRs...)
		}
	}
	return out
}

// Connect sends every event to the dispatcher, node events to onNode, and calls
// onServiceCIDRs whenever the cluster's ServiceCIDRs change (never without the API).
func (w *Watches) Connect(d *selector.Dispatcher, onNode NodeHandler, onServiceCIDRs func()) error {
	logger := klog.Background()
	for _, h := range []struct {
		what     string
		informer cache.SharedIndexInformer
		funcs    cache.ResourceEventHandlerFuncs
	}{
		{"Services", w.services, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withService(obj, d.ServiceChanged) },
			UpdateFunc: func(_, obj any) { withService(obj, d.ServiceChanged) },
			DeleteFunc: func(obj any) { withService(obj, d.ServiceDeleted) },
		}},
		{"EndpointSlices", w.slices, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withSlice(obj, d.SliceChanged) },
			UpdateFunc: func(_, obj any) { withSlice(obj, d.SliceChanged) },
			DeleteFunc: func(obj any) { withSlice(obj, d.SliceDeleted) },
		}},
		{"this Node", w.node, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { withNode(obj, false, onNode) },
			UpdateFunc: func(_, obj any) { withNode(obj, false, onNode) },
			DeleteFunc: func(obj any) { withNode(obj, true, onNode) },
		}},
		{"ServiceCIDRs", w.serviceCIDR, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { onServiceCIDRs() },
			UpdateFunc: func(any, any) { onServiceCIDRs() },
			DeleteFunc: func(any) { onServiceCIDRs() },
		}},
	} {
		if h.informer == nil {
			continue // ServiceCIDRs without the API
		}
		reg, err := h.informer.AddEventHandler(h.funcs)
		if err != nil {
			return fmt.Errorf("watching %s: %w", h.what, err)
		}
		w.handlers = append(w.handlers, reg)
	}
	logger.V(2).Info("Watches connected")
	return nil
}

// Start runs the informers and waits until their caches are filled and Connect's
// handlers have passed the whole initial lists on, so the instances' first full syncs
// see every Service with its endpoints (a restart never drops rules that still apply;
// an informer's own HasSynced says only that its cache is full, while the handlers may
// still be thousands of events behind).
func (w *Watches) Start(ctx context.Context, timeout time.Duration) error {
	w.factory.Start(ctx.Done())
	w.nodeFactory.Start(ctx.Done())
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	synced := []cache.InformerSynced{w.services.HasSynced, w.slices.HasSynced, w.node.HasSynced}
	for _, h := range w.handlers {
		synced = append(synced, h.HasSynced)
	}
	if w.serviceCIDR != nil {
		synced = append(synced, w.serviceCIDR.HasSynced)
	}
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		return fmt.Errorf("API caches did not fill within %s", timeout)
	}
	return nil
}

func withService(obj any, f func(*corev1.Service)) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if svc, ok := obj.(*corev1.Service); ok {
		f(svc)
	}
}

func withSlice(obj any, f func(*discoveryv1.EndpointSlice)) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if sl, ok := obj.(*discoveryv1.EndpointSlice); ok {
		f(sl)
	}
}

func withNode(obj any, deleted bool, f NodeHandler) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if n, ok := obj.(*corev1.Node); ok && f != nil {
		f(n, deleted)
	}
}
