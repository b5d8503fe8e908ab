// Package instance turns Kubernetes Services and EndpointSlices into the plain model the
// nftables compiler consumes (tables.ServicePort), one IP family at a time, and tracks
// which Services need their model rebuilt.
package instance

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"

	"github.com/shardproxy/shardproxy/tables"
)

const (
	// defaultAffinityTimeout is what the apiserver defaults
	// sessionAffinityConfig.clientIP.timeoutSeconds to.
	defaultAffinityTimeout = 10800 * time.Second
	// maxAffinityTimeoutSeconds is the largest timeout the apiserver accepts.
	maxAffinityTimeoutSeconds = 86400

	// DefaultMaxServiceElements is the default of Options.MaxServiceElements, in cost
	// units (kernelCost). Legitimate big Services fit with room to spare (5,000 endpoints
	// on 6 ports with 6 dispatch addresses each is about 185,000; a ClientIP-affinity
	// Service up to about 900 endpoint ports), a 1,000-port × 1,000-endpoint one, a
	// 120-port × 120-endpoint affinity one or one with 25,000 source-range elements does
	// not. 200,000 units are ~2.6 s of nft and kernel time on a loaded 2-core machine.
	DefaultMaxServiceElements = 200_000
	// DefaultMaxInstanceCost is the default of Options.MaxInstanceCost, in cost units:
	// about 100,000 Services × 5 endpoints with 2% of them ClientIP affinity (make
	// bench's mix, ~3.7 million) fit.
	DefaultMaxInstanceCost = 4_000_000

	// Cost weights: what one object costs nft and the kernel to load, relative to one
	// set or map element (1 unit, ~13 µs of wall time through nft -f). Measured with nft
	// 1.0.6 in a fresh network namespace (issue 36; tables/README.md, "Size limits").
	//
	// ruleUnits: 20,000 rules load in 0.55 s, 20,000 elements in 0.26 s.
	ruleUnits = 4
	// affinitySetUnits is a ClientIP-affinity set with the three references its rules
	// make to it. The kernel keeps a table's sets in a list it searches by name, on the
	// set's creation and on each reference, so a set costs in proportion to the sets of
	// its table: 1,614 sets (and their rules) took 0.39 s, 6,414 5.0 s, 14,414 27.4 s
	// (~1.3e-7 s × sets²). The weight is a set's cost when its table holds as many sets
	// as DefaultMaxInstanceCost admits (~20,000 of them: ~2.6 ms each, ~200 units), so
	// that the units of an instance at its limit bound its full sync's time.
	affinitySetUnits = 200
	// sourceRangeUnits is one loadBalancerSourceRanges element (firewall-allow, an
	// interval set of concatenations, the kernel's pipapo): each insertion rebuilds
	// lookup tables as large as the set, so 5,000 took 0.67 s, 10,000 2.8 s, 20,000 9.1 s
	// (~2.3e-8 s × elements²); weighted, as the sets, at the count the instance limit
	// admits (~45,000: ~1.1 ms each).
	sourceRangeUnits = 88
)

// NodeInfo is what endpoint selection needs to know about this node.
type NodeInfo struct {
	// Name is this node's name; an endpoint is local when its nodeName equals it.
	Name string
	// Labels are the Node's labels; the zone is topology.kubernetes.io/zone.
	Labels map[string]string
}

// zone is the node's topology zone, empty when it has none.
func (n NodeInfo) zone() string {
	return n.Labels[corev1.LabelTopologyZone]
}

// ServiceModel is one Service turned into the compiler's model.
type ServiceModel struct {
	Name types.NamespacedName
	// Ports holds the service ports of each family (tables.IPv4 / tables.IPv6); a family
	// the Service has no cluster IP in is absent. A present family's list is empty when
	// every port of the Service was skipped.
	Ports map[tables.Family][]*tables.ServicePort
	// HealthCheckNodePort is .spec.healthCheckNodePort for LoadBalancer Services with
	// externalTrafficPolicy Local, else 0.
	HealthCheckNodePort int32
	// LocalEndpoints is, per IP family, the number of distinct ready endpoints on this node
	// (what the health-check node port reports in that family, as upstream's per-family
	// proxiers each report their own). It counts addresses, not ports.
	LocalEndpoints LocalEndpoints
	// Problems lists each item that was skipped (bad IP, unknown port name, out-of-range
	// value...), one human-readable line each.
	Problems []string
	// Refused, when set, says why the instance refused the Service: it is not programmed
	// at all (Ports is empty), and every other Service is.
	Refused string
	// Unmatched lists the EndpointSlice ports (name/protocol) that match no port of the
	// Service, skipped. They are logged but not reported as problems (events): they are
	// normal for the moment between a Service's ports changing and its slices following.
	Unmatched []string
}

