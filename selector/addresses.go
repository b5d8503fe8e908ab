package selector

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// addressBook arbitrates the addresses users write into Services (spec.externalIPs and
// the IPs of status.loadBalancer.ingress) node-wide, across every Service the node sees,
// whichever instance serves it, so that slot order or a chosen name never decides who
// gets traffic. Only what a local instance would serve counts as a claim (the
// Dispatcher's claimable: a Service no instance here serves, or an address outside its
// instance's ranges, claims nothing), but every Service's cluster IPs are reserved:
//
//   - a cluster IP is authoritative (the apiserver allocated it): a user address equal
//     to any Service's cluster IP is refused, as is a node IP, a loopback, link-local,
//     unspecified or multicast address, and an address inside a ServiceCIDR;
//   - among user addresses, the oldest claim keeps it: two Services claiming one address
//     on a common protocol and port are ordered by creation time, then UID, and the
//     younger loses that address (for all its ports: one externalIP cannot be served
//     for some ports of a Service and not others without rewriting the Service).
//
// Every node computes the same verdicts from the same objects. Safe for concurrent use.
type addressBook struct {
	mu sync.Mutex
	// clusterIPs maps each cluster IP to the Service holding it (the apiserver allocates
	// each once), and clusterIPsByName the other way.
	clusterIPs       map[netip.Addr]types.NamespacedName
	clusterIPsByName map[types.NamespacedName][]netip.Addr
	// claimants are the Services that write user addresses, with what they claim
	// (possibly nothing).
	claimants map[types.NamespacedName]*claimant
	// byAddr indexes the claimants by user address.
	byAddr map[netip.Addr]map[types.NamespacedName]bool
	// reserved are the addresses no user address may take.
	reserved Reserved
}

// Reserved are addresses no Service's user addresses (external IPs, load-balancer IPs)
// may take, whoever serves them.
type Reserved struct {
	// NodeIPs are this node's addresses: served, a user address would capture the
	// node's own traffic.
	NodeIPs []netip.Addr
	// ServiceCIDRs are the cluster's Service CIDRs: the apiserver allocates from them.
	ServiceCIDRs []netip.Prefix
	// PodCIDRs are the cluster's (or this node's) pod ranges: served, a user address
	// would capture the traffic of the pod that has it.
	PodCIDRs []netip.Prefix
	// OtherNodeIPs are the other Nodes' addresses, sorted by address: served here, a
	// user address would capture this node's traffic to that node (kubelet, SSH).
	OtherNodeIPs []NodeIP
	// CIDRs are the ranges the operator reserved (reservedCIDRs).
	CIDRs []netip.Prefix
}

// NodeIP is an address of a Node.
type NodeIP struct {
	Addr netip.Addr
	Node string
}

func (r Reserved) equal(o Reserved) bool {
	return slices.Equal(r.NodeIPs, o.NodeIPs) && slices.Equal(r.ServiceCIDRs, o.ServiceCIDRs) && slices.Equal(r.PodCIDRs, o.PodCIDRs) &&
		slices.Equal(r.OtherNodeIPs, o.OtherNodeIPs) && slices.Equal(r.CIDRs, o.CIDRs)
}

// clone returns a copy of r sharing no slice with it.
func (r Reserved) clone() Reserved {
	return Reserved{NodeIPs: slices.Clone(r.NodeIPs), ServiceCIDRs: slices.Clone(r.ServiceCIDRs), PodCIDRs: slices.Clone(r.PodCIDRs),
		OtherNodeIPs: slices.Clone(r.OtherNodeIPs), CIDRs: slices.Clone(r.CIDRs)}
}

// claimant is a Service that writes user addresses.
type claimant struct {
	svc   *corev1.Service
	addrs map[netip.Addr][]portKey
}

// portKey is a protocol and port a Service listens on.
type portKey struct {
	proto corev1.Protocol
	port  int32
}

func newAddressBook() *addressBook {
	return &addressBook{
		clusterIPs:       map[netip.Addr]types.NamespacedName{},
		clusterIPsByName: map[types.NamespacedName][]netip.Addr{},
		claimants:        map[types.NamespacedName]*claimant{},
		byAddr:           map[netip.Addr]map[types.NamespacedName]bool{},
	}
}

