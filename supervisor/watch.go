package supervisor

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
)

// labelHeadless marks EndpointSlices of headless Services: no proxy rules come from them.
const labelHeadless = "service.kubernetes.io/headless"

// byServiceIndex indexes EndpointSlices by a bucket of their Service (serviceBucket).
const byServiceIndex = "by-service"

// serviceBuckets is how many buckets byServiceIndex spreads the Services over. The
// index keeps a set per value: one per Service was ~300 bytes of heap a Service (a Go
// map for the one or two slices of most Services); a bucket's set holds ~8 slices a
// bucket at 30,000 Services, ~25 at 100,000, which SlicesOf sorts out by label.
const serviceBuckets = 4096

// NodeHandler hears about this node's Node object.
type NodeHandler func(node *corev1.Node, deleted bool)

// WatchOptions are what NewWatches watches beyond the Services and EndpointSlices of
// its scope.
type WatchOptions struct {
	// ServiceCIDRs is false when the apiserver does not serve networking.k8s.io/v1
	// ServiceCIDRs.
	ServiceCIDRs bool
	// OtherNodes watches every Node, not only this one, for their addresses, or the
	// published list of them when PublishedNodeAddresses is set.
	OtherNodes bool
	// PublishedNodeAddresses is the ConfigMap of the published node address list
	// (nodeaddrs) to read the other Nodes' addresses from, with OtherNodes, instead of
	// a watch of every Node (otherNodeAddresses: published).
	PublishedNodeAddresses *types.NamespacedName
	// Logger is where the watches log (the supervisor's, with its values); the zero
	// Logger is klog's global one.
	Logger klog.Logger
}

// Watches are the node's API watches: one informer per resource and label selector of
// watchScope, whatever the number of instances.
type Watches struct {
	client   kubernetes.Interface
	nodeName string
	logger   klog.Logger
	shared   *endpointValues
	// otherNodes: the other Nodes' addresses are watched: every Node (the Node watch
	// holds them all) or, with published, the published list.
	otherNodes bool
	// published is the watch of the published node address list; nil: none.
	published *publishedList
	// mu guards scoped, which Rescope changes while the others read it.
	mu sync.RWMutex
	// scoped are the Service and EndpointSlice watches, one pair per selector of the
	// scope.
	scoped []*scopedWatch
	// factories are the informer factories of the other watches.
	factories   []informers.SharedInformerFactory
	nodeFactory informers.SharedInformerFactory
	node        cache.SharedIndexInformer
	serviceCIDR cache.SharedIndexInformer
	// apiServer is the EndpointSlices of default/kubernetes, the API server's endpoints:
	// no Service's user address may take one (whatever the watch scope).
	apiServer cache.SharedIndexInformer
	// handlers are Connect's event handlers: Start waits until each has been given the
	// whole initial list, not only until the caches hold it.
	handlers []cache.ResourceEventHandlerRegistration
	// serviceMerger and sliceMerger join the watches of each resource when there are
	// several (nil with one); Start runs their reads of objects leaving every watch.
	serviceMerger, sliceMerger *merger
	// readers are the mergers' reads, for Wait.
	readers sync.WaitGroup
}

// scopedWatch is the Service and EndpointSlice watches of one selector of the scope.
type scopedWatch struct {
	sel              string
	services, slices cache.SharedIndexInformer
	factories        [2]informers.SharedInformerFactory
	// serviceIndex and sliceIndex are the watches' indexes in the mergers.
	serviceIndex, sliceIndex int
	// stop ends the watches alone (Rescope); set when they start.
	stop context.CancelFunc
}

// newScopedWatch creates the informers of one selector's watches (nothing runs).
func (w *Watches) newScopedWatch(sel string) *scopedWatch {
	services := informers.NewSharedInformerFactoryWithOptions(w.client, 0, informers.WithTransform(w.shared.trimService))
	slices := informers.NewSharedInformerFactoryWithOptions(w.client, 0, informers.WithTransform(w.shared.trimSlice))
	// Not the factories' own informers: those index every object by namespace, for
	// listers no one here uses (a set of every key per namespace).
	return &scopedWatch{sel: sel, factories: [2]informers.SharedInformerFactory{services, slices},
		services: services.InformerFor(&corev1.Service{},
			func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
				return coreinformers.NewFilteredServiceInformer(c, metav1.NamespaceAll, resync, cache.Indexers{},
					func(o *metav1.ListOptions) { o.LabelSelector = sel })
			}),
		slices: slices.InformerFor(&discoveryv1.EndpointSlice{},
			func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
				return discoveryinformers.NewFilteredEndpointSliceInformer(c, metav1.NamespaceAll, resync,
					cache.Indexers{byServiceIndex: sliceServiceIndex},
					func(o *metav1.ListOptions) { o.LabelSelector = sliceSelector(sel) })
			}),
	}
}

