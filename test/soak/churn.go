package soak

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/selector"
)

// Namespaces the churn creates Services in: team-a admits soak-a and soak-ab, team-b
// soak-b and soak-ab, the default instance all of them; a label naming a team in a
// namespace it does not admit is refused (ServiceRejected), as it should be.
var churnNamespaces = []string{"soak-a", "soak-b", "soak-ab", "soak-x"}

// proxyLabels are the label values the churn gives Services: the default instance's
// (none), each team's, and a proxy that runs nowhere on this node.
var proxyLabels = []string{"", "team-a", "team-b", "other-proxy"}

// addressRanges are the external-IP and load-balancer ranges of each instance (see
// instancesConfig). The allocator hands out every address once, so no two Services ever
// claim the same one: the node-wide precedence between claims is not what the soak
// checks (render does not model it; see the README).
var addressRanges = map[string][2][]string{
	"":       {{"100.64.0.0/16"}, {"100.65.0.0/16"}},
	"team-a": {{"100.66.0.0/16", "fd00:66::/64"}, {"100.67.0.0/16"}},
	"team-b": {{"100.68.0.0/16"}, {"100.69.0.0/16", "fd00:69::/64"}},
}

// allocator hands out addresses of a range, each only once. Each address is drawn from
// the change's own random source, so parallel changes get the same addresses whatever
// their order (but for a collision, which draws again).
type allocator struct {
	mu    sync.Mutex
	taken map[netip.Addr]bool
}

func (a *allocator) take(cidr string, r *rand.Rand) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.taken == nil {
		a.taken = map[netip.Addr]bool{}
	}
	p := netip.MustParsePrefix(cidr)
	for {
		b := p.Addr().AsSlice()
		// The last two bytes: every range is at least a /16.
		n := 1 + r.IntN(65534)
		b[len(b)-2], b[len(b)-1] = byte(n>>8), byte(n)
		addr, _ := netip.AddrFromSlice(b)
		if !a.taken[addr] {
			a.taken[addr] = true
			return addr.String()
		}
	}
}

// churn makes the random, seeded stream of changes to ~N Services and their
// EndpointSlices. Every choice comes from the seed and from what the churn itself wrote,
// so a seed replays the same stream (the interleaving with faults differs).
type churn struct {
	client kubernetes.Interface
	rng    *rand.Rand
	target int
	addrs  allocator
	logf   func(string, ...any)

	// services are the Services that exist, in creation order; next numbers new ones.
	services []svcRef
	next     int

	mu      sync.Mutex
	applied map[string]int
}

type svcRef struct{ ns, name string }

func (s svcRef) String() string { return s.ns + "/" + s.name }

func newChurn(client kubernetes.Interface, seed uint64, target int, logf func(string, ...any)) *churn {
	return &churn{client: client, rng: rand.New(rand.NewPCG(seed, 0x50a4)), target: target, applied: map[string]int{}, logf: logf}
}

// op is one change: its kind, the Service it applies to and the seed of its own choices,
// drawn up front so that retries draw the same.
type op struct {
	kind string
	svc  svcRef
	seed uint64
}

// opWeights are the kinds of change and how often each is drawn.
var opWeights = []struct {
	kind   string
	weight int
}{
	{"create", 6}, {"delete", 6}, {"relabel", 6}, {"shadow", 3}, {"ports", 5},
	{"type", 3}, {"policies", 4}, {"affinity", 3}, {"externalIPs", 4}, {"lbStatus", 4},
	{"conditions", 12}, {"endpoints", 8}, {"slicePorts", 2}, {"sliceDelete", 2},
}

// nextOp draws the next change, keeping the population near the target.
func (c *churn) nextOp() op {
	o := op{seed: c.rng.Uint64()}
	switch {
	case len(c.services) < c.target*95/100:
		o.kind = "create"
	case len(c.services) > c.target*105/100:
		o.kind = "delete"
	default:
		total := 0
		for _, w := range opWeights {
			total += w.weight
		}
		n := c.rng.IntN(total)
		for _, w := range opWeights {
			if n -= w.weight; n < 0 {
				o.kind = w.kind
				break
			}
		}
	}
	if o.kind == "create" {
		return c.createOp(o.seed)
	}
	i := c.rng.IntN(len(c.services))
	o.svc = c.services[i]
	if o.kind == "delete" {
		c.services = slices.Delete(c.services, i, i+1)
	}
	return o
}

// createOp draws the creation of a new Service.
func (c *churn) createOp(seed uint64) op {
	c.next++
	o := op{kind: "create", seed: seed, svc: svcRef{ns: churnNamespaces[c.rng.IntN(len(churnNamespaces))], name: "svc-" + strconv.Itoa(c.next)}}
	c.services = append(c.services, o.svc)
	return o
}

