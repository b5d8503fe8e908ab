package supervisor

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
)

// RenderInput are the API objects Render reads: what a running supervisor's watches
// would hold.
type RenderInput struct {
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	// Nodes are this node (the one named by the configuration's nodeName, or the only
	// Node given) and the others, whose addresses no Service may take when
	// reserveOtherNodeAddresses is on (as run watches every Node then).
	Nodes []*corev1.Node
	// ServiceCIDRs are the cluster's ServiceCIDR objects, reserved as run reserves them.
	ServiceCIDRs []*networkingv1.ServiceCIDR
	// InterfaceAddrs lists this host's addresses (for CIDR nodePortAddresses, and
	// reserved as the node's own); nil is the host Render runs on, as run on the node.
	InterfaceAddrs func() ([]netip.Addr, error)
}

// Render computes, offline, the nft script an instance would load for the objects of in:
// the same code as a running supervisor, not a copy of its rules. The Services go
// through a selector.Dispatcher with a sink for every instance of the configuration
// (routing, tenant guards, and the node-wide address precedence: reserved addresses and
// claims of Services any instance serves), and the instance's sink is an
// instance.Proxy built from the same options as a running one (its size limit
// included) whose one full sync writes to knftables' fake. Problems are the lines a
// running supervisor would log and report as events, by Service in input order.
func Render(cfg *config.Config, instanceName string, in RenderInput) (script string, problems []string, err error) {
	router, specs, err := buildRouter(cfg)
	if err != nil {
		return "", nil, err
	}
	spec, ok := specs[instanceName]
	if !ok {
		return "", nil, fmt.Errorf("no instance %q in the configuration", instanceName)
	}
	node, err := renderNode(cfg.NodeName, in.Nodes)
	if err != nil {
		return "", nil, err
	}
	ifAddrs := in.InterfaceAddrs
	if ifAddrs == nil {
		ifAddrs = hostAddrs
	}
	rec := &renderRecorder{}
	host, err := ifAddrs()
	if err != nil {
		rec.general = append(rec.general, fmt.Sprintf("listing this host's addresses: %v; not reserved", err))
	}

	fakes := map[tables.Family]*knftables.Fake{}
	opts := instanceOptions(spec, tableConfigs{cfg: cfg, interfaceAddrs: ifAddrs, logger: klog.Background()}.forInstance(spec, node), cfg.NodeName, node)
	// Its problems are Render's to report, once each, not log lines on stderr (a logger
	// without a sink would be klog's).
	opts.Logger = funcr.New(func(string, string) {}, funcr.Options{})
	opts.NFT = func(fam tables.Family, table string) (knftables.Interface, error) {
		fakes[fam] = knftables.NewFake(tables.KnftFamily(fam), table)
		return fakes[fam], nil
	}
	proxy, err := instance.New(opts)
	if err != nil {
		return "", nil, err
	}

	rec.init(instanceName, in.Services)
	sinks := map[string]selector.Sink{}
	for name := range specs {
		sinks[name] = discardSink{}
	}
	sinks[instanceName] = &renderSink{Sink: proxy, rec: rec}
	bySvc := map[types.NamespacedName][]*discoveryv1.EndpointSlice{}
	for _, sl := range in.Slices {
		if name, ok := selector.ServiceOf(sl); ok {
			bySvc[name] = append(bySvc[name], sl)
		}
	}
	d := selector.NewDispatcher(router, sinks, func(namespace, service string) []*discoveryv1.EndpointSlice {
		return bySvc[types.NamespacedName{Namespace: namespace, Name: service}]
	}, selector.Events{Rejected: rec.rejected, Guarded: rec.guarded})

	var cidrs []string
	for _, sc := range in.ServiceCIDRs {
		cidrs = append(cidrs, sc.Spec.CIDRs...)
	}
	var others []selector.NodeIP
	if cfg.WatchesOtherNodes() {
		others = otherNodeIPs(in.Nodes, nodeName(node, cfg.NodeName))
	}
	r := reservedAddresses(cfg, node, host, cidrs, others)
	r.APIServerIPs = apiServerIPs(in.Slices)
	d.SetReserved(r)
	for _, svc := range in.Services {
		d.ServiceChanged(svc)
	}

	if _, err := proxy.Sync(context.Background(), true); err != nil {
		return "", nil, fmt.Errorf("rendering instance %q: %w", instanceName, err)
	}
	var out strings.Builder
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		if f := fakes[fam]; f != nil {
			out.WriteString(f.Dump())
		}
	}
	return out.String(), rec.lines(in.Services, proxy.Applied()), nil
}