// start runs the watches until ctx ends or stop is called.
func (sw *scopedWatch) start(ctx context.Context) {
	ctx, sw.stop = context.WithCancel(ctx)
	for _, f := range sw.factories {
		f.Start(ctx.Done())
	}
}

// shutdown waits for the watches to end (after start's context or stop).
func (sw *scopedWatch) shutdown() {
	for _, f := range sw.factories {
		f.Shutdown()
	}
}

// watches returns the scope's watches, a copy to range over without the lock.
func (w *Watches) watches() []*scopedWatch {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return slices.Clone(w.scoped)
}

// NewWatches creates the informers (nothing runs before Start) for the Services and
// EndpointSlices of scope (watchScope's selectors), this Node, and what opts add.
func NewWatches(client kubernetes.Interface, nodeName string, scope []string, opts WatchOptions) (*Watches, error) {
	w := &Watches{client: client, nodeName: nodeName, shared: newEndpointValues(), otherNodes: opts.OtherNodes, logger: opts.Logger}
	if w.logger.GetSink() == nil {
		w.logger = klog.Background()
	}
	for _, sel := range scope {
		w.scoped = append(w.scoped, w.newScopedWatch(sel))
	}
	allNodes := opts.OtherNodes
	if opts.OtherNodes && opts.PublishedNodeAddresses != nil {
		allNodes = false
		w.published = newPublishedList(client, *opts.PublishedNodeAddresses, nodeName)
	}
	w.nodeFactory = newNodeFactory(client, nodeName, allNodes)
	w.node = w.nodeFactory.Core().V1().Nodes().Informer()
	// One small object in one namespace: the API server's endpoints.
	apiServer := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(metav1.NamespaceDefault),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=kubernetes"
		}), informers.WithTransform(trimForCache))
	w.factories = append(w.factories, apiServer)
	w.apiServer = apiServer.Discovery().V1().EndpointSlices().Informer()
	if opts.ServiceCIDRs {
		// Every ServiceCIDR: neither the Node's field selector nor a Service label applies.
		cidrs := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(trimForCache))
		w.factories = append(w.factories, cidrs)
		w.serviceCIDR = cidrs.Networking().V1().ServiceCIDRs().Informer()
	}
	return w, nil
}

// newNodeFactory returns the factory of the one Node watch: of this Node only, or of
// every Node when otherNodes is set. Still one watch then, not two: this Node's object
// is kept whole, the others' only as name and addresses (a Node with its images and
// conditions is several kilobytes; trimmed, 1.2 KB with three addresses, about 6 MB at
// 5,000 nodes).
func newNodeFactory(client kubernetes.Interface, nodeName string, otherNodes bool) informers.SharedInformerFactory {
	if !otherNodes {
		return informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
			}), informers.WithTransform(trimForCache))
	}
	return informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(func(obj any) (any, error) {
		n, ok := obj.(*corev1.Node)
		if !ok || n.Name == nodeName {
			return trimForCache(obj)
		}
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
			Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
		}, nil
	}))
}

// OtherNodeIPs lists the addresses of the Nodes other than this one (none unless
// WatchOptions.OtherNodes), sorted by address; an address two Nodes list is named
// after the first by name. From the published list, they are those of the last list
// read validly.
func (w *Watches) OtherNodeIPs() []selector.NodeIP {
	if w.published != nil {
		return w.published.otherNodeIPs()
	}
	var nodes []*corev1.Node
	for _, o := range w.node.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok {
			nodes = append(nodes, n)
		}
	}
	return otherNodeIPs(nodes, w.nodeName)
}