// resetApplied forgets the changes counted so far (the initial population).
func (c *churn) resetApplied() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applied = map[string]int{}
}

// apply runs an op until it lands: API errors (the apiserver stopped, a partition) are
// retried until ctx ends.
func (c *churn) apply(ctx context.Context, o op) error {
	for attempt := 0; ; attempt++ {
		err := c.run(ctx, o)
		if err == nil || refused(err) {
			c.mu.Lock()
			if err != nil {
				// The API refused a change it never accepts (say, a load-balancer status
				// on a Service of another type): nothing to retry, nothing changed.
				c.applied["refused by the API"]++
			} else {
				c.applied[o.kind]++
			}
			c.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt%50 == 10 {
			c.logf("change %s %s still failing: %v", o.kind, o.svc, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
}

// Applied returns how many changes of each kind landed.
func (c *churn) Applied() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.applied)
}

// run applies o once, drawing its choices from o.seed.
func (c *churn) run(ctx context.Context, o op) error {
	r := rand.New(rand.NewPCG(o.seed, 1))
	switch o.kind {
	case "create":
		return c.create(ctx, o.svc, r)
	case "delete":
		return c.delete(ctx, o.svc)
	case "lbStatus":
		return c.updateStatus(ctx, o.svc, r)
	case "conditions", "endpoints", "slicePorts", "sliceDelete":
		return c.updateSlices(ctx, o, r)
	default:
		return c.updateService(ctx, o, r)
	}
}

func (c *churn) create(ctx context.Context, ref svcRef, r *rand.Rand) error {
	svcs := c.client.CoreV1().Services(ref.ns)
	svc, err := svcs.Create(ctx, newService(ref, r, &c.addrs), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// An earlier attempt made it before failing.
		svc, err = svcs.Get(ctx, ref.name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	for _, sl := range newSlices(svc, r) {
		_, err := c.client.DiscoveryV1().EndpointSlices(ref.ns).Create(ctx, sl, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

func (c *churn) delete(ctx context.Context, ref svcRef) error {
	err := c.client.CoreV1().Services(ref.ns).Delete(ctx, ref.name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return c.client.DiscoveryV1().EndpointSlices(ref.ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + ref.name})
}

// newService draws a Service: its instance (by label), families, type, ports, policies,
// affinity and external IPs.
func newService(ref svcRef, r *rand.Rand, addrs *allocator) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ref.ns, Name: ref.name}}
	if label := proxyLabels[r.IntN(len(proxyLabels))]; label != "" {
		svc.Labels = map[string]string{selector.LabelServiceProxyName: label}
	}
	switch n := r.IntN(10); {
	case n < 2:
		p := corev1.IPFamilyPolicyRequireDualStack
		svc.Spec.IPFamilyPolicy = &p
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	case n < 3:
		svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	}
	for i := range 1 + r.IntN(3) {
		proto := corev1.ProtocolTCP
		if r.IntN(4) == 0 {
			proto = corev1.ProtocolUDP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: "p" + strconv.Itoa(i), Protocol: proto, Port: int32(1000 + 10*i + r.IntN(5)),
			TargetPort: intstr.FromInt32(int32(8000 + i)),
		})
	}
	setType(svc, []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}[r.IntN(4)], r)
	if r.IntN(6) == 0 {
		setAffinity(svc, true, r)
	}
	if r.IntN(4) == 0 {
		setExternalIPs(svc, r, addrs)
	}
	if r.IntN(7) == 0 {
		local := corev1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
	return svc
}

// setType changes the Service's type, with what the API requires to go with it.
func setType(svc *corev1.Service, t corev1.ServiceType, r *rand.Rand) {
	svc.Spec.Type = t
	if t == corev1.ServiceTypeClusterIP {
		svc.Spec.ExternalTrafficPolicy = ""
		svc.Spec.HealthCheckNodePort = 0
		svc.Spec.AllocateLoadBalancerNodePorts = nil
		for i := range svc.Spec.Ports {
			svc.Spec.Ports[i].NodePort = 0
		}
		return
	}
	if t != corev1.ServiceTypeLoadBalancer {
		svc.Spec.AllocateLoadBalancerNodePorts = nil
	}
	setExternalPolicy(svc, r.IntN(3) == 0)
}

func setExternalPolicy(svc *corev1.Service, local bool) {
	if svc.Spec.Type == corev1.ServiceTypeClusterIP {
		return
	}
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	if local {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if !local || svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		svc.Spec.HealthCheckNodePort = 0
	}
}

func setAffinity(svc *corev1.Service, on bool, r *rand.Rand) {
	if !on {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
		svc.Spec.SessionAffinityConfig = nil
		return
	}
	timeout := int32(1 + r.IntN(10800))
	svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
}

// ownRanges are the address ranges of the instance the Service's label names, mostly,
// or of another instance (which its guards then refuse).
func ownRanges(svc *corev1.Service, r *rand.Rand, lb bool) []string {
	label := svc.Labels[selector.LabelServiceProxyName]
	if _, ok := addressRanges[label]; !ok || r.IntN(5) == 0 {
		label = []string{"", "team-a", "team-b"}[r.IntN(3)]
	}
	if lb {
		return addressRanges[label][1]
	}
	return addressRanges[label][0]
}

func setExternalIPs(svc *corev1.Service, r *rand.Rand, addrs *allocator) {
	svc.Spec.ExternalIPs = nil
	ranges := ownRanges(svc, r, false)
	for range r.IntN(3) {
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, addrs.take(ranges[r.IntN(len(ranges))], r))
	}
}

// updateService applies one kind of Service change.
func (c *churn) updateService(ctx context.Context, o op, r *rand.Rand) error {
	svcs := c.client.CoreV1().Services(o.svc.ns)
	svc, err := svcs.Get(ctx, o.svc.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	mutateService(svc, o.kind, r, &c.addrs)
	_, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
	return err
}

func mutateService(svc *corev1.Service, kind string, r *rand.Rand, addrs *allocator) {
	switch kind {
	case "relabel":
		if svc.Labels == nil {
			svc.Labels = map[string]string{}
		}
		if label := proxyLabels[r.IntN(len(proxyLabels))]; label == "" {
			delete(svc.Labels, selector.LabelServiceProxyName)
		} else {
			svc.Labels[selector.LabelServiceProxyName] = label
		}
	case "shadow":
		if svc.Annotations[selector.AnnotationShadow] != "" {
			delete(svc.Annotations, selector.AnnotationShadow)
			return
		}
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[selector.AnnotationShadow] = []string{"team-a", "team-b", "other-proxy"}[r.IntN(3)]
	case "ports":
		mutatePorts(svc, r)
	case "type":
		setType(svc, []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}[r.IntN(3)], r)
	case "policies":
		setExternalPolicy(svc, r.IntN(2) == 0)
		p := []corev1.ServiceInternalTrafficPolicy{corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal}[r.IntN(2)]
		svc.Spec.InternalTrafficPolicy = &p
	case "affinity":
		setAffinity(svc, svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || r.IntN(3) == 0, r)
	case "externalIPs":
		setExternalIPs(svc, r, addrs)
	}
}

// mutatePorts renames a port, renumbers one, adds one or removes one.
func mutatePorts(svc *corev1.Service, r *rand.Rand) {
	ports := svc.Spec.Ports
	i := r.IntN(len(ports))
	switch n := r.IntN(4); {
	case n == 0:
		ports[i].Name = "r" + strconv.Itoa(r.IntN(1000))
	case n == 1:
		ports[i].Port = int32(2000 + r.IntN(1000))
	case n == 2 && len(ports) < 4:
		ports = append(ports, corev1.ServicePort{Name: "a" + strconv.Itoa(r.IntN(1000)), Protocol: corev1.ProtocolTCP,
			Port: int32(3000 + r.IntN(1000)), TargetPort: intstr.FromInt32(int32(8000 + r.IntN(4)))})
	case len(ports) > 1:
		ports = slices.Delete(ports, i, i+1)
	}
	// Names and ports must stay unique.
	seen := map[string]bool{}
	var out []corev1.ServicePort
	for _, p := range ports {
		key := string(p.Protocol) + "/" + strconv.Itoa(int(p.Port))
		if seen[p.Name] || seen[key] {
			continue
		}
		seen[p.Name], seen[key] = true, true
		out = append(out, p)
	}
	svc.Spec.Ports = out
}

func (c *churn) updateStatus(ctx context.Context, ref svcRef, r *rand.Rand) error {
	svcs := c.client.CoreV1().Services(ref.ns)
	svc, err := svcs.Get(ctx, ref.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Status.LoadBalancer.Ingress = nil
	ranges := ownRanges(svc, r, true)
	for range r.IntN(3) {
		ip := c.addrs.take(ranges[r.IntN(len(ranges))], r)
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	_, err = svcs.UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	return err
}

// newSlices draws the EndpointSlices of a new Service: one or two per family it has.
func newSlices(svc *corev1.Service, r *rand.Rand) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range svc.Spec.IPFamilies {
		for i := range 1 + r.IntN(5)/4 {
			sl := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: fmt.Sprintf("%s-%s-%d", svc.Name, lowerFamily(fam), i),
					Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
				AddressType: discoveryv1.AddressType(fam),
			}
			for _, p := range svc.Spec.Ports {
				sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Protocol), Port: ptr(p.TargetPort.IntVal)})
			}
			sl.Endpoints = drawEndpoints(sl.AddressType, r)
			out = append(out, sl)
		}
	}
	return out
}