// renderNode picks this node among nodes: the one named name, or the only one given (an
// audit's objects may come from a node whose name the local configuration does not
// carry). None given is no Node, as on a node whose Node object was not read yet.
func renderNode(name string, nodes []*corev1.Node) (*corev1.Node, error) {
	for _, n := range nodes {
		if n != nil && n.Name == name {
			return n, nil
		}
	}
	switch len(nodes) {
	case 0:
		return nil, nil
	case 1:
		return nodes[0], nil
	}
	return nil, fmt.Errorf("%d Nodes given and none is this node %q (the configuration's nodeName)", len(nodes), name)
}

// nodeName is the name of this node: its Node object's, else the configuration's.
func nodeName(node *corev1.Node, name string) string {
	if node != nil {
		return node.Name
	}
	return name
}

// discardSink is an instance Render does not render: the Dispatcher still routes
// Services to it, so that they claim their addresses as they do on the node.
type discardSink struct{}

var _ selector.Sink = discardSink{}

// closed is the channel of a Service programmed at once.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (discardSink) UpdateService(*corev1.Service) <-chan struct{}  { return closed }
func (discardSink) DeleteService(types.NamespacedName)             {}
func (discardSink) UpdateEndpointSlice(*discoveryv1.EndpointSlice) {}
func (discardSink) DeleteEndpointSlice(*discoveryv1.EndpointSlice) {}

// renderSink is the rendered instance's sink: its instance, and the refusals it was last
// given each Service with.
type renderSink struct {
	selector.Sink
	rec *renderRecorder
}

func (s *renderSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	s.rec.delivered(svc)
	return s.Sink.UpdateService(svc)
}

// renderRecorder gathers what the Dispatcher reports. The Dispatcher reports a refusal
// when it changes and is not empty, right before it gives the instance that version of
// the Service: a version given without a report keeps the last refusal, unless it kept
// every address (the refusal ended).
type renderRecorder struct {
	mu       sync.Mutex
	instance string
	original map[types.NamespacedName]*corev1.Service
	// rejections are the label's refusals; pending the refusals reported for the version
	// about to be delivered; refused those of the version delivered last.
	rejections       map[types.NamespacedName]string
	pending, refused map[types.NamespacedName][]string
	// general are problems of no one Service.
	general []string
}

func (r *renderRecorder) init(inst string, svcs []*corev1.Service) {
	r.instance = inst
	r.original = map[types.NamespacedName]*corev1.Service{}
	for _, svc := range svcs {
		r.original[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = svc
	}
	r.rejections = map[types.NamespacedName]string{}
	r.pending = map[types.NamespacedName][]string{}
	r.refused = map[types.NamespacedName][]string{}
}

func (r *renderRecorder) rejected(svc *corev1.Service, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejections[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = why
}

func (r *renderRecorder) guarded(svc *corev1.Service, inst string, problems []string) {
	if inst != r.instance {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = problems
}

func (r *renderRecorder) delivered(svc *corev1.Service) {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pending[name]; ok {
		r.refused[name] = p
		delete(r.pending, name)
		return
	}
	if orig := r.original[name]; orig != nil && len(orig.Spec.ExternalIPs) == len(svc.Spec.ExternalIPs) &&
		len(orig.Status.LoadBalancer.Ingress) == len(svc.Status.LoadBalancer.Ingress) {
		delete(r.refused, name)
	}
}

// lines are the problems, by Service in input order: the label's refusal, the refused
// addresses, then the instance's problems with the model it programmed (or its refusal
// of the whole Service).
func (r *renderRecorder) lines(svcs []*corev1.Service, applied map[types.NamespacedName]*instance.ServiceModel) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]string(nil), r.general...)
	for _, svc := range svcs {
		name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		var of []string
		if why := r.rejections[name]; why != "" {
			of = append(of, why)
		}
		of = append(of, r.refused[name]...)
		if m := applied[name]; m != nil {
			of = append(of, m.Problems...)
			if m.Refused != "" {
				of = append(of, m.Refused)
			}
		}
		for _, p := range of {
			out = append(out, fmt.Sprintf("%s/%s: %s", svc.Namespace, svc.Name, p))
		}
	}
	return out
}