func sliceServiceIndex(obj any) ([]string, error) {
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name, ok := selector.ServiceOf(sl)
	if !ok {
		return nil, nil
	}
	return []string{serviceBucket(name.Namespace, name.Name)}, nil
}

// serviceBucket is the byServiceIndex value of a Service's slices: FNV-1a of
// namespace/name, modulo serviceBuckets.
func serviceBucket(namespace, name string) string {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for _, s := range []string{namespace, "/", name} {
		for i := range len(s) {
			h = (h ^ uint32(s[i])) * prime
		}
	}
	return strconv.Itoa(int(h % serviceBuckets))
}

// lastApplied is the annotation `kubectl apply` keeps a whole copy of the object in.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// trimForCache drops what no instance reads from the objects the informers keep:
// managedFields and kubectl's last-applied copy, often most of a small object's size,
// and the per-endpoint Pod references of EndpointSlices (docs/performance.md has the figures).
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

// endpointValues holds the values the informers' objects repeat: the conditions (true
// or false) and the node and zone names every EndpointSlice endpoint points to, the
// slices' port names, protocols and numbers, and the short strings Services repeat
// (namespace, type, policies, families). The API decodes each into an allocation of
// its own per object; shared, 100,000 endpoints keep a few dozen (docs/performance.md).
// Informer objects are read-only, so no one writes through them.
type endpointValues struct {
	yes, no *bool
	mu      sync.Mutex
	names   map[string]*string
	strs    map[string]string
	numbers map[int32]*int32
	// families holds one spec.ipFamilies list per distinct list.
	families map[string][]corev1.IPFamily
}

func newEndpointValues() *endpointValues {
	yes, no := true, false
	return &endpointValues{yes: &yes, no: &no, names: map[string]*string{}, strs: map[string]string{},
		numbers: map[int32]*int32{}, families: map[string][]corev1.IPFamily{}}
}

// trimSlice is trimForCache for EndpointSlices, with shared endpoint values.
func (v *endpointValues) trimSlice(obj any) (any, error) {
	obj, err := trimForCache(obj)
	sl, ok := obj.(*discoveryv1.EndpointSlice)
	if err != nil || !ok {
		return obj, err
	}
	if cap(sl.Endpoints) > len(sl.Endpoints) {
		// Decoding appends endpoint by endpoint, leaving up to twice the room: 96 bytes
		// an unused endpoint, 60 bytes an endpoint of a decoded 10-endpoint slice.
		eps := make([]discoveryv1.Endpoint, len(sl.Endpoints))
		copy(eps, sl.Endpoints)
		sl.Endpoints = eps
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	sl.Namespace = v.str(sl.Namespace)
	sl.AddressType = discoveryv1.AddressType(v.str(string(sl.AddressType)))
	for i := range sl.Ports {
		p := &sl.Ports[i]
		p.Name, p.AppProtocol, p.Port = v.name(p.Name), v.name(p.AppProtocol), v.number(p.Port)
		if p.Protocol != nil {
			p.Protocol = (*corev1.Protocol)(v.name((*string)(p.Protocol)))
		}
	}
	for i := range sl.Endpoints {
		ep := &sl.Endpoints[i]
		c := &ep.Conditions
		c.Ready, c.Serving, c.Terminating = v.bool(c.Ready), v.bool(c.Serving), v.bool(c.Terminating)
		ep.NodeName, ep.Zone = v.name(ep.NodeName), v.name(ep.Zone)
	}
	return sl, nil
}

// trimService is trimForCache for Services, with shared values.
func (v *endpointValues) trimService(obj any) (any, error) {
	obj, err := trimForCache(obj)
	svc, ok := obj.(*corev1.Service)
	if err != nil || !ok {
		return obj, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	svc.Namespace = v.str(svc.Namespace)
	spec := &svc.Spec
	spec.Type = corev1.ServiceType(v.str(string(spec.Type)))
	spec.SessionAffinity = corev1.ServiceAffinity(v.str(string(spec.SessionAffinity)))
	spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicy(v.str(string(spec.ExternalTrafficPolicy)))
	spec.IPFamilyPolicy = (*corev1.IPFamilyPolicy)(v.name((*string)(spec.IPFamilyPolicy)))
	spec.InternalTrafficPolicy = (*corev1.ServiceInternalTrafficPolicy)(v.name((*string)(spec.InternalTrafficPolicy)))
	spec.IPFamilies = v.ipFamilies(spec.IPFamilies)
	if len(spec.ClusterIPs) > 0 && spec.ClusterIPs[0] == spec.ClusterIP {
		spec.ClusterIP = spec.ClusterIPs[0] // decoded twice
	}
	for i := range spec.Ports {
		p := &spec.Ports[i]
		p.Name, p.Protocol = v.str(p.Name), corev1.Protocol(v.str(string(p.Protocol)))
		p.AppProtocol = v.name(p.AppProtocol)
	}
	for i := range svc.Status.LoadBalancer.Ingress {
		ing := &svc.Status.LoadBalancer.Ingress[i]
		ing.IPMode = (*corev1.LoadBalancerIPMode)(v.name((*string)(ing.IPMode)))
	}
	return svc, nil
}

func (v *endpointValues) ipFamilies(fams []corev1.IPFamily) []corev1.IPFamily {
	if len(fams) == 0 {
		return fams
	}
	return shareValue(v.families, fmt.Sprint(fams), fams)
}

func (v *endpointValues) bool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return v.yes
	default:
		return v.no
	}
}