func lowerFamily(f corev1.IPFamily) string {
	if f == corev1.IPv6Protocol {
		return "ipv6"
	}
	return "ipv4"
}

// drawEndpoints draws 0-6 endpoints on node-1 or node-2 (by pod CIDR), each with random
// conditions. No server listens there: the churned Services get no traffic.
func drawEndpoints(fam discoveryv1.AddressType, r *rand.Rand) []discoveryv1.Endpoint {
	var eps []discoveryv1.Endpoint
	seen := map[string]bool{}
	for range r.IntN(7) {
		node := 1 + r.IntN(2)
		host := 10 + r.IntN(240)
		ip := fmt.Sprintf("10.244.%d.%d", node, host)
		if fam == discoveryv1.AddressTypeIPv6 {
			ip = fmt.Sprintf("fd00:10:244:%d::%x", node, host)
		}
		if seen[ip] {
			continue
		}
		seen[ip] = true
		eps = append(eps, discoveryv1.Endpoint{
			Addresses: []string{ip}, NodeName: ptr("node-" + strconv.Itoa(node)),
			Conditions: drawConditions(r),
		})
	}
	return eps
}

func drawConditions(r *rand.Rand) discoveryv1.EndpointConditions {
	switch r.IntN(6) {
	case 0: // terminating, still serving
		return discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
	case 1: // terminating, done
		return discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false), Terminating: ptr(true)}
	case 2: // not ready yet
		return discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false)}
	default:
		return discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true)}
	}
}