// userAddresses are the addresses a Service's users wrote, with its ports.
func userAddresses(svc *corev1.Service) map[netip.Addr][]portKey {
	var ports []portKey
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		ports = append(ports, portKey{proto, p.Port})
	}
	out := map[netip.Addr][]portKey{}
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			out[a.Unmap()] = ports
		}
	}
	for _, s := range svc.Spec.ExternalIPs {
		add(s)
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		add(ing.IP)
	}
	return out
}

// serviceClusterIPs are a Service's allocated cluster IPs.
func serviceClusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// observe records svc's current cluster IPs and, of its user addresses, those in
// claimable (Dispatcher.claimable). It returns the other Services whose verdicts may
// have changed with it (nil when nothing that matters to arbitration changed).
func (b *addressBook) observe(svc *corev1.Service, claimable map[netip.Addr]bool) []*corev1.Service {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	oldCIPs := b.clusterIPsByName[name]
	newCIPs := serviceClusterIPs(svc)
	old := b.claimants[name]
	written := userAddresses(svc)
	addrs := maps.Clone(written)
	maps.DeleteFunc(addrs, func(a netip.Addr, _ []portKey) bool { return !claimable[a] })
	if slices.Equal(oldCIPs, newCIPs) && sameClaim(old, svc, addrs) && (old != nil) == (len(written) > 0) {
		if old != nil {
			old.svc = svc // the newest object, for re-dispatch
		}
		return nil
	}
	touched := map[netip.Addr]bool{}
	b.dropClusterIPs(name, touched)
	for _, a := range newCIPs {
		b.clusterIPs[a] = name
		touched[a] = true
	}
	if len(newCIPs) > 0 {
		b.clusterIPsByName[name] = newCIPs
	}
	b.dropClaim(name, touched)
	if len(written) > 0 {
		// Recorded even when it claims nothing: a change of the reserved addresses
		// re-dispatches it.
		b.claimants[name] = &claimant{svc: svc, addrs: addrs}
		for a := range addrs {
			if b.byAddr[a] == nil {
				b.byAddr[a] = map[types.NamespacedName]bool{}
			}
			b.byAddr[a][name] = true
			touched[a] = true
		}
	}
	return b.claimantsOf(touched, name)
}

// forget removes a deleted Service and returns the Services whose verdicts may change.
func (b *addressBook) forget(name types.NamespacedName) []*corev1.Service {
	b.mu.Lock()
	defer b.mu.Unlock()
	touched := map[netip.Addr]bool{}
	b.dropClusterIPs(name, touched)
	b.dropClaim(name, touched)
	return b.claimantsOf(touched, name)
}

// setReserved replaces the reserved addresses, returning every claimant when they
// changed.
func (b *addressBook) setReserved(r Reserved) []*corev1.Service {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved.equal(r) {
		return nil
	}
	b.reserved = r.clone()
	out := make([]*corev1.Service, 0, len(b.claimants))
	for _, c := range b.claimants {
		out = append(out, c.svc)
	}
	return out
}

// refused returns, for each user address of svc that it may not have, why; nil when
// it may have them all. A reserved address is refused whether or not it is a claim.
func (b *addressBook) refused(svc *corev1.Service) map[netip.Addr]string {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.claimants[name]
	var out map[netip.Addr]string
	for a, ports := range userAddresses(svc) {
		why := b.reservedWhy(a)
		if why == "" && c != nil && c.addrs[a] != nil {
			why = b.olderClaim(name, c, a, ports)
		}
		if why != "" {
			if out == nil {
				out = map[netip.Addr]string{}
			}
			out[a] = why
		}
	}
	return out
}