func (v *endpointValues) name(s *string) *string {
	if s == nil {
		return nil
	}
	return shareValue(v.names, *s, s)
}

func (v *endpointValues) str(s string) string { return shareValue(v.strs, s, s) }

func (v *endpointValues) number(n *int32) *int32 {
	if n == nil {
		return nil
	}
	return shareValue(v.numbers, *n, n)
}

// shareValue returns the value shared for key, making val that value if there is none
// yet. At maxSharedNames keys the map starts over: names of Nodes long gone would pile
// up (what is shared stays so).
func shareValue[K comparable, V any](shared map[K]V, key K, val V) V {
	if s, ok := shared[key]; ok {
		return s
	}
	if len(shared) >= maxSharedNames {
		clear(shared)
	}
	shared[key] = val
	return val
}

// maxSharedNames bounds each of endpointValues' maps: a cluster's nodes, zones, port
// names and numbers and namespaces, with room.
const maxSharedNames = 20000

// Scoped tells whether the node's watches hold only some Services (watchScope).
func (w *Watches) Scoped() bool { return scopedBy(w.Scope()) }

// scopedBy tells whether a scope (watchScope's) selects only some Services.
func scopedBy(scope []string) bool { return !(len(scope) == 1 && scope[0] == "") }

// ServiceUID returns the UID of the Service name as a watch holds it, "" when none does.
func (w *Watches) ServiceUID(name types.NamespacedName) types.UID {
	for _, sw := range w.watches() {
		if o, ok, _ := sw.services.GetStore().GetByKey(name.String()); ok {
			if svc, ok := o.(*corev1.Service); ok {
				return svc.UID
			}
		}
	}
	return ""
}

// HeldServices lists the Services the node's watches hold, each once, in the newest
// version a watch holds (two watches may both hold one). Read-only: the informers' own.
func (w *Watches) HeldServices() []*corev1.Service {
	newest := map[string]*corev1.Service{}
	for _, sw := range w.watches() {
		for _, o := range sw.services.GetStore().List() {
			svc, ok := o.(*corev1.Service)
			if !ok {
				continue
			}
			key := svc.Namespace + "/" + svc.Name
			if cur, ok := newest[key]; !ok || resourceVersion(cur) < resourceVersion(svc) {
				newest[key] = svc
			}
		}
	}
	return slices.Collect(maps.Values(newest))
}

// SlicesOf lists the current EndpointSlices of a Service (a selector.SliceLister): of a
// slice two watches hold, the newer version.
func (w *Watches) SlicesOf(namespace, service string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	seen := map[string]int{}
	want := types.NamespacedName{Namespace: namespace, Name: service}
	for _, sw := range w.watches() {
		objs, err := sw.slices.GetIndexer().ByIndex(byServiceIndex, serviceBucket(namespace, service))
		if err != nil {
			continue
		}
		for _, o := range objs {
			sl, ok := o.(*discoveryv1.EndpointSlice)
			if !ok {
				continue
			}
			if name, _ := selector.ServiceOf(sl); name != want {
				continue // another Service of the bucket
			}
			if i, dup := seen[sl.Name]; dup {
				if resourceVersion(sl) > resourceVersion(out[i]) {
					out[i] = sl
				}
				continue
			}
			seen[sl.Name] = len(out)
			out = append(out, sl)
		}
	}
	return out
}