// updateSlices changes the Service's EndpointSlices: flips conditions, replaces the
// endpoints, renames the ports (to the Service's current names, or to stale ones), or
// deletes one slice (recreated from the Service at the next "endpoints" change).
func (c *churn) updateSlices(ctx context.Context, o op, r *rand.Rand) error {
	api := c.client.DiscoveryV1().EndpointSlices(o.svc.ns)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + o.svc.name})
	if err != nil {
		return err
	}
	slices.SortFunc(list.Items, func(a, b discoveryv1.EndpointSlice) int { return compareStrings(a.Name, b.Name) })
	if len(list.Items) == 0 {
		if o.kind != "endpoints" {
			return nil // nothing to change: a no-op still counts as drawn
		}
		svc, err := c.client.CoreV1().Services(o.svc.ns).Get(ctx, o.svc.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, sl := range newSlices(svc, r) {
			if _, err := api.Create(ctx, sl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
		}
		return nil
	}
	sl := &list.Items[r.IntN(len(list.Items))]
	switch o.kind {
	case "sliceDelete":
		err := api.Delete(ctx, sl.Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	case "conditions":
		for i := range sl.Endpoints {
			if r.IntN(3) == 0 {
				sl.Endpoints[i].Conditions = drawConditions(r)
			}
		}
	case "endpoints":
		sl.Endpoints = drawEndpoints(sl.AddressType, r)
	case "slicePorts":
		if err := c.renameSlicePorts(ctx, o.svc, sl, r); err != nil {
			return err
		}
	}
	_, err = api.Update(ctx, sl, metav1.UpdateOptions{})
	return err
}

// renameSlicePorts gives the slice the Service's current port names (what the
// EndpointSlice controller does after a rename), or, one time in three, a stale name.
func (c *churn) renameSlicePorts(ctx context.Context, ref svcRef, sl *discoveryv1.EndpointSlice, r *rand.Rand) error {
	svc, err := c.client.CoreV1().Services(ref.ns).Get(ctx, ref.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	sl.Ports = nil
	for _, p := range svc.Spec.Ports {
		name := p.Name
		if r.IntN(3) == 0 {
			name = "stale" + strconv.Itoa(r.IntN(10))
		}
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(p.Protocol), Port: ptr(p.TargetPort.IntVal)})
	}
	seen := map[string]bool{}
	sl.Ports = slices.DeleteFunc(sl.Ports, func(p discoveryv1.EndpointPort) bool {
		dup := seen[*p.Name]
		seen[*p.Name] = true
		return dup
	})
	return nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func ptr[T any](v T) *T { return &v }

// refused reports whether the API rejected a change for what it is, not for the moment.
func refused(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err) ||
		apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)
}