// LocalEndpoints counts a Service's distinct ready endpoints on this node, per IP family.
type LocalEndpoints struct {
	IPv4, IPv6 int
}

// set sets fam's count.
func (l *LocalEndpoints) set(fam tables.Family, n int) {
	if fam == tables.IPv6 {
		l.IPv6 = n
	} else {
		l.IPv4 = n
	}
}

// Build turns one Service and its EndpointSlices into a ServiceModel. It returns nil for
// Services that get no rules (headless, ExternalName, no cluster IP). A Service whose
// cluster IPs are all malformed gets a model with no Ports, so its Problems can still be
// reported. slices are the Service's EndpointSlices; their labels are not checked. Build
// does not modify its arguments.
//
// Every Service gets random load balancing; LoadBalancing.Build honours an instance's
// load-balancing settings.
func Build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo) *ServiceModel {
	return build(svc, slices, node, LoadBalancing{})
}

func build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo, lb LoadBalancing) *ServiceModel {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	b := &builder{
		svc:  svc,
		node: node,
		lb:   lb,
		model: &ServiceModel{
			Name: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name},
		},
	}
	clusterIPs, ok := b.clusterIPs()
	if !ok {
		return nil
	}
	if len(clusterIPs) == 0 {
		return b.model
	}
	b.build(clusterIPs, sortedSlices(slices))
	return b.model
}

// kernelCost is what one Service brings into one family's table: set and map elements,
// loadBalancerSourceRanges elements (of the interval set firewall-allow, counted apart
// from elements), rules and ClientIP-affinity sets.
type kernelCost struct {
	elements, ranges, rules, sets int
}

// units weighs c by what each object costs the kernel (ruleUnits, affinitySetUnits,
// sourceRangeUnits; an element is one unit).
func (c kernelCost) units() int {
	return c.elements + sourceRangeUnits*c.ranges + ruleUnits*c.rules + affinitySetUnits*c.sets
}

// String says what the units are made of, for the refusal's message.
func (c kernelCost) String() string {
	return fmt.Sprintf("%d cost units: %d elements, %d source-range elements, %d rules, %d affinity sets",
		c.units(), c.elements, c.ranges, c.rules, c.sets)
}

// costEstimate bounds what svc with its EndpointSlices brings into one family's table
// (the family that costs more units), read from the objects without building the
// model, so that refusing a Service too large to program costs little.
// TestCostEstimate holds it against what a full sync writes.
//
// Elements: a port has an entry per dispatch address: the cluster IP, each external
// and load-balancer IP and, with a node port, each of the family's nodePortAddrs. Per
// entry and port there is a dispatch element; per external entry and port also the
// mark of its traffic policy, with a Local external policy the short circuit's
// dispatch, and, where entries reach the cluster IP's endpoints through it
// (roundRobin, consistentHash, ClientIP affinity), the two elements that rewrite the
// destination. The endpoint elements are one per endpoint and port for every entry
// (and for the short circuit of a Local external policy), so entries × the slices'
// endpoint-port pairs; under consistentHash a table per port
// (tables.ConsistentTableSize of its endpoints) instead, held by the cluster IP entry
// alone unless a Local traffic policy gives other entries endpoints of their own; under
// roundRobin also the shared picks. Then the cluster IP's element, a hairpin element per
// endpoint, and per load-balancer IP and port the loadBalancerSourceRanges firewall:
// two elements and one range element per range.
//
// Rules: the pick chains of each endpoint count (three rules, one per protocol, shared
// by the Services with as many endpoints, counted for each port and class of endpoints
// (internal, external, the Local short circuit)); under roundRobin the rotation's three
// per endpoint and class; where entries reach the cluster IP's endpoints through it, the
// rewrites (three per class); with ClientIP affinity, per port, two per endpoint and class
// (one that sends a remembered client back, one that places a new one) and the
// rewrites of the cluster IP bucket. Sets: with ClientIP affinity, one per endpoint and
// port.
func costEstimate(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, nodePortAddrs map[tables.Family]int, mode tables.LBMode) kernelCost {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return kernelCost{}
	}
	entries, lbIPs := dispatchEntries(svc, nodePortAddrs)
	shape := newCostShape(svc, mode)
	var largest kernelCost
	for f, n := range entries {
		if c := shape.familyCost(n, lbIPs[f], countEndpoints(epSlices, f)); c.units() > largest.units() {
			largest = c
		}
	}
	return largest
}