// Scope is the label selectors of the Service and EndpointSlice watches.
func (w *Watches) Scope() []string {
	var out []string
	for _, sw := range w.watches() {
		out = append(out, sw.sel)
	}
	return out
}

// WatchesOtherNodes tells whether the other Nodes' addresses are watched
// (WatchOptions.OtherNodes), from every Node or from the published list.
func (w *Watches) WatchesOtherNodes() bool { return w.otherNodes }

// PublishedNodeAddresses is the published node address list's state, and false when
// the node does not read one.
func (w *Watches) PublishedNodeAddresses() (healthcheck.NodeAddressesStatus, bool) {
	if w.published == nil {
		return healthcheck.NodeAddressesStatus{}, false
	}
	return w.published.current(), true
}

// ServiceCIDRsServed tells whether the API server serves ServiceCIDRs (WatchOptions).
func (w *Watches) ServiceCIDRsServed() bool { return w.serviceCIDR != nil }

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

// APIServerIPs are the addresses of default/kubernetes's endpoints, sorted.
func (w *Watches) APIServerIPs() []netip.Addr {
	var sls []*discoveryv1.EndpointSlice
	for _, o := range w.apiServer.GetStore().List() {
		if sl, ok := o.(*discoveryv1.EndpointSlice); ok {
			sls = append(sls, sl)
		}
	}
	return apiServerIPs(sls)
}

// Connect sends every event to the dispatcher, this Node's events to onNode, and calls
// onServiceCIDRs whenever the cluster's ServiceCIDRs change (never without the API),
// onOtherNodes whenever another Node's addresses do (never without
// WatchOptions.OtherNodes) and onAPIServer whenever the API server's endpoints do.
func (w *Watches) Connect(d *selector.Dispatcher, onNode NodeHandler, onServiceCIDRs, onOtherNodes, onAPIServer func()) error {
	services, sm, err := w.resourceHandlers("Services", w.getService,
		func(obj any) { withService(obj, d.ServiceChanged) }, func(obj any) { withService(obj, d.ServiceDeleted) })
	if err != nil {
		return err
	}
	slices, lm, err := w.resourceHandlers("EndpointSlices", w.getSlice,
		func(obj any) { withSlice(obj, d.SliceChanged) }, func(obj any) { withSlice(obj, d.SliceDeleted) })
	if err != nil {
		return err
	}
	w.serviceMerger, w.sliceMerger = sm, lm
	for i, sw := range w.scoped {
		sw.serviceIndex, sw.sliceIndex = i, i
	}
	type handler struct {
		what     string
		informer cache.SharedIndexInformer
		funcs    cache.ResourceEventHandlerFuncs
	}
	all := []handler{
		{"Nodes", w.node, w.nodeHandlers(onNode, onOtherNodes)},
		{"ServiceCIDRs", w.serviceCIDR, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { onServiceCIDRs() },
			UpdateFunc: func(any, any) { onServiceCIDRs() },
			DeleteFunc: func(any) { onServiceCIDRs() },
		}},
		{"API server endpoints", w.apiServer, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { onAPIServer() },
			UpdateFunc: func(any, any) { onAPIServer() },
			DeleteFunc: func(any) { onAPIServer() },
		}},
	}
	if w.published != nil {
		all = append(all, handler{"the published node addresses", w.published.informer, w.published.handlers(onOtherNodes)})
	}
	for i, sw := range w.scoped {
		all = append(all, handler{"Services", sw.services, services[i]}, handler{"EndpointSlices", sw.slices, slices[i]})
	}
	for _, h := range all {
		if h.informer == nil {
			continue // ServiceCIDRs without the API
		}
		reg, err := h.informer.AddEventHandler(h.funcs)
		if err != nil {
			return fmt.Errorf("watching %s: %w", h.what, err)
		}
		w.handlers = append(w.handlers, reg)
	}
	w.logger.Info("Watches connected", "scope", w.Scope())
	return nil
}