// reservedWhy says why no user may have a, or "".
func (b *addressBook) reservedWhy(a netip.Addr) string {
	switch {
	case b.clusterIPs[a] != (types.NamespacedName{}):
		return "it is the cluster IP of " + b.clusterIPs[a].String()
	case a.IsLoopback(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(), a.IsUnspecified(), a.IsMulticast():
		return "it is a loopback, link-local, unspecified or multicast address"
	case slices.Contains(b.reserved.NodeIPs, a):
		return "it is an address of this node"
	}
	if i, ok := slices.BinarySearchFunc(b.reserved.OtherNodeIPs, a, func(n NodeIP, a netip.Addr) int { return n.Addr.Compare(a) }); ok {
		return "it is an address of node " + b.reserved.OtherNodeIPs[i].Node
	}
	for _, p := range b.reserved.CIDRs {
		if p.Contains(a) {
			return "it is inside the reserved CIDR " + p.String() + " (reservedCIDRs)"
		}
	}
	for _, p := range b.reserved.ServiceCIDRs {
		if p.Contains(a) {
			return "it is inside the Service CIDR " + p.String()
		}
	}
	for _, p := range b.reserved.PodCIDRs {
		if p.Contains(a) {
			return "it is inside the pod CIDR " + p.String()
		}
	}
	return ""
}

// olderClaim names the older Service that claims a on one of the same ports, or "".
func (b *addressBook) olderClaim(name types.NamespacedName, c *claimant, a netip.Addr, ports []portKey) string {
	var winner *claimant
	for other := range b.byAddr[a] {
		oc := b.claimants[other]
		if other == name || oc == nil || !overlap(ports, oc.addrs[a]) || !older(oc.svc, c.svc) {
			continue
		}
		if winner == nil || older(oc.svc, winner.svc) {
			winner = oc
		}
	}
	if winner == nil {
		return ""
	}
	return fmt.Sprintf("%s/%s claimed it first", winner.svc.Namespace, winner.svc.Name)
}

// older reports whether x was created before y (then by UID: never by name, which a
// user chooses).
func older(x, y *corev1.Service) bool {
	tx, ty := x.CreationTimestamp.Time, y.CreationTimestamp.Time
	if !tx.Equal(ty) {
		return tx.Before(ty)
	}
	return x.UID < y.UID
}

func overlap(a, b []portKey) bool {
	for _, p := range a {
		if slices.Contains(b, p) {
			return true
		}
	}
	return false
}

// sameClaim reports whether svc claims what old records, with the same age.
func sameClaim(old *claimant, svc *corev1.Service, addrs map[netip.Addr][]portKey) bool {
	if old == nil {
		return len(addrs) == 0
	}
	if !old.svc.CreationTimestamp.Equal(&svc.CreationTimestamp) || old.svc.UID != svc.UID || len(old.addrs) != len(addrs) {
		return false
	}
	for a, ports := range addrs {
		if prev, ok := old.addrs[a]; !ok || !slices.Equal(prev, ports) {
			return false
		}
	}
	return true
}

// dropClaim forgets name's user addresses, adding them to touched.
func (b *addressBook) dropClaim(name types.NamespacedName, touched map[netip.Addr]bool) {
	old := b.claimants[name]
	if old == nil {
		return
	}
	for a := range old.addrs {
		delete(b.byAddr[a], name)
		if len(b.byAddr[a]) == 0 {
			delete(b.byAddr, a)
		}
		touched[a] = true
	}
	delete(b.claimants, name)
}

// dropClusterIPs forgets name's cluster IPs (those it still holds), adding them to
// touched.
func (b *addressBook) dropClusterIPs(name types.NamespacedName, touched map[netip.Addr]bool) {
	for _, a := range b.clusterIPsByName[name] {
		if b.clusterIPs[a] == name {
			delete(b.clusterIPs, a)
		}
		touched[a] = true
	}
	delete(b.clusterIPsByName, name)
}

// claimantsOf returns the claimants of the touched addresses other than except.
func (b *addressBook) claimantsOf(touched map[netip.Addr]bool, except types.NamespacedName) []*corev1.Service {
	seen := map[types.NamespacedName]bool{except: true}
	var out []*corev1.Service
	for a := range touched {
		for n := range b.byAddr[a] {
			if !seen[n] {
				seen[n] = true
				out = append(out, b.claimants[n].svc)
			}
		}
	}
	slices.SortFunc(out, func(x, y *corev1.Service) int {
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	return out
}

// withoutRefused returns svc without the refused user addresses (a copy when one is
// removed), and one line per removed address.
func withoutRefused(svc *corev1.Service, refused map[netip.Addr]string) (*corev1.Service, []string) {
	if len(refused) == 0 {
		return svc, nil
	}
	out := svc.DeepCopy()
	var problems []string
	keep := func(s, what string) bool {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return true
		}
		if why, ok := refused[a.Unmap()]; ok {
			problems = append(problems, fmt.Sprintf("%s %s refused: %s", what, s, why))
			return false
		}
		return true
	}
	out.Spec.ExternalIPs = slices.DeleteFunc(out.Spec.ExternalIPs, func(s string) bool { return !keep(s, "externalIP") })
	out.Status.LoadBalancer.Ingress = slices.DeleteFunc(out.Status.LoadBalancer.Ingress, func(ing corev1.LoadBalancerIngress) bool {
		return ing.IP != "" && !keep(ing.IP, "load-balancer IP")
	})
	return out, problems
}