// dispatchEntries counts, per family with a cluster IP, svc's dispatch addresses (the
// cluster IP, the external and load-balancer IPs and, with a node port, the family's
// nodePortAddrs), and among them the load-balancer IPs. A family without a cluster IP
// has no entries: it gets no rules.
func dispatchEntries(svc *corev1.Service, nodePortAddrs map[tables.Family]int) (entries, lbIPs map[tables.Family]int) {
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	entries, lbIPs = map[tables.Family]int{}, map[tables.Family]int{}
	for _, s := range clusterIPs {
		if a, ok := parseIP(s); ok {
			entries[familyOf(a)] = 1
		}
	}
	count := func(s string) bool {
		if a, ok := parseIP(s); ok && entries[familyOf(a)] > 0 {
			entries[familyOf(a)]++
			return true
		}
		return false
	}
	for _, s := range svc.Spec.ExternalIPs {
		count(s)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if a, ok := parseIP(ing.IP); ok && count(ing.IP) {
				lbIPs[familyOf(a)]++
			}
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer || svc.Spec.Type == corev1.ServiceTypeNodePort {
		if slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.NodePort != 0 }) {
			for f := range entries {
				entries[f] += nodePortAddrs[f]
			}
		}
	}
	return entries, lbIPs
}

// endpointCounts is what a family's EndpointSlices hold, as costEstimate counts it.
type endpointCounts struct {
	// pairs are the endpoint-port pairs; endpoints the endpoints.
	pairs, endpoints int
	// perPort is the endpoints per slice port name (consistentHash's tables).
	perPort map[string]int
}

// countEndpoints counts the endpoints and endpoint-port pairs of family f's slices.
func countEndpoints(epSlices []*discoveryv1.EndpointSlice, f tables.Family) endpointCounts {
	c := endpointCounts{perPort: map[string]int{}}
	for _, sl := range epSlices {
		if sl == nil || sl.AddressType != addressType(f) {
			continue
		}
		c.pairs += len(sl.Ports) * len(sl.Endpoints)
		c.endpoints += len(sl.Endpoints)
		for _, p := range sl.Ports {
			c.perPort[ptrOr(p.Name)] += len(sl.Endpoints)
		}
	}
	return c
}

// costShape is what of a Service, besides its addresses and endpoints, decides its
// cost.
type costShape struct {
	mode tables.LBMode
	// ports are the Service's ports; sourceRanges its loadBalancerSourceRanges.
	ports, sourceRanges int
	// extLocal: the external traffic policy is Local; localPolicy: either policy is.
	extLocal, localPolicy bool
	affinity              bool
	// viaClusterIP: entries other than the cluster IP reach its endpoints through it
	// (roundRobin, consistentHash, ClientIP affinity).
	viaClusterIP bool
	// classes are the sets of endpoints a port chooses among: internal, and with a Local
	// policy external and the short circuit.
	classes int
}

func newCostShape(svc *corev1.Service, mode tables.LBMode) costShape {
	affinity := svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP
	s := costShape{
		mode:         mode,
		ports:        len(svc.Spec.Ports),
		sourceRanges: len(svc.Spec.LoadBalancerSourceRanges),
		extLocal:     externalPolicyLocal(svc),
		localPolicy:  hasLocalPolicy(svc),
		affinity:     affinity,
		viaClusterIP: mode == tables.LBRoundRobin || mode == tables.LBConsistentHash || affinity,
		classes:      1,
	}
	if s.localPolicy {
		s.classes = 3
	}
	return s
}

// familyCost is the cost in one family's table of n entries, lbIPs of them
// load-balancer IPs, over the family's endpoints eps.
func (s costShape) familyCost(n, lbIPs int, eps endpointCounts) kernelCost {
	ext := n - 1
	c := kernelCost{
		elements: 1 + eps.endpoints + s.ports*s.dispatchElements(ext) + s.endpointElements(n, ext, eps) + lbIPs*s.ports*2,
		ranges:   lbIPs * s.ports * s.sourceRanges,
		rules:    s.rules(ext, eps.pairs),
	}
	if s.affinity {
		c.sets = eps.pairs
	}
	return c
}

// dispatchElements are a port's dispatch elements with ext external entries besides
// the cluster IP's: one per entry, a policy mark per external one, with a Local
// external policy the short circuit's dispatch, and the two that rewrite the
// destination to the cluster IP where entries go through it.
func (s costShape) dispatchElements(ext int) int {
	dispatch := 1 + ext + ext
	if s.extLocal {
		dispatch += ext
	}
	if s.viaClusterIP {
		dispatch += 2 * ext
	}
	return dispatch
}