// resourceHandlers returns the handlers of each watch of one resource: the events
// themselves with a single watch, merged (a merger, returned) with several.
func (w *Watches) resourceHandlers(what string, get getFunc, changed, deleted func(any)) ([]cache.ResourceEventHandlerFuncs, *merger, error) {
	scope := w.Scope()
	if len(scope) == 1 {
		return []cache.ResourceEventHandlerFuncs{{
			AddFunc:    changed,
			UpdateFunc: func(_, obj any) { changed(obj) },
			DeleteFunc: deleted,
		}}, nil, nil
	}
	m, err := newMerger(what, scope, get, changed, deleted)
	if m != nil {
		m.logger = w.logger
	}
	if err != nil {
		return nil, nil, fmt.Errorf("watching %s: %w", what, err)
	}
	var out []cache.ResourceEventHandlerFuncs
	for i := range scope {
		out = append(out, m.handlers(i))
	}
	return out, m, nil
}

func (w *Watches) getService(ctx context.Context, namespace, name, rv string) (metav1.Object, error) {
	svc, err := w.client.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	_, _ = trimForCache(svc)
	return svc, nil
}

func (w *Watches) getSlice(ctx context.Context, namespace, name, rv string) (metav1.Object, error) {
	sl, err := w.client.DiscoveryV1().EndpointSlices(namespace).Get(ctx, name, metav1.GetOptions{ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	if _, headless := sl.Labels[labelHeadless]; headless {
		return nil, nil
	}
	_, _ = trimForCache(sl)
	return sl, nil
}

// Start runs the informers and waits until their caches are filled and Connect's
// handlers have passed the whole initial lists on, so the instances' first full syncs
// see every Service with its endpoints (a restart never drops rules that still apply;
// an informer's own HasSynced says only that its cache is full, while the handlers may
// still be thousands of events behind).
func (w *Watches) Start(ctx context.Context, timeout time.Duration) error {
	for _, m := range []*merger{w.serviceMerger, w.sliceMerger} {
		if m != nil {
			w.readers.Go(func() { m.run(ctx) })
		}
	}
	for _, f := range w.factories {
		f.Start(ctx.Done())
	}
	w.nodeFactory.Start(ctx.Done())
	if w.published != nil {
		w.published.factory.Start(ctx.Done())
	}
	syncCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	synced := []cache.InformerSynced{w.node.HasSynced}
	for _, sw := range w.watches() {
		sw.start(ctx)
		synced = append(synced, sw.services.HasSynced, sw.slices.HasSynced)
	}
	for _, h := range w.handlers {
		synced = append(synced, h.HasSynced)
	}
	if w.serviceCIDR != nil {
		synced = append(synced, w.serviceCIDR.HasSynced)
	}
	if w.published != nil {
		synced = append(synced, w.published.informer.HasSynced)
	}
	if !cache.WaitForCacheSync(syncCtx.Done(), synced...) {
		return fmt.Errorf("API caches did not fill within %s", timeout)
	}
	return nil
}

// Wait returns once what Start started has ended, after its context did: the
// informers and the mergers' reads (none delivers an event after it returns).
func (w *Watches) Wait() {
	for _, f := range w.factories {
		f.Shutdown()
	}
	for _, sw := range w.watches() {
		sw.shutdown()
	}
	w.nodeFactory.Shutdown()
	if w.published != nil {
		w.published.factory.Shutdown()
	}
	w.readers.Wait()
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

// nodeHandlers route this Node's events to onNode and other Nodes' address changes to
// onOtherNodes (a status update that leaves the addresses alone, most of them, is
// dropped here).
func (w *Watches) nodeHandlers(onNode NodeHandler, onOtherNodes func()) cache.ResourceEventHandlerFuncs {
	other := func(obj any) bool {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		n, ok := obj.(*corev1.Node)
		return ok && n.Name != w.nodeName
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if other(obj) {
				onOtherNodes()
				return
			}
			withNode(obj, false, onNode)
		},
		UpdateFunc: func(old, obj any) {
			if other(obj) {
				if o, n := old.(*corev1.Node), obj.(*corev1.Node); !slices.Equal(o.Status.Addresses, n.Status.Addresses) {
					onOtherNodes()
				}
				return
			}
			withNode(obj, false, onNode)
		},
		DeleteFunc: func(obj any) {
			if other(obj) {
				onOtherNodes()
				return
			}
			withNode(obj, true, onNode)
		},
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
