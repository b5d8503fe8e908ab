package selector

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
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
//     unspecified or multicast address, an address inside a ServiceCIDR, an endpoint of
//     the API server and a cloud metadata address;
//   - among user addresses, the holder keeps it: claims are made per address, protocol
//     and port (a claimKey), and the holder of a key is the claim seen first, by the
//     resourceVersion of the Service version that first carried it (the API server's
//     order, the same on every node whatever order its watches deliver in), so a
//     long-existing Service edited to add an address another Service serves does not
//     take it. Claims already there when the node started (before markListed) have no
//     such order: they rank as seeded (Holding, from the nodes already running), then by
//     creation time and UID, never by name. A Service that does not hold every key of
//     an address loses that address, for all its ports: one externalIP cannot be served
//     for some ports of a Service and not others without rewriting the Service.
//
// The cost of a change is what it touches: the claims are indexed by key, and only the
// Services whose verdict changed are returned for re-dispatch (a Service sharing an
// address with thousands of others on other ports costs nothing when they change).
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
	// byAddr indexes the claimants by user address, and keys by address and port.
	byAddr map[netip.Addr]map[types.NamespacedName]bool
	keys   map[claimKey]*contest
	// listed: the initial lists are in, so a new claim's resourceVersion orders it.
	listed bool
	// seeded are the holders the nodes already running reported (SeedHoldings), for the
	// claims present at start.
	seeded map[claimKey]types.UID
	// reserved are the addresses no user address may take.
	reserved Reserved
	// holdingsCache is what holdings last returned, kept until a change (holdingsValid
	// false): the node status asks every 500 ms, and each answer scanned and sorted
	// every key.
	holdingsCache []Holding
	holdingsValid bool
}

// claimKey is what one claim is made on: an address with a protocol and port.
type claimKey struct {
	addr netip.Addr
	port portKey
}

// contest is the claimants of one key, with its holder (the first-ranked) cached.
type contest struct {
	names  map[types.NamespacedName]bool
	holder types.NamespacedName
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
	// APIServerIPs are the addresses of the API server's endpoints (default/kubernetes),
	// sorted: served, a user address would capture every client's API traffic.
	APIServerIPs []netip.Addr
}

// metadataService names the cloud whose metadata service listens on a, or "": the
// metadata addresses that are not link-local (169.254.169.254 and fe80::a9fe:a9fe are
// refused as link-local anyway). Served, a user address would capture the credentials
// requests of the node and its pods.
func metadataService(a netip.Addr) string {
	// Compared as values: this runs for every user address a Service writes.
	switch a {
	case netip.AddrFrom4([4]byte{100, 100, 100, 200}):
		return "Alibaba Cloud"
	case netip.AddrFrom16([16]byte{0xfd, 0x00, 0x0e, 0xc2, 14: 0x02, 15: 0x54}):
		return "AWS (IPv6)"
	case netip.AddrFrom16([16]byte{0xfd, 0x20, 0x00, 0xce, 14: 0x02, 15: 0x54}):
		return "Google Cloud (IPv6)"
	}
	return ""
}