// endpointElements are the endpoint elements of n entries (ext external): one per
// endpoint-port pair for every entry with endpoints of its own (and the short circuit
// of a Local external policy); under consistentHash a table per port instead, the
// cluster IP entry's alone without a Local policy; under roundRobin also the shared
// picks.
func (s costShape) endpointElements(n, ext int, eps endpointCounts) int {
	own := n
	if s.extLocal {
		own += ext
	}
	switch s.mode {
	case tables.LBConsistentHash:
		table := 0
		for _, k := range eps.perPort {
			table += tables.ConsistentTableSize(k)
		}
		if !s.localPolicy {
			own = 1
		}
		return own * table
	case tables.LBRoundRobin:
		return own*eps.pairs + 2*eps.pairs
	default:
		return own * eps.pairs
	}
}

// rules are the rules of ext external entries over pairs endpoint-port pairs: the
// pick chains (three per port and class), roundRobin's rotation (three per pair and
// class), the rewrites to the cluster IP (three per class), and ClientIP affinity's
// two per pair and class and two per port.
func (s costShape) rules(ext, pairs int) int {
	rules := 3 * s.ports * s.classes
	if s.mode == tables.LBRoundRobin {
		rules += 3 * pairs * s.classes
	}
	if s.viaClusterIP && ext > 0 {
		rules += 3 * s.classes
	}
	if s.affinity {
		rules += 2*pairs*s.classes + 2*s.ports
	}
	return rules
}

// ptrOr returns *p, or "" for nil.
func ptrOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// hasLocalPolicy reports whether svc's external or internal traffic policy is Local
// (externalPolicyLocal, internalPolicyLocal): the one place the model reads them.
func hasLocalPolicy(svc *corev1.Service) bool {
	return externalPolicyLocal(svc) || internalPolicyLocal(svc)
}

// internalPolicyLocal reports whether internalTrafficPolicy is Local.
func internalPolicyLocal(svc *corev1.Service) bool {
	return svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
}

// builder holds the state of one Build call.
type builder struct {
	svc   *corev1.Service
	node  NodeInfo
	lb    LoadBalancing
	model *ServiceModel
}

// unmatched records the slice ports of family f that no Service port takes.
func (b *builder) unmatched(f tables.Family, byPort map[portKey][]*endpoint, ports []servicePort) {
	var out []string
	for key := range byPort {
		if !slices.ContainsFunc(ports, func(p servicePort) bool { return p.name == key.name && p.protocol == key.protocol }) {
			out = append(out, fmt.Sprintf("%s EndpointSlice port %q/%s", f, key.name, key.protocol))
		}
	}
	slices.Sort(out)
	b.model.Unmatched = append(b.model.Unmatched, out...)
}

// problem records one skipped item.
func (b *builder) problem(format string, args ...any) {
	b.model.Problems = append(b.model.Problems, fmt.Sprintf(format, args...))
}

// familyOf returns the family addr belongs to; addr must be valid and unmapped.
func familyOf(addr netip.Addr) tables.Family {
	if addr.Is4() {
		return tables.IPv4
	}
	return tables.IPv6
}

// addressType is the EndpointSlice address type holding a family's endpoints.
func addressType(f tables.Family) discoveryv1.AddressType {
	if f == tables.IPv6 {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// clusterIPs returns the Service's cluster IP of each family. ok is false when the
// Service gets no rules at all (headless or no cluster IP).
func (b *builder) clusterIPs() (ips map[tables.Family]netip.Addr, ok bool) {
	field, list := "spec.clusterIPs", b.svc.Spec.ClusterIPs
	if len(list) == 0 {
		// Objects written before dual stack, or by hand, may only carry the legacy field.
		field, list = "spec.clusterIP", nil
		if b.svc.Spec.ClusterIP != "" {
			list = []string{b.svc.Spec.ClusterIP}
		}
	}
	if len(list) == 0 || b.svc.Spec.ClusterIP == corev1.ClusterIPNone || slices.Contains(list, corev1.ClusterIPNone) {
		return nil, false
	}
	ips = map[tables.Family]netip.Addr{}
	for i, s := range list {
		addr, valid := parseIP(s)
		if !valid {
			b.problem("%s[%d]: %q is not an IP address", field, i, s)
			continue
		}
		f := familyOf(addr)
		if prev, dup := ips[f]; dup {
			b.problem("%s[%d]: %s is a second %s cluster IP after %s; ignored", field, i, addr, f, prev)
			continue
		}
		ips[f] = addr
	}
	return ips, true
}

// build fills b.model for every family the Service has a cluster IP in.
func (b *builder) build(clusterIPs map[tables.Family]netip.Addr, epSlices []*discoveryv1.EndpointSlice) {
	spec := &b.svc.Spec
	isLB := spec.Type == corev1.ServiceTypeLoadBalancer
	hasNodePorts := isLB || spec.Type == corev1.ServiceTypeNodePort

	externalIPs := b.addresses("spec.externalIPs", spec.ExternalIPs)
	var lbIPs map[tables.Family][]netip.Addr
	var sourceRanges map[tables.Family][]netip.Prefix
	if isLB {
		lbIPs = b.loadBalancerIPs()
		sourceRanges = b.sourceRanges()
	}
	common := tables.ServicePort{
		InternalLocal:   internalPolicyLocal(b.svc),
		ExternalLocal:   externalPolicyLocal(b.svc),
		AffinityTimeout: b.affinityTimeout(),
		Claim:           tables.Claim{Created: b.svc.CreationTimestamp.Time, UID: string(b.svc.UID)},
	}
	mode, refused := b.lb.modeOf(b.svc)
	if refused != "" {
		b.problem("%s", refused)
	}
	common.LoadBalancing = mode
	if isLB && common.ExternalLocal {
		b.model.HealthCheckNodePort = b.healthCheckNodePort()
	}
	ports := b.servicePorts(hasNodePorts)

	b.model.Ports = map[tables.Family][]*tables.ServicePort{}
	// A fixed family order keeps Problems in a stable order.
	for _, f := range []tables.Family{tables.IPv4, tables.IPv6} {
		clusterIP, ok := clusterIPs[f]
		if !ok {
			continue
		}
		byPort := b.endpoints(f, epSlices)
		b.unmatched(f, byPort, ports)
		list := []*tables.ServicePort{}
		localIPs := map[netip.Addr]bool{}
		for _, p := range ports {
			sp := common
			sp.Name = tables.ServicePortName{
				Namespace: b.svc.Namespace,
				Name:      b.svc.Name,
				Port:      p.name,
				Protocol:  p.protocol,
			}
			sp.Protocol = p.protocol
			sp.Port = p.port
			sp.NodePort = p.nodePort
			sp.ClusterIP = clusterIP
			sp.ExternalIPs = slices.Clone(externalIPs[f])
			sp.LoadBalancerIPs = slices.Clone(lbIPs[f])
			sp.SourceRanges = slices.Clone(sourceRanges[f])

			eps := byPort[portKey{name: p.name, protocol: p.protocol}]
			sp.ClusterEndpoints, sp.LocalEndpoints, sp.HasEndpoints = categorize(eps, b.node)
			for _, ep := range eps {
				if ep.ready && ep.local {
					localIPs[ep.IP] = true
				}
			}
			list = append(list, &sp)
		}
		b.model.Ports[f] = list
		b.model.LocalEndpoints.set(f, len(localIPs))
	}
}

// externalPolicyLocal reports whether externalTrafficPolicy Local applies: as upstream,
// only Services reachable from outside the cluster have external traffic at all.
func externalPolicyLocal(svc *corev1.Service) bool {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer && svc.Spec.Type != corev1.ServiceTypeNodePort && len(svc.Spec.ExternalIPs) == 0 {
		return false
	}
	return svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// affinityTimeout returns the ClientIP affinity timeout, zero for no affinity.
func (b *builder) affinityTimeout() time.Duration {
	switch b.svc.Spec.SessionAffinity {
	case corev1.ServiceAffinityClientIP:
	case corev1.ServiceAffinityNone, "":
		return 0
	default:
		b.problem("spec.sessionAffinity: unknown value %q; no affinity", b.svc.Spec.SessionAffinity)
		return 0
	}
	cfg := b.svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return defaultAffinityTimeout
	}
	secs := *cfg.ClientIP.TimeoutSeconds
	if secs <= 0 || secs > maxAffinityTimeoutSeconds {
		b.problem("spec.sessionAffinityConfig.clientIP.timeoutSeconds: %d is out of range (1-%d); using %d",
			secs, maxAffinityTimeoutSeconds, int(defaultAffinityTimeout/time.Second))
		return defaultAffinityTimeout
	}
	return time.Duration(secs) * time.Second
}

// healthCheckNodePort returns .spec.healthCheckNodePort when it is a usable port.
func (b *builder) healthCheckNodePort() int32 {
	p := b.svc.Spec.HealthCheckNodePort
	if p <= 0 || p > 65535 {
		// Zero means the apiserver has not allocated one (or a hand-written object).
		b.problem("spec.healthCheckNodePort: %d is out of range (1-65535); no health check", p)
		return 0
	}
	return p
}

// addresses parses a list of IPs into families, dropping duplicates.
func (b *builder) addresses(field string, list []string) map[tables.Family][]netip.Addr {
	out := map[tables.Family][]netip.Addr{}
	for i, s := range list {
		addr, ok := parseIP(s)
		if !ok {
			b.problem("%s[%d]: %q is not an IP address", field, i, s)
			continue
		}
		f := familyOf(addr)
		if !slices.Contains(out[f], addr) {
			out[f] = append(out[f], addr)
		}
	}
	return out
}

// loadBalancerIPs returns the VIP-mode ingress IPs of each family. Proxy-mode ingress
// delivers packets addressed to the node or pod, not to the LB IP, so no rule may
// capture that IP.
func (b *builder) loadBalancerIPs() map[tables.Family][]netip.Addr {
	out := map[tables.Family][]netip.Addr{}
	for i, ing := range b.svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress: the LB comes in through NodePorts
		}
		if ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP {
			if *ing.IPMode != corev1.LoadBalancerIPModeProxy {
				b.problem("status.loadBalancer.ingress[%d].ipMode: unknown value %q; %s ignored", i, *ing.IPMode, ing.IP)
			}
			continue
		}
		addr, ok := parseIP(ing.IP)
		if !ok {
			b.problem("status.loadBalancer.ingress[%d].ip: %q is not an IP address", i, ing.IP)
			continue
		}
		f := familyOf(addr)
		if !slices.Contains(out[f], addr) {
			out[f] = append(out[f], addr)
		}
	}
	return out
}