// Holding is the holder of one contested claim (an address, protocol and port more than
// one Service claims), as a running node reports it so that a node starting later, which
// sees every claim at once and cannot tell which came first, ranks them the same way.
type Holding struct {
	Addr     netip.Addr      `json:"addr"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	// UID is the holding Service's UID.
	UID types.UID `json:"uid"`
}

// Compare orders holdings by address, protocol and port.
func (h Holding) Compare(o Holding) int {
	if c := h.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := strings.Compare(string(h.Protocol), string(o.Protocol)); c != 0 {
		return c
	}
	return int(h.Port) - int(o.Port)
}

// NodeIP is an address of a Node.
type NodeIP struct {
	Addr netip.Addr
	Node string
}

func (r Reserved) equal(o Reserved) bool {
	return slices.Equal(r.NodeIPs, o.NodeIPs) && slices.Equal(r.ServiceCIDRs, o.ServiceCIDRs) && slices.Equal(r.PodCIDRs, o.PodCIDRs) &&
		slices.Equal(r.OtherNodeIPs, o.OtherNodeIPs) && slices.Equal(r.CIDRs, o.CIDRs) && slices.Equal(r.APIServerIPs, o.APIServerIPs)
}

// clone returns a copy of r sharing no slice with it.
func (r Reserved) clone() Reserved {
	return Reserved{NodeIPs: slices.Clone(r.NodeIPs), ServiceCIDRs: slices.Clone(r.ServiceCIDRs), PodCIDRs: slices.Clone(r.PodCIDRs),
		OtherNodeIPs: slices.Clone(r.OtherNodeIPs), CIDRs: slices.Clone(r.CIDRs), APIServerIPs: slices.Clone(r.APIServerIPs)}
}

// claimant is a Service that writes user addresses.
type claimant struct {
	svc *corev1.Service
	// addrs are the claimable addresses, each with the Service's ports.
	addrs map[netip.Addr][]portKey
	// since orders each of its claims: the resourceVersion of the first version of the
	// Service that carried it, 0 for a claim present when the node started.
	since map[claimKey]uint64
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
		keys:             map[claimKey]*contest{},
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

// claimOrder is the resourceVersion that orders svc's new claims once the initial lists
// are in. The API server's resourceVersions are etcd revisions, increasing across all
// Services; one that does not parse (never from a real API server) ranks last.
func claimOrder(svc *corev1.Service) uint64 {
	rv, err := strconv.ParseUint(svc.ResourceVersion, 10, 64)
	if err != nil {
		return math.MaxUint64
	}
	return rv
}

// observe records svc's current cluster IPs and, of its user addresses, those in
// claimable (Dispatcher.claimable). It returns the other Services whose verdicts changed
// with it (nil when nothing that matters to arbitration changed).
func (b *addressBook) observe(svc *corev1.Service, claimable map[netip.Addr]bool) []*corev1.Service {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdingsValid = false
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
	keys := keysOf(old, nil)
	keysOf(&claimant{addrs: addrs}, keys)
	holders := b.holders(keys)
	cands := map[types.NamespacedName]bool{}
	if !slices.Equal(oldCIPs, newCIPs) {
		b.addressClaimants(cands, append(slices.Clip(oldCIPs), newCIPs...))
	}
	delete(cands, name)
	before := b.outcomes(cands)

	b.dropClusterIPs(name)
	for _, a := range newCIPs {
		b.clusterIPs[a] = name
	}
	if len(newCIPs) > 0 {
		b.clusterIPsByName[name] = newCIPs
	}
	since := map[claimKey]uint64{}
	for a, ports := range addrs {
		for _, p := range ports {
			k := claimKey{a, p}
			switch {
			case old != nil && old.svc.UID == svc.UID && hasKey(old, k):
				since[k] = old.since[k] // the claim goes on: it keeps its place
			case b.listed:
				since[k] = claimOrder(svc)
			default:
				since[k] = 0
			}
		}
	}
	b.dropClaim(name)
	if len(written) > 0 {
		// Recorded even when it claims nothing: a change of the reserved addresses
		// re-dispatches it.
		b.addClaim(name, &claimant{svc: svc, addrs: addrs, since: since})
	}
	return b.affected(name, holders, cands, before)
}

// hasKey reports whether c claims k.
func hasKey(c *claimant, k claimKey) bool {
	return slices.Contains(c.addrs[k.addr], k.port)
}

// keysOf adds c's keys to keys (a new set when nil) and returns it.
func keysOf(c *claimant, keys map[claimKey]bool) map[claimKey]bool {
	if keys == nil {
		keys = map[claimKey]bool{}
	}
	if c != nil {
		for a, ports := range c.addrs {
			for _, p := range ports {
				keys[claimKey{a, p}] = true
			}
		}
	}
	return keys
}

// holders returns the holder of each of keys. Called with mu held.
func (b *addressBook) holders(keys map[claimKey]bool) map[claimKey]types.NamespacedName {
	out := make(map[claimKey]types.NamespacedName, len(keys))
	for k := range keys {
		out[k] = b.holder(k)
	}
	return out
}

// addressClaimants adds to cands every claimant of the addresses: a change of a cluster
// IP moves all their verdicts on it.
func (b *addressBook) addressClaimants(cands map[types.NamespacedName]bool, addrs []netip.Addr) {
	for _, a := range addrs {
		for n := range b.byAddr[a] {
			cands[n] = true
		}
	}
}

// affected returns, after name's change, the other Services whose verdict it may have
// changed: the holders before and after of each key whose holder changed (only a
// holder's verdict on a key depends on who holds it: every other claimant of it is
// refused either way), and the candidates whose verdict is not before's. Sorted by name.
func (b *addressBook) affected(name types.NamespacedName, holders map[claimKey]types.NamespacedName, cands map[types.NamespacedName]bool, before map[types.NamespacedName]string) []*corev1.Service {
	out := map[types.NamespacedName]*corev1.Service{}
	for k, was := range holders {
		if now := b.holder(k); now != was {
			for _, n := range []types.NamespacedName{was, now} {
				if c := b.claimants[n]; c != nil && n != name {
					out[n] = c.svc
				}
			}
		}
	}
	for _, svc := range b.changed(cands, before) {
		out[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = svc
	}
	return sortedServices(out)
}

// sortedServices returns the Services of m sorted by name.
func sortedServices(m map[types.NamespacedName]*corev1.Service) []*corev1.Service {
	if len(m) == 0 {
		return nil
	}
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(x, y *corev1.Service) int {
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	return out
}

// outcomes returns each candidate's verdict: the user addresses it is refused.
func (b *addressBook) outcomes(cands map[types.NamespacedName]bool) map[types.NamespacedName]string {
	out := make(map[types.NamespacedName]string, len(cands))
	for n := range cands {
		if c := b.claimants[n]; c != nil {
			out[n] = b.verdict(n, c)
		}
	}
	return out
}

// verdict is the sorted list of c's user addresses it is refused, as one string.
func (b *addressBook) verdict(name types.NamespacedName, c *claimant) string {
	var refused []netip.Addr
	for a := range b.refusedOf(name, c, userAddresses(c.svc)) {
		refused = append(refused, a)
	}
	slices.SortFunc(refused, netip.Addr.Compare)
	var sb strings.Builder
	for _, a := range refused {
		sb.WriteString(a.String())
		sb.WriteByte(' ')
	}
	return sb.String()
}

// changed returns the candidates (still claimants) whose verdict is not before's, sorted
// by name.
func (b *addressBook) changed(cands map[types.NamespacedName]bool, before map[types.NamespacedName]string) []*corev1.Service {
	out := map[types.NamespacedName]*corev1.Service{}
	for n := range cands {
		c := b.claimants[n]
		if c == nil {
			continue
		}
		if was, ok := before[n]; !ok || was != b.verdict(n, c) {
			out[n] = c.svc
		}
	}
	return sortedServices(out)
}

// forget removes a deleted Service and returns the Services whose verdicts changed.
func (b *addressBook) forget(name types.NamespacedName) []*corev1.Service {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdingsValid = false
	holders := b.holders(keysOf(b.claimants[name], nil))
	cands := map[types.NamespacedName]bool{}
	b.addressClaimants(cands, b.clusterIPsByName[name])
	delete(cands, name)
	before := b.outcomes(cands)
	b.dropClusterIPs(name)
	b.dropClaim(name)
	return b.affected(name, holders, cands, before)
}

// setReserved replaces the reserved addresses, returning the claimants whose verdicts
// changed.
func (b *addressBook) setReserved(r Reserved) []*corev1.Service {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdingsValid = false
	if b.reserved.equal(r) {
		return nil
	}
	return b.reevaluate(func() { b.reserved = r.clone() })
}

// reevaluate applies change, which may move any verdict, and returns the claimants
// whose verdicts it changed. Called with mu held.
func (b *addressBook) reevaluate(change func()) []*corev1.Service {
	all := make(map[types.NamespacedName]bool, len(b.claimants))
	for n := range b.claimants {
		all[n] = true
	}
	before := b.outcomes(all)
	change()
	return b.changed(all, before)
}

// markListed records that the initial lists are in: from now on a new claim is ordered
// by the resourceVersion of the Service version that carries it.
func (b *addressBook) markListed() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdingsValid = false
	b.listed = true
}

// seed records the holders the nodes already running report, for the claims present at
// start, and returns the claimants whose verdicts changed.
func (b *addressBook) seed(hs []Holding) []*corev1.Service {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holdingsValid = false
	return b.reevaluate(func() {
		b.seeded = map[claimKey]types.UID{}
		for _, h := range hs {
			b.seeded[claimKey{h.Addr.Unmap(), portKey{h.Protocol, h.Port}}] = h.UID
		}
		for _, ct := range b.keys {
			ct.holder = types.NamespacedName{}
		}
	})
}

// holdings returns the holder of every key more than one Service claims, sorted.
func (b *addressBook) holdings() []Holding {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holdingsValid {
		return slices.Clone(b.holdingsCache)
	}
	var out []Holding
	for k, ct := range b.keys {
		if len(ct.names) < 2 {
			continue
		}
		h := b.claimants[b.holder(k)]
		out = append(out, Holding{Addr: k.addr, Protocol: k.port.proto, Port: k.port.port, UID: h.svc.UID})
	}
	slices.SortFunc(out, Holding.Compare)
	b.holdingsCache, b.holdingsValid = out, true
	return slices.Clone(out)
}

// refused returns, for each user address of svc that it may not have, why; nil when
// it may have them all. A reserved address is refused whether or not it is a claim.
func (b *addressBook) refused(svc *corev1.Service) map[netip.Addr]string {
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refusedOf(name, b.claimants[name], userAddresses(svc))
}

// refusedOf returns why each of written (name's user addresses) is refused, for those
// that are; c is name's claim, if any. Called with mu held.
func (b *addressBook) refusedOf(name types.NamespacedName, c *claimant, written map[netip.Addr][]portKey) map[netip.Addr]string {
	var out map[netip.Addr]string
	for a := range written {
		why := b.reservedWhy(a)
		if why == "" && c != nil {
			why = b.heldElsewhere(name, c, a)
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
	case metadataService(a) != "":
		return "it is the " + metadataService(a) + " metadata service's address"
	}
	if _, ok := slices.BinarySearchFunc(b.reserved.APIServerIPs, a, netip.Addr.Compare); ok {
		return "it is an endpoint of the API server (default/kubernetes)"
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

// heldElsewhere names the Service holding one of the keys c claims on a, or "" when
// c holds them all (or does not claim a). Called with mu held.
func (b *addressBook) heldElsewhere(name types.NamespacedName, c *claimant, a netip.Addr) string {
	for _, p := range c.addrs[a] {
		if h := b.holder(claimKey{a, p}); h != name && h != (types.NamespacedName{}) {
			return fmt.Sprintf("%s claimed it first", h)
		}
	}
	return ""
}

// holder returns the first-ranked claimant of k, computing it when the cached one left.
// Called with mu held.
func (b *addressBook) holder(k claimKey) types.NamespacedName {
	ct := b.keys[k]
	if ct == nil {
		return types.NamespacedName{}
	}
	if ct.holder == (types.NamespacedName{}) {
		for n := range ct.names {
			if ct.holder == (types.NamespacedName{}) || b.ranksBefore(k, n, ct.holder) {
				ct.holder = n
			}
		}
	}
	return ct.holder
}

// ranksBefore reports whether x's claim on k ranks before y's: the one seen first (by
// resourceVersion); among claims present at start, the seeded holder, then the older
// Service (then by UID: never by name, which a user chooses).
func (b *addressBook) ranksBefore(k claimKey, x, y types.NamespacedName) bool {
	cx, cy := b.claimants[x], b.claimants[y]
	if sx, sy := cx.since[k], cy.since[k]; sx != sy {
		return sx < sy
	}
	if u, ok := b.seeded[k]; ok && cx.since[k] == 0 && (cx.svc.UID == u) != (cy.svc.UID == u) {
		return cx.svc.UID == u
	}
	return older(cx.svc, cy.svc)
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

// sameClaim reports whether svc claims what old records, as the same object.
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

// addClaim records c as name's claim, in the indexes.
func (b *addressBook) addClaim(name types.NamespacedName, c *claimant) {
	b.claimants[name] = c
	for a, ports := range c.addrs {
		if b.byAddr[a] == nil {
			b.byAddr[a] = map[types.NamespacedName]bool{}
		}
		b.byAddr[a][name] = true
		for _, p := range ports {
			k := claimKey{a, p}
			ct := b.keys[k]
			if ct == nil {
				ct = &contest{names: map[types.NamespacedName]bool{}}
				b.keys[k] = ct
			}
			ct.names[name] = true
			if ct.holder != (types.NamespacedName{}) && b.ranksBefore(k, name, ct.holder) {
				ct.holder = name
			}
		}
	}
}

// dropClaim forgets name's user addresses.
func (b *addressBook) dropClaim(name types.NamespacedName) {
	old := b.claimants[name]
	if old == nil {
		return
	}
	for a, ports := range old.addrs {
		delete(b.byAddr[a], name)
		if len(b.byAddr[a]) == 0 {
			delete(b.byAddr, a)
		}
		for _, p := range ports {
			k := claimKey{a, p}
			ct := b.keys[k]
			if ct == nil {
				continue
			}
			delete(ct.names, name)
			switch {
			case len(ct.names) == 0:
				delete(b.keys, k)
			case ct.holder == name:
				ct.holder = types.NamespacedName{}
			}
		}
	}
	delete(b.claimants, name)
}

// dropClusterIPs forgets name's cluster IPs (those it still holds).
func (b *addressBook) dropClusterIPs(name types.NamespacedName) {
	for _, a := range b.clusterIPsByName[name] {
		if b.clusterIPs[a] == name {
			delete(b.clusterIPs, a)
		}
	}
	delete(b.clusterIPsByName, name)
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