// sourceRanges parses .spec.loadBalancerSourceRanges into families.
func (b *builder) sourceRanges() map[tables.Family][]netip.Prefix {
	out := map[tables.Family][]netip.Prefix{}
	for i, s := range b.svc.Spec.LoadBalancerSourceRanges {
		p, ok := parsePrefix(s)
		if !ok {
			b.problem("spec.loadBalancerSourceRanges[%d]: %q is not a CIDR", i, s)
			continue
		}
		f := familyOf(p.Addr())
		if !slices.Contains(out[f], p) {
			out[f] = append(out[f], p)
		}
	}
	return out
}

// servicePort is one usable entry of .spec.ports.
type servicePort struct {
	name     string
	protocol tables.Protocol
	port     uint16
	nodePort uint16
}

// portKey is how EndpointSlice ports are matched to Service ports: the EndpointSlice
// controller copies the Service port's name and protocol and resolves targetPort itself.
type portKey struct {
	name     string
	protocol tables.Protocol
}

// servicePorts returns the usable .spec.ports in spec order.
func (b *builder) servicePorts(hasNodePorts bool) []servicePort {
	var out []servicePort
	names := map[portKey]bool{}
	type numKey struct {
		port     uint16
		protocol tables.Protocol
	}
	numbers := map[numKey]bool{}
	nodePorts := map[numKey]bool{}
	for i, p := range b.svc.Spec.Ports {
		field := fmt.Sprintf("spec.ports[%d]", i)
		proto, ok := protocol(p.Protocol)
		if !ok {
			b.problem("%s.protocol: unsupported protocol %q; port skipped", field, p.Protocol)
			continue
		}
		if p.Port <= 0 || p.Port > 65535 {
			b.problem("%s.port: %d is out of range (1-65535); port skipped", field, p.Port)
			continue
		}
		// Duplicates would make the compiler emit the same map key twice, which fails
		// the whole transaction; the apiserver rejects them, hand-written objects may not.
		key := portKey{name: p.Name, protocol: proto}
		if names[key] {
			b.problem("%s: duplicate port name %q for %s; port skipped", field, p.Name, proto)
			continue
		}
		num := numKey{port: uint16(p.Port), protocol: proto}
		if numbers[num] {
			b.problem("%s: duplicate port %d/%s; port skipped", field, p.Port, proto)
			continue
		}
		names[key], numbers[num] = true, true
		sp := servicePort{name: p.Name, protocol: proto, port: uint16(p.Port)}
		if hasNodePorts && p.NodePort != 0 {
			np := numKey{port: uint16(p.NodePort), protocol: proto}
			switch {
			case p.NodePort < 0 || p.NodePort > 65535:
				b.problem("%s.nodePort: %d is out of range (1-65535); no node port", field, p.NodePort)
			case nodePorts[np]:
				b.problem("%s.nodePort: duplicate node port %d/%s; no node port", field, p.NodePort, proto)
			default:
				nodePorts[np] = true
				sp.nodePort = uint16(p.NodePort)
			}
		}
		out = append(out, sp)
	}
	return out
}

// protocol maps a Kubernetes protocol to the model's; empty is the API default, TCP.
func protocol(p corev1.Protocol) (tables.Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return tables.TCP, true
	case corev1.ProtocolUDP:
		return tables.UDP, true
	case corev1.ProtocolSCTP:
		return tables.SCTP, true
	}
	return "", false
}

// backend is one entry of an EndpointSlice, before it is paired with a port.
type backend struct {
	ip          netip.Addr
	local       bool
	ready       bool
	serving     bool
	terminating bool
	zoneHints   []string
	nodeHints   []string
}

// servingTerminating reports whether the backend may be used as a fallback while no
// ready one exists: it is shutting down but still answers.
func (e *backend) servingTerminating() bool {
	return e.serving && e.terminating
}

// endpoint is one backend serving one Service port.
type endpoint struct {
	tables.Endpoint
	*backend
}

// better reports whether e is a more useful copy of the same IP and port than o.
// Duplicates show up while an endpoint moves between slices; upstream keeps an arbitrary
// copy (preferring a local one), we also prefer the more usable one so a stale copy
// cannot hide a ready endpoint.
func (e *endpoint) better(o *endpoint) bool {
	rank := func(x *endpoint) [3]bool { return [3]bool{x.local, x.ready, x.servingTerminating()} }
	re, ro := rank(e), rank(o)
	for i := range re {
		if re[i] != ro[i] {
			return re[i]
		}
	}
	return false
}

// endpoints collects the endpoints of family f from the slices of that address type,
// grouped by the Service port they serve, deduplicated and sorted by IP then port.
func (b *builder) endpoints(f tables.Family, list []*discoveryv1.EndpointSlice) map[portKey][]*endpoint {
	sets := map[portKey]map[tables.Endpoint]*endpoint{}
	for _, slice := range list {
		if slice.AddressType != addressType(f) {
			continue // FQDN slices and the other family
		}
		field := fmt.Sprintf("endpointslice %s", slice.Name)
		backends := b.backends(field, f, slice)
		for i, sp := range slice.Ports {
			// nil name and protocol are what the apiserver defaults to "" and TCP.
			key := portKey{protocol: tables.TCP}
			if sp.Name != nil {
				key.name = *sp.Name
			}
			if sp.Protocol != nil {
				proto, ok := protocol(*sp.Protocol)
				if !ok {
					b.problem("%s: ports[%d].protocol: unsupported protocol %q; port skipped", field, i, *sp.Protocol)
					continue
				}
				key.protocol = proto
			}
			if sp.Port == nil {
				b.problem("%s: ports[%d] (%q) has no port number; port skipped", field, i, key.name)
				continue
			}
			if *sp.Port <= 0 || *sp.Port > 65535 {
				b.problem("%s: ports[%d].port: %d is out of range (1-65535); port skipped", field, i, *sp.Port)
				continue
			}
			set := sets[key]
			if set == nil {
				set = map[tables.Endpoint]*endpoint{}
				sets[key] = set
			}
			for _, be := range backends {
				e := &endpoint{Endpoint: tables.Endpoint{IP: be.ip, Port: uint16(*sp.Port)}, backend: be}
				if prev, dup := set[e.Endpoint]; !dup || e.better(prev) {
					set[e.Endpoint] = e
				}
			}
		}
	}
	out := make(map[portKey][]*endpoint, len(sets))
	for key, set := range sets {
		eps := make([]*endpoint, 0, len(set))
		for _, e := range set {
			eps = append(eps, e)
		}
		slices.SortFunc(eps, func(x, y *endpoint) int {
			return cmp.Or(x.IP.Compare(y.IP), cmp.Compare(x.Port, y.Port))
		})
		out[key] = eps
	}
	return out
}

// backends parses the endpoints of one slice of family f.
func (b *builder) backends(field string, f tables.Family, slice *discoveryv1.EndpointSlice) []*backend {
	var out []*backend
	for i := range slice.Endpoints {
		ep := &slice.Endpoints[i]
		if len(ep.Addresses) == 0 {
			b.problem("%s: endpoints[%d] has no address; skipped", field, i)
			continue
		}
		// Every address of an endpoint is the same backend; like upstream, use the first.
		ip, ok := parseIP(ep.Addresses[0])
		if !ok {
			b.problem("%s: endpoints[%d].addresses[0]: %q is not an IP address; skipped", field, i, ep.Addresses[0])
			continue
		}
		if familyOf(ip) != f {
			b.problem("%s: endpoints[%d].addresses[0]: %s is not an %s address; skipped", field, i, ip, f)
			continue
		}
		c := ep.Conditions
		be := &backend{
			ip:    ip,
			local: b.node.Name != "" && ep.NodeName != nil && *ep.NodeName == b.node.Name,
			// nil conditions read the way the EndpointSlice API defines them.
			ready:       c.Ready == nil || *c.Ready,
			serving:     c.Serving == nil || *c.Serving,
			terminating: c.Terminating != nil && *c.Terminating,
		}
		if ep.Hints != nil {
			for _, z := range ep.Hints.ForZones {
				be.zoneHints = append(be.zoneHints, z.Name)
			}
			for _, n := range ep.Hints.ForNodes {
				be.nodeHints = append(be.nodeHints, n.Name)
			}
		}
		out = append(out, be)
	}
	return out
}

// topologyMode says how cluster endpoints are narrowed by hints.
type topologyMode int

const (
	// topologyNone uses every ready endpoint.
	topologyNone topologyMode = iota
	// topologySameNode uses the endpoints hinted for this node.
	topologySameNode
	// topologySameZone uses the endpoints hinted for this node's zone.
	topologySameZone
)

// modeFromHints picks the topology mode the hints allow. As upstream (pkg/proxy's
// topologyModeFromHints since PreferSameTrafficDistribution went GA), the Service's
// trafficDistribution and topology annotations are not read here: the EndpointSlice
// controller only writes hints for Services that ask for them, so hints are honoured
// wherever they are. They are only trusted when every ready endpoint carries them
// (otherwise the controller is mid-update or the hints are hand-made) and at least one
// ready endpoint is meant for us, so filtering can never leave this node without an
// endpoint. Node hints win over zone hints.
func modeFromHints(eps []*endpoint, nodeName, zone string) topologyMode {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for _, e := range eps {
		if !e.ready {
			continue
		}
		anyReady = true
		if len(e.nodeHints) == 0 {
			allNode = false
		} else if slices.Contains(e.nodeHints, nodeName) {
			forNode = true
		}
		if len(e.zoneHints) == 0 {
			allZone = false
		} else if slices.Contains(e.zoneHints, zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

// availableFor reports whether e may be used from this node under mode.
func (e *endpoint) availableFor(mode topologyMode, nodeName, zone string) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.nodeHints, nodeName)
	case topologySameZone:
		return slices.Contains(e.zoneHints, zone)
	}
	return true
}

// categorize splits one port's endpoints into the cluster and local sets, each in an
// array of its length: the models keep them for every Service port (grown by append, a
// 10-endpoint list took room for 16).
func categorize(eps []*endpoint, node NodeInfo) (cluster, local []tables.Endpoint, has bool) {
	zone := node.zone()
	mode := modeFromHints(eps, node.Name, zone)
	cluster = pickEndpoints(eps, func(e *endpoint) bool { return e.ready && e.availableFor(mode, node.Name, zone) })
	if len(cluster) == 0 {
		// No ready endpoint anywhere (topology never empties the set): keep connections
		// working through endpoints that are draining, ignoring topology.
		cluster = pickEndpoints(eps, (*endpoint).servingTerminating)
	}
	local = pickEndpoints(eps, func(e *endpoint) bool { return e.local && e.ready })
	if len(local) == 0 {
		local = pickEndpoints(eps, func(e *endpoint) bool { return e.local && e.servingTerminating() })
	}
	for _, e := range eps {
		if e.ready || e.servingTerminating() {
			has = true
			break
		}
	}
	return cluster, local, has
}

// pickEndpoints returns the endpoints of eps that keep accepts, in an array of their
// number (nil: none).
func pickEndpoints(eps []*endpoint, keep func(*endpoint) bool) []tables.Endpoint {
	n := 0
	for _, e := range eps {
		if keep(e) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]tables.Endpoint, 0, n)
	for _, e := range eps {
		if keep(e) {
			out = append(out, e.Endpoint)
		}
	}
	return out
}

// sortedSlices returns the non-nil slices ordered by name, so Problems and duplicate
// resolution do not depend on the caller's order.
func sortedSlices(list []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	out := make([]*discoveryv1.EndpointSlice, 0, len(list))
	for _, s := range list {
		if s != nil {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Compare(a.Name, b.Name)
	})
	return out
}

// parseIP parses an IP address the way kube-proxy does: leading zeros are accepted for
// objects stored before Go stopped accepting them, and IPv4-mapped IPv6 addresses are
// IPv4.
func parseIP(s string) (netip.Addr, bool) {
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// parsePrefix parses a CIDR the way kube-proxy does (surrounding whitespace ignored,
// sloppy about leading zeros), with host bits cleared.
func parsePrefix(s string) (netip.Prefix, bool) {
	_, ipnet, err := netutils.ParseCIDRSloppy(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, false
	}
	addr, ok := netip.AddrFromSlice(ipnet.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := ipnet.Mask.Size()
	if bits == 0 {
		return netip.Prefix{}, false
	}
	if addr.Is4In6() {
		addr = addr.Unmap()
		if bits == 128 {
			ones -= 96
		}
		if ones < 0 {
			return netip.Prefix{}, false
		}
	}
	p := netip.PrefixFrom(addr, ones)
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}
