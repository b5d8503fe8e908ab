package tables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// element is one set or map element the compiler wants in the table.
type element struct {
	set   string
	isMap bool
	key   []string
	value []string
}

func (e element) object() *knftables.Element {
	el := &knftables.Element{Key: e.key, Value: e.value}
	if e.isMap {
		el.Map = e.set
	} else {
		el.Set = e.set
	}
	return el
}

// entry is one (address, protocol, port) a Service port is reached on. Each entry belongs
// to exactly one Service port; the first claimant keeps it.
type entry struct {
	addr  netip.Addr
	proto Protocol
	port  uint16
}

func (en entry) key() []string {
	return []string{en.addr.String(), string(en.proto), strconv.Itoa(int(en.port))}
}

func (en entry) String() string {
	return strings.Join(en.key(), " . ")
}

// compiled is what one Service port puts into the table.
type compiled struct {
	// entries are the entries this port reaches, each with the ids of the elements that
	// exist because of it. Ids, not elements: elements are built and turned into ids at
	// once, so they never reach the heap (there are hundreds of thousands at scale). A
	// slice, not a map: a port has a few entries, and the ledger keeps this for every
	// port (a map of 8 slots per port was megabytes at 10,000 Services).
	entries []entryElements
	// shared are ids of elements several ports may want (cluster IPs, hairpin pairs):
	// refcounted.
	shared []string
	// pick are the shared pick chains the elements jump to (refcounted).
	pick []string
	// objects are the chains and sets of this port alone (ClientIP affinity); their maps
	// are nil for other ports.
	objects portObjects
	// rules are the port's rules in chains other ports write rules in too (the
	// round-robin and affinity buckets).
	rules []ruleGroup
}

// entryElements are the ids of the elements that exist because of one entry, and its
// consistent-hash table in ch-slots if it has one (those elements are not in ids).
type entryElements struct {
	entry string
	ids   []string
	slots *slotTable
}

// compiler turns ServicePorts into elements and knows the family's tokens.
type compiler struct {
	cfg     *Config
	ip      string // "ip" or "ip6"
	addrTyp string // "ipv4_addr" or "ipv6_addr"
	nodeIPs []netip.Addr
	npIPs   []netip.Addr
	// slots are the slots of a rotation table as ch-slots keys: "0" to "255"; slotPrefix
	// the start of each one's element ids.
	slots      []string
	slotPrefix []string
	// slotPayload is the raw payload of the client address's last byte: @nh,120,8
	// (IPv4), @nh,184,8 (IPv6).
	slotPayload string
}

func newCompiler(cfg *Config) *compiler {
	c := &compiler{cfg: cfg, ip: "ip", addrTyp: "ipv4_addr"}
	if cfg.Family == IPv6 {
		c.ip, c.addrTyp = "ip6", "ipv6_addr"
	}
	c.slotPayload = "@nh,120,8" // the source address is bytes 12-15 of the IPv4 header
	if cfg.Family == IPv6 {
		c.slotPayload = "@nh,184,8" // and bytes 8-23 of the IPv6 header
	}
	c.slots = make([]string, ConsistentTableSlots)
	for i := range c.slots {
		c.slots[i] = strconv.Itoa(i)
	}
	c.slotPrefix = slotPrefixes(c.slots)
	for _, a := range cfg.NodeIPs {
		if cfg.Family.Contains(a) {
			c.nodeIPs = append(c.nodeIPs, a)
		}
	}
	c.npIPs = ServedNodePortIPs(cfg.Family, cfg.NodePortIPs)
	return c
}

// ServedNodePortIPs are the addresses of ips in fam that NodePorts are served on, in
// order, without repeats. Never loopback (that would need route_localnet and would let
// anything on the node reach Services through 127.0.0.1), nor unspecified.
func ServedNodePortIPs(fam Family, ips []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range ips {
		if fam.Contains(a) && !a.IsLoopback() && !a.IsUnspecified() && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// compile computes the elements of one Service port. Entries for which mayTake returns
// false are left out (another port already serves that address and port).
func (c *compiler) compile(sp *ServicePort, mayTake func(entry string) bool) *compiled {
	out := &compiled{}
	if !c.cfg.Family.Contains(sp.ClusterIP) || sp.Port == 0 {
		return out
	}
	pc := &portCompiler{c: c, sp: sp, out: out, pick: map[string]bool{}, epStrs: map[endpointClass][][]string{},
		internal: sp.internalEndpoints(), external: sp.externalEndpoints(), noEndpoints: "goto " + chainReject,
		mode: sp.LoadBalancing.OrRandom(), tables: map[endpointClass][]int{}}
	if sp.HasEndpoints {
		// Endpoints exist elsewhere, just not for this policy: drop, as upstream does.
		pc.noEndpoints = "drop"
	}
	pc.aff = c.newAffinity(sp, out)
	out.shared = append(out.shared, element{set: setClusterIPs, key: []string{sp.ClusterIP.String()}}.id())

	cip := entry{sp.ClusterIP, sp.Protocol, sp.Port}
	if mayTake(pc.entryID(cip)) {
		pc.clusterIP(cip)
		pc.cip = cip
	}
	ext, lbs := c.externalEntries(sp)
	fw := c.firewallFor(sp)
	for _, en := range ext {
		// An external address that is also the cluster IP (or a NodePort on a node IP
		// listed as external, with the same port) is one entry: the first treatment wins,
		// as the first rule would upstream, and no element is written twice.
		if en == cip || !mayTake(pc.entryID(en)) {
			continue
		}
		pc.externalEntry(en)
		if lbs[en.addr] && en.port == sp.Port {
			pc.firewall(en, fw)
		}
	}
	out.shared = append(out.shared, hairpinIDs(sp)...)
	for ch := range pc.pick {
		out.pick = append(out.pick, ch)
	}
	slices.Sort(out.pick)
	if pc.aff != nil {
		pc.aff.finish()
	}
	return out
}

// portCompiler is the state of compiling one Service port.
type portCompiler struct {
	c   *compiler
	sp  *ServicePort
	out *compiled
	aff *affinity
	// internal and external are the endpoints of the cluster IP's and of the external
	// entries' traffic policy; noEndpoints the verdict for an entry without any.
	internal, external []Endpoint
	noEndpoints        string
	// pick collects the pick chains the elements jump to.
	pick map[string]bool
	// Elements come in runs per entry: its id is made once per run.
	lastEntry entry
	lastID    string
	// epStrs holds each class's endpoint strings, made once for all its entries.
	epStrs map[endpointClass][][]string
	// mode is the port's load-balancing mode; tables its consistent-hash tables per
	// class; id its portID for round-robin chains (made on first use).
	mode   LBMode
	tables map[endpointClass][]int
	id     string
	// cip is the port's cluster IP entry once the port holds it (zero otherwise); its
	// consistent-hash table can serve the port's other entries (sharesClusterIPTable).
	cip entry
	// translated holds the entries whose cluster-ip-of and cluster-port-of elements
	// are written.
	translated map[entry]bool
}

func (pc *portCompiler) entryID(en entry) string {
	if en != pc.lastEntry || pc.lastID == "" {
		pc.lastEntry, pc.lastID = en, en.String()
	}
	return pc.lastID
}

// add records an element that exists because of entry en.
func (pc *portCompiler) add(en entry, e element) {
	ee := pc.entryRecord(en)
	ee.ids = append(ee.ids, e.id())
}

// entryRecord returns the record of en's elements, adding it on first use.
func (pc *portCompiler) entryRecord(en entry) *entryElements {
	id := pc.entryID(en)
	entries := pc.out.entries
	k := len(entries) - 1
	for k >= 0 && entries[k].entry != id { // an entry's elements mostly come together
		k--
	}
	if k < 0 {
		pc.out.entries = append(entries, entryElements{entry: id})
		k = len(entries)
	}
	return &pc.out.entries[k]
}

func (pc *portCompiler) endpointStrings(class endpointClass, eps []Endpoint) [][]string {
	if strs, ok := pc.epStrs[class]; ok {
		return strs
	}
	strs := make([][]string, len(eps))
	for i, ep := range eps {
		strs[i] = []string{ep.IP.String(), strconv.Itoa(int(ep.Port))}
	}
	pc.epStrs[class] = strs
	return strs
}

// dispatch sends an entry to the endpoints of one policy class: through the affinity
// chain of the class, or through the pick chain of the port's mode, which DNATs through
// the entry's elements of the endpoint map (one per endpoint; one per slot of the
// consistent-hash table).
func (pc *portCompiler) dispatch(en entry, eps []Endpoint, class endpointClass) {
	vmap, epMap := mapServiceIPs, mapEndpoints
	if class == classCluster {
		vmap, epMap = mapShortCircuit, mapClusterEndpoints
	}
	key := en.key()
	if pc.aff != nil {
		pc.add(en, element{set: vmap, isMap: true, key: key, value: []string{"goto " + pc.affinityTarget(en, eps, class)}})
		return
	}
	if pc.sharesClusterIPTable(en, eps) {
		pc.viaClusterIP(en, vmap, len(eps))
		return
	}
	var chain string
	var slots []int
	switch {
	case pc.mode != LBRoundRobin || !pc.inBucket(en, eps):
		chain, slots = pc.picker(class, eps)
	case en != pc.clusterIPEntry():
		pc.viaRoundRobinBucket(en, vmap)
		return
	default:
		chain = pc.roundRobinRule(en, len(eps))
	}
	pc.add(en, element{set: vmap, isMap: true, key: key, value: []string{"goto " + chain}})
	strs := pc.endpointStrings(class, eps)
	if slots != nil && pc.c.rotates(class == classCluster, len(slots)) {
		pc.entryRecord(en).slots = newSlotTable(key, strs, slots)
		return
	}
	epSet := endpointsMap(epMap, en.proto)
	n := len(eps)
	if slots != nil {
		n = len(slots)
	}
	for i := range n {
		ep := i
		if slots != nil {
			ep = slots[i]
		}
		pc.add(en, element{set: epSet, isMap: true, key: []string{key[0], key[2], strconv.Itoa(i)}, value: strs[ep]})
	}
}

// sharesClusterIPTable reports whether entry en, dispatched to eps, can use the
// consistent-hash table its port writes for the cluster IP entry instead of a copy of
// its own (256 elements): the port holds its cluster IP entry and eps are the cluster
// IP's endpoints (the same slice: the same policy class).
func (pc *portCompiler) sharesClusterIPTable(en entry, eps []Endpoint) bool {
	return pc.mode == LBConsistentHash && pc.cip.addr.IsValid() && en != pc.cip &&
		sameEndpoints(eps, pc.internal)
}

// viaClusterIP dispatches en to the pick chain that rewrites the packet's destination to
// the port's cluster IP and port (read from cluster-ip-of and cluster-port-of by the
// connection's original destination) and looks the client's slot up in the cluster
// IP's table. The rewrite only feeds the lookup: the DNAT that follows replaces the
// destination, and conntrack keeps the original one for the replies.
func (pc *portCompiler) viaClusterIP(en entry, vmap string, n int) {
	slots := ConsistentTableSize(n)
	chain := pickViaClusterIPChain(slots)
	// The chain goes on to the cluster IP entry's pick chain, which must exist.
	pc.pick[chain], pc.pick[pickChainFor(LBConsistentHash, false, slots)] = true, true
	pc.add(en, element{set: vmap, isMap: true, key: en.key(), value: []string{"goto " + chain}})
	pc.translate(en)
}

// translate writes en's cluster-ip-of and cluster-port-of elements, once.
func (pc *portCompiler) translate(en entry) {
	if pc.translated[en] {
		return
	}
	if pc.translated == nil {
		pc.translated = map[entry]bool{}
	}
	pc.translated[en] = true
	pc.add(en, element{set: mapClusterIPOf, isMap: true, key: en.key(), value: []string{pc.cip.addr.String()}})
	pc.add(en, element{set: mapClusterPortOf, isMap: true, key: en.key(), value: []string{strconv.Itoa(int(pc.cip.port))}})
}

// clusterIPEntry is the port's cluster IP entry, held or not.
func (pc *portCompiler) clusterIPEntry() entry {
	return entry{pc.sp.ClusterIP, pc.sp.Protocol, pc.sp.Port}
}

// inBucket reports whether entry en, dispatched to eps, is served by its port's rules
// in a bucket chain (round robin, affinity): the cluster IP entry, and once the port
// holds that, every entry dispatched to the cluster IP's endpoints (the same slice:
// the same policy class, or the short circuit's when they are the same), which the
// bucket rules find by the cluster IP and port after pick-rr-cip or pick-aff-cip
// rewrote the destination. A port that lost its cluster IP entry to an older claim has
// no rules to go on to: its entries keep chains of their own (rrChain, affinity.chain).
func (pc *portCompiler) inBucket(en entry, eps []Endpoint) bool {
	return sameEndpoints(eps, pc.internal) && (en == pc.clusterIPEntry() || pc.cip.addr.IsValid())
}

// affinityTarget returns the chain an affinity port's entry en, dispatched to eps,
// goes to: its affinity bucket, where the cluster IP entry puts the port's rules; for
// the port's other entries with those endpoints, the chain that rewrites the
// destination to the cluster IP and port and goes on to the bucket; for entries with
// other endpoints, a class chain of the port's own.
func (pc *portCompiler) affinityTarget(en entry, eps []Endpoint, class endpointClass) string {
	if !pc.inBucket(en, eps) {
		return pc.aff.chain(class, eps)
	}
	cip := pc.clusterIPEntry()
	if en != cip {
		chain := pickViaAffinityChain(bucketOf(cip))
		pc.pick[chain] = true
		pc.translate(en)
		return chain
	}
	chain := affinityBucketChain(bucketOf(cip))
	pc.out.rules = append(pc.out.rules, ruleGroup{chain: chain, key: pc.groupKey(en), rules: affinityRules(en, pc.aff.rules(eps))})
	return chain
}

// roundRobinRule writes the port's rule, for its cluster IP entry en over n endpoints,
// into en's bucket chain, and returns the chain.
func (pc *portCompiler) roundRobinRule(en entry, n int) string {
	chain := roundRobinBucketChain(bucketOf(en))
	pc.out.rules = append(pc.out.rules, ruleGroup{chain: chain, key: pc.groupKey(en), rules: []BucketRule{roundRobinRule(en, n)}})
	pc.roundRobinPicks(false, n)
	return chain
}

// groupKey is the key of the port's rule group for its cluster IP entry en: the entry
// and the port, since within one change an older claim may take the entry while the
// younger port still holds its group (ledger.settle releases it afterwards).
func (pc *portCompiler) groupKey(en entry) string {
	return pc.entryID(en) + " " + pc.sp.Name.String()
}

// viaRoundRobinBucket dispatches en, an entry other than the cluster IP's, to the chain
// that rewrites the destination to the port's cluster IP and port (see viaClusterIP)
// and goes on to the port's bucket, where the cluster IP's rule and endpoint elements
// serve it: one counter for all the port's entries, and no endpoint elements of its own.
func (pc *portCompiler) viaRoundRobinBucket(en entry, vmap string) {
	chain := pickViaRoundRobinChain(bucketOf(pc.cip))
	pc.pick[chain] = true
	pc.add(en, element{set: vmap, isMap: true, key: en.key(), value: []string{"goto " + chain}})
	pc.translate(en)
}

// picker returns the chain that picks among eps for class in the port's mode, and the
// endpoint index of each element of the entry's endpoint map (nil: element i is
// endpoint i, every mode but consistentHash). The pick chains are
// shared by every port with the same mode and count; round robin needs a counter of the
// port's own, so its chain is the port's (rrChain).
func (pc *portCompiler) picker(class endpointClass, eps []Endpoint) (string, []int) {
	cluster := class == classCluster
	switch pc.mode {
	case LBConsistentHash:
		slots := pc.consistentSlots(class, eps)
		chain := pickChainFor(LBConsistentHash, cluster, len(slots))
		pc.pick[chain] = true
		return chain, slots
	case LBRoundRobin:
		return pc.rrChain(cluster, len(eps)), nil
	}
	chain := pickChainFor(pc.mode, cluster, len(eps))
	pc.pick[chain] = true
	return chain, nil
}

// consistentSlots is the consistent-hash table of a class's endpoints, built once per
// port and class.
func (pc *portCompiler) consistentSlots(class endpointClass, eps []Endpoint) []int {
	// Classes often share their endpoints (Cluster policy): one table for all those
	// using every endpoint, kept under classCluster's.
	key := class
	if sameEndpoints(eps, pc.sp.ClusterEndpoints) {
		key = classCluster
	}
	if t, ok := pc.tables[key]; ok {
		return t
	}
	t := consistentTable(eps)
	pc.tables[key] = t
	return t
}

// sameEndpoints reports whether a and b are the same slice.
func sameEndpoints(a, b []Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// rrChain returns the port's round-robin chain over n endpoints, creating it on first
// use: "numgen inc" keeps one counter per rule, so a chain shared with other ports would
// interleave their connections (two Services of two endpoints each, used in turn, would
// each always get the same endpoint). Every entry of the port with n endpoints in the
// same map shares the chain, and so one counter. The rule only picks an index k, through
// the shared round-robin-picks map (k : goto pick-at-<k>), and the shared pick-at-<k>
// chain looks up element k of the endpoint map. A rule per port that bound the endpoint
// map, or an anonymous vmap, would cost the kernel a walk of every element of that map,
// or of every set of the table, per port (issue 14); this map has max(n) elements.
func (pc *portCompiler) rrChain(cluster bool, n int) string {
	name := fmt.Sprintf("%s%s-%d", roundRobinPrefix, pc.portID(), n)
	picks := mapRoundRobinPicks
	if cluster {
		name = fmt.Sprintf("%s%s-cluster-%d", roundRobinPrefix, pc.portID(), n)
		picks = mapRoundRobinClusterPicks
	}
	if pc.out.objects.chains == nil {
		pc.out.objects = newPortObjects()
	}
	if _, ok := pc.out.objects.chains[name]; !ok {
		pc.roundRobinPicks(cluster, n)
		pc.out.objects.chains[name] = []string{fmt.Sprintf("%s vmap @%s",
			pickExpr(LBRoundRobin, pc.c.ip, n), picks)}
	}
	return name
}

// roundRobinPicks takes the elements 0..n-1 of the round-robin-picks map (cluster:
// round-robin-cluster-picks) and their pick-at chains.
func (pc *portCompiler) roundRobinPicks(cluster bool, n int) {
	picks := mapRoundRobinPicks
	if cluster {
		picks = mapRoundRobinClusterPicks
	}
	for k := range n {
		at := pickChainFor(LBRoundRobin, cluster, k)
		pc.pick[at] = true
		pc.out.shared = append(pc.out.shared, element{set: picks, isMap: true,
			key: []string{strconv.Itoa(k)}, value: []string{"goto " + at}}.id())
	}
}

func (pc *portCompiler) portID() string {
	if pc.id == "" {
		spn := pc.sp.Name
		spn.Protocol = pc.sp.Protocol
		pc.id = portID(spn, LBRoundRobin)
	}
	return pc.id
}

// dispatchOrRefuse dispatches en to eps, or, without any, refuses it.
func (pc *portCompiler) dispatchOrRefuse(en entry, eps []Endpoint, class endpointClass) {
	if len(eps) > 0 {
		pc.dispatch(en, eps, class)
		return
	}
	pc.add(en, element{set: mapNoEndpoints, isMap: true, key: en.key(), value: []string{pc.noEndpoints}})
}

func (pc *portCompiler) clusterIP(en entry) {
	pc.dispatchOrRefuse(en, pc.internal, classInternal)
}

// externalEntry compiles an external IP, load-balancer IP or NodePort entry.
func (pc *portCompiler) externalEntry(en entry) {
	if pc.sp.ExternalLocal {
		// Local policy keeps the client IP, except for the node itself, whose source
		// would be the external address; local pods and the node short-circuit to all
		// endpoints, as if they had gone out to the load balancer and back.
		pc.add(en, element{set: setExternalLocal, key: en.key()})
		if len(pc.sp.ClusterEndpoints) > 0 {
			pc.dispatch(en, pc.sp.ClusterEndpoints, classCluster)
		}
	} else {
		pc.add(en, element{set: setExternalMasq, key: en.key()})
	}
	pc.dispatchOrRefuse(en, pc.external, classExternal)
}

// firewallRanges are a port's loadBalancerSourceRanges for this family, and whether
// they let the node itself in.
type firewallRanges struct {
	ranges     []netip.Prefix
	allowLocal bool
}

func (c *compiler) firewallFor(sp *ServicePort) firewallRanges {
	fw := firewallRanges{ranges: c.sourceRanges(sp.SourceRanges)}
	for _, r := range fw.ranges {
		for _, n := range c.nodeIPs {
			if r.Contains(n) {
				fw.allowLocal = true
			}
		}
	}
	return fw
}

// firewall guards a load-balancer entry with its source ranges, if it has any.
func (pc *portCompiler) firewall(en entry, fw firewallRanges) {
	if len(fw.ranges) == 0 {
		return
	}
	pc.add(en, element{set: setFirewallIPs, key: en.key()})
	for _, r := range fw.ranges {
		pc.add(en, element{set: setFirewallAllow, key: append(en.key(), r.String())})
	}
	if fw.allowLocal {
		pc.add(en, element{set: setFirewallLocal, key: en.key()})
	}
}

// externalEntries returns the external IP, load-balancer IP and NodePort entries of a
// port in this family, each once, and which addresses are load balancers'.
func (c *compiler) externalEntries(sp *ServicePort) ([]entry, map[netip.Addr]bool) {
	var ext []entry
	seen := map[netip.Addr]bool{}
	lbs := map[netip.Addr]bool{}
	for _, a := range sp.ExternalIPs {
		if c.cfg.Family.Contains(a) && !seen[a] {
			seen[a] = true
			ext = append(ext, entry{a, sp.Protocol, sp.Port})
		}
	}
	for _, a := range sp.LoadBalancerIPs {
		if c.cfg.Family.Contains(a) && !seen[a] {
			seen[a] = true
			lbs[a] = true
			ext = append(ext, entry{a, sp.Protocol, sp.Port})
		}
	}
	if sp.NodePort != 0 {
		for _, a := range c.npIPs {
			if en := (entry{a, sp.Protocol, sp.NodePort}); !slices.Contains(ext, en) {
				ext = append(ext, en)
			}
		}
	}
	return ext, lbs
}

// hairpinIDs are the hairpin elements of a port: a pod that reaches itself through the
// Service must be masqueraded. Each endpoint address once (sorted and compacted: one
// allocation, unlike a set).
func hairpinIDs(sp *ServicePort) []string {
	hp := make([]netip.Addr, 0, len(sp.ClusterEndpoints)+len(sp.LocalEndpoints))
	for _, eps := range [][]Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, ep := range eps {
			hp = append(hp, ep.IP)
		}
	}
	slices.SortFunc(hp, netip.Addr.Compare)
	hp = slices.Compact(hp)
	ids := make([]string, len(hp))
	for i, a := range hp {
		ip := a.String()
		ids[i] = element{set: setHairpin, key: []string{ip, ip}}.id()
	}
	return ids
}

// endpointClass is which endpoints of a Service port a way in uses; its value is part
// of the chain and set names it picks among.
type endpointClass string

// The endpoint classes of a Service port.
const (
	classInternal endpointClass = "int" // cluster IP: internalTrafficPolicy
	classExternal endpointClass = "ext" // from outside: externalTrafficPolicy
	classCluster  endpointClass = "clu" // Local-policy short circuit for pods and the node: all endpoints
)

// affinity builds the per-port chains and sets of a ClientIP-affinity Service port, as
// upstream behaves: a set per endpoint remembers its clients, and a chain per set of
// endpoints (chain) first sends remembered clients back to their endpoint, then places
// a new one by the port's load-balancing mode.
type affinity struct {
	c   *compiler
	sp  *ServicePort
	out *compiled
	id  string
	// chains are the port's class chains so far, with the endpoints each chooses among.
	chains []classChain
	eps    map[Endpoint]bool
}

// classChain is an affinity chain and the endpoints it chooses among.
type classChain struct {
	name string
	eps  []Endpoint
}

func (c *compiler) newAffinity(sp *ServicePort, out *compiled) *affinity {
	if sp.AffinityTimeout <= 0 {
		return nil
	}
	spn := sp.Name
	spn.Protocol = sp.Protocol
	// The timeout is part of the id: sets cannot change their timeout in place.
	id := portID(spn, sp.AffinityTimeout)
	out.objects = newPortObjects()
	return &affinity{c: c, sp: sp, out: out, id: id, eps: map[Endpoint]bool{}}
}

func (a *affinity) epSet(ep Endpoint) string { return affinityPrefix + a.id + "-" + endpointID(ep) }

// chain returns the class chain for eps, creating it on first use; classes with the
// same endpoints (both traffic policies Cluster, the usual case) share the first one's.
// Its rules send a remembered client back to its endpoint, then place a new one by the
// port's mode; each rule that picks an endpoint also remembers the client and DNATs, so
// the port needs no chain per endpoint. Every commit costs the kernel ~18 ns per chain
// in the namespace (tables/README.md, "Sync"), and a chain per endpoint made the
// affinity chains most of a table's at 100,000 Services.
func (a *affinity) chain(class endpointClass, eps []Endpoint) string {
	for _, ch := range a.chains {
		if slices.Equal(ch.eps, eps) {
			return ch.name
		}
	}
	name := affinityPrefix + a.id + "-" + string(class)
	a.chains = append(a.chains, classChain{name: name, eps: eps})
	a.out.objects.chains[name] = ruleTexts(a.rules(eps))
	return name
}

// rules returns the rules that choose among eps: send a remembered client back to its
// endpoint, then place a new one by the port's mode (in a bucket, each after the
// entry's match: affinityRules).
func (a *affinity) rules(eps []Endpoint) []*affinityRule {
	rules := make([]*affinityRule, 0, 2*len(eps))
	for _, ep := range eps {
		a.eps[ep] = true
		rules = append(rules, &affinityRule{ip: a.c.ip, proto: a.sp.Protocol, set: a.epSet(ep), ep: ep, remembered: true})
	}
	for i, pick := range a.newClientPicks(eps) {
		rules = append(rules, &affinityRule{ip: a.c.ip, proto: a.sp.Protocol, set: a.epSet(eps[i]), ep: eps[i], pick: pick})
	}
	return rules
}

// newClientPicks returns, per endpoint of eps, how a new client is placed on it in the
// port's mode, in rules tried in order: random and roundRobin take endpoint i with
// 1/(n-i) of what rules 0..i-1 left (numgen per rule: the same shares, and the same
// rotation, as one pick among n), the last one unconditionally; sourceHash and
// consistentHash compare the client's hash with the endpoint's index or slots.
func (a *affinity) newClientPicks(eps []Endpoint) []newClientPick {
	n := len(eps)
	picks := make([]newClientPick, n)
	mode := a.sp.LoadBalancing.OrRandom()
	switch mode {
	case LBSourceHash:
		for i := range picks {
			picks[i] = newClientPick{mode: mode, mod: n, value: i}
		}
	case LBConsistentHash:
		table := consistentTable(eps)
		slots := make([][]int, n)
		for slot, ep := range table {
			slots[ep] = append(slots[ep], slot)
		}
		for i := range picks { // every endpoint has a slot: the table has at least n
			picks[i] = newClientPick{mode: mode, mod: len(table), slots: slots[i]}
		}
	default:
		for i := range n - 1 {
			picks[i] = newClientPick{mode: mode, mod: n - i}
		}
	}
	return picks
}

// finish adds the per-endpoint sets the class chains remember clients in.
func (a *affinity) finish() {
	for ep := range a.eps {
		a.out.objects.sets[a.epSet(ep)] = a.sp.AffinityTimeout
	}
}

// affinitySet is the set object of an affinity endpoint.
//
// It has no size: the kernel bounds every set a rule updates to 65535 elements anyway,
// while an explicit size is also the hash table's initial sizing hint, allocated up front
// per set (tables/README.md, "Sync", has the measured cost).
func (c *compiler) affinitySet(name string, timeout time.Duration) *knftables.Set {
	return &knftables.Set{
		Name:    name,
		Type:    c.addrTyp,
		Flags:   []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
		Timeout: ptr(timeout),
	}
}

// sourceRanges keeps this family's ranges, masked and without ranges another one covers
// (the kernel refuses overlapping intervals).
func (c *compiler) sourceRanges(in []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range in {
		if !p.IsValid() || !c.cfg.Family.Contains(p.Addr()) {
			continue
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Bits() - b.Bits() })
	var kept []netip.Prefix
	for _, p := range out {
		covered := false
		for _, k := range kept {
			if k.Contains(p.Addr()) {
				covered = true
				break
			}
		}
		if !covered {
			kept = append(kept, p)
		}
	}
	return kept
}

// pickChainRules returns the rules of a pick chain, from its name (pickChainFor).
func (c *compiler) pickChainRules(name string) ([]string, error) {
	ip := c.ip
	if n, ok := parsePickViaClusterIPChain(name); ok {
		return c.viaClusterIPRules(pickChainFor(LBConsistentHash, false, n)), nil
	}
	if next, ok := parsePickViaBucketChain(name); ok {
		return c.viaClusterIPRules(next), nil
	}
	mode, cluster, n, err := parsePickChain(name)
	if err != nil {
		return nil, err
	}
	if mode == LBConsistentHash && c.rotates(cluster, n) {
		return []string{c.rotationDispatch()}, nil
	}
	pick := pickExpr(mode, ip, n)
	if mode == LBRoundRobin {
		// pick-at-<k>: the index the port's rr chain chose. nft 1.0.6 cannot parse a
		// literal of numgen's unnamed type in the key, but takes a constant numgen.
		pick = fmt.Sprintf("numgen random mod 1 offset %d", n)
	}
	epMap := mapEndpoints
	if cluster {
		epMap = mapClusterEndpoints
	}
	var rules []string
	for _, proto := range allProtocols() {
		rules = append(rules, fmt.Sprintf(
			"meta l4proto %s dnat %s to %s daddr . %s dport . %s map @%s",
			proto, ip, ip, proto, pick, endpointsMap(epMap, proto)))
	}
	return rules, nil
}

// viaClusterIPRules are the rules of pick-ch-cip-<n>, pick-rr-cip-<b> and
// pick-aff-cip-<b>: for each protocol, rewrite the destination to the entry's cluster
// IP and port, keyed by the connection's original destination (the rewritten one would
// miss the second lookup), then go on as the cluster IP entry does, in chain next
// (pick-ch-<n>, rr-bucket-<b>, aff-bucket-<b>).
func (c *compiler) viaClusterIPRules(next string) []string {
	ip := c.ip
	orig := fmt.Sprintf("ct original %s daddr . meta l4proto . ct original proto-dst", ip)
	var rules []string
	for _, proto := range allProtocols() {
		rules = append(rules, fmt.Sprintf(
			"meta l4proto %s %s daddr set %s map @%s %s dport set %s map @%s goto %s",
			proto, ip, orig, mapClusterIPOf, proto, orig, mapClusterPortOf, next))
	}
	return rules
}

// rotationPrefixMask is the mask of the client address's prefix, whose hash picks the
// rotation: all but the last byte.
func (c *compiler) rotationPrefixMask() string {
	if c.cfg.Family == IPv6 {
		return "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00"
	}
	return "255.255.255.0"
}

// rotationDispatch is the rule of pick-ch-256: the hash of the client's prefix chooses
// its rotation chain. An anonymous map in the one shared rule, since the kernel walks a
// named map's elements for every chain that binds it.
func (c *compiler) rotationDispatch() string {
	prefix := c.rotationPrefixMask()
	picks := make([]string, rotations)
	for k := range picks {
		picks[k] = fmt.Sprintf("%d : goto %s", k, rotationChain(k))
	}
	return fmt.Sprintf("jhash %s saddr & %s mod %d seed 0x%x vmap { %s }",
		c.ip, prefix, rotations, HashSeed, strings.Join(picks, " , "))
}

// rotationRules returns the skeleton's rotation chains and their one rule each: DNAT
// through the entry's table in ch-slots at slot (last byte of the client) XOR k. The
// slot comes first in the key, as a raw payload: nft 1.0.6 lists a bitwise operation
// anywhere else in a concatenation without the parentheses it needs to parse it, so a
// saved ruleset (`nft list ruleset`) would not load again. The
// kernel walks a map's elements, flushed ones included, for each chain whose new rules
// bind it: re-adding 256 such chains over 512,000 flushed slots made a full sync's
// transaction 39 s instead of 7-11 s. So the chains are the skeleton's, whose rules a
// full sync adds while ch-slots, recreated rather than flushed, is still empty
// (Skeleton.RecreatedMaps).
func (c *compiler) rotationRules() ([]*knftables.Chain, []*knftables.Rule) {
	chains := make([]*knftables.Chain, rotations)
	rules := make([]*knftables.Rule, rotations)
	for k := range chains {
		name := rotationChain(k)
		chains[k] = &knftables.Chain{Name: name}
		rules[k] = &knftables.Rule{Chain: name, Rule: fmt.Sprintf("dnat %s to %s ^ 0x%x . %s map @%s",
			c.ip, c.slotPayload, rotationXOR(k), c.entryKey(), mapConsistentSlots)}
	}
	return chains, rules
}

// rotates reports whether a consistentHash table of slots slots in the endpoint maps of
// a class (cluster: the short circuit's) is looked up through the rotation chains: the
// table has them (Config.ConsistentHash) and the table is one they serve (usesRotation).
func (c *compiler) rotates(cluster bool, slots int) bool {
	return c.cfg.ConsistentHash && usesRotation(cluster, slots)
}

// leftoverRotation reports whether chain ch, found in the kernel, is a rotation chain
// the skeleton does not have: any, in a table without consistentHash; one numbered
// rotations or more (a version with more rotations wrote it).
func (c *compiler) leftoverRotation(ch string) bool {
	k, ok := parseRotationChain(ch)
	return ok && (!c.cfg.ConsistentHash || k >= rotations)
}

// isDynamicChain reports whether a chain is a pick, affinity or round-robin chain (not
// in the skeleton).
func isDynamicChain(name string) bool {
	return strings.HasPrefix(name, pickPrefix) || strings.HasPrefix(name, affinityPrefix) ||
		strings.HasPrefix(name, roundRobinPrefix)
}

// markMasq is the statement that asks nat-postrouting to masquerade.
func (c *compiler) markMasq() string {
	return fmt.Sprintf("meta mark set meta mark or %s", c.masqMark())
}

func (c *compiler) masqMark() string {
	return fmt.Sprintf("0x%08x", uint32(1)<<c.cfg.MasqueradeBit)
}

// localMatch returns the match for traffic from local pods, or its negation; "" when
// local detection is off for this family.
func (c *compiler) localMatch(negate bool) string {
	op := ""
	if negate {
		op = "!= "
	}
	l := c.cfg.Local
	switch l.Mode {
	case LocalClusterCIDR, LocalNodeCIDR:
		var cidrs []string
		for _, p := range l.CIDRs {
			if p.IsValid() && c.cfg.Family.Contains(p.Addr()) {
				cidrs = append(cidrs, p.Masked().String())
			}
		}
		if len(cidrs) == 0 {
			return ""
		}
		return fmt.Sprintf("%s saddr %s{ %s }", c.ip, op, strings.Join(cidrs, ", "))
	case LocalBridgeInterface:
		if l.Interface == "" {
			return ""
		}
		return fmt.Sprintf("iifname %s%q", op, l.Interface)
	case LocalInterfaceNamePrefix:
		if l.Interface == "" {
			return ""
		}
		return fmt.Sprintf("iifname %s%q", op, l.Interface+"*")
	}
	return ""
}

// entryKey is the packet's entry: destination address, protocol and port.
func (c *compiler) entryKey() string {
	return c.ip + " daddr . meta l4proto . th dport"
}

// skeleton returns the table with its fixed sets, maps and chains and their rules.
func (c *compiler) skeleton(prio Priorities) *Skeleton {
	sets, maps := c.fixedSetsAndMaps()
	var chains []*knftables.Chain
	for _, b := range baseChains(prio) {
		chains = append(chains, b.chain())
	}
	for _, name := range []string{chainServices, chainFirewallCheck, chainReject} {
		chains = append(chains, &knftables.Chain{Name: name})
	}
	table := &knftables.Table{Comment: ptr(OwnerComment(c.cfg.Instance, c.cfg.Supervisor))}
	sk := &Skeleton{Table: table, Chains: chains, Sets: sets, Maps: maps, Rules: c.fixedRules()}
	if c.cfg.ConsistentHash {
		rotChains, rotRules := c.rotationRules()
		sk.Chains, sk.Rules = append(sk.Chains, rotChains...), append(sk.Rules, rotRules...)
		sk.Maps = append(sk.Maps, &knftables.Map{Name: mapConsistentSlots,
			TypeOf:  fmt.Sprintf("%s . %s : %s daddr . th dport", c.slotPayload, c.entryKey(), c.ip),
			Comment: ptr("consistentHash slot . entry -> endpoint")})
		sk.RecreatedMaps = []string{mapConsistentSlots}
	}
	return sk
}

// fixedSetsAndMaps returns the sets and maps every table has.
func (c *compiler) fixedSetsAndMaps() (sets []*knftables.Set, maps []*knftables.Map) {
	ip, at := c.ip, c.addrTyp
	entryType := at + " . inet_proto . inet_service"
	sets = []*knftables.Set{
		{Name: setClusterIPs, Type: at, Comment: ptr("cluster IPs of this instance's Services")},
		{Name: setExternalMasq, Type: entryType, Comment: ptr("external entries of Cluster-policy Services")},
		{Name: setExternalLocal, Type: entryType, Comment: ptr("external entries of Local-policy Services")},
		{Name: setFirewallIPs, Type: entryType, Comment: ptr("LB entries with loadBalancerSourceRanges")},
		{Name: setFirewallAllow, Type: entryType + " . " + at, Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: ptr("LB entry . allowed source range")},
		{Name: setFirewallLocal, Type: entryType, Comment: ptr("LB entries whose source ranges hold a node IP")},
		{Name: setHairpin, Type: at + " . " + at, Comment: ptr("endpoint . endpoint, for hairpin masquerade")},
	}
	maps = []*knftables.Map{
		{Name: mapServiceIPs, Type: entryType + " : verdict", Comment: ptr("entry -> pick chain")},
		{Name: mapShortCircuit, Type: entryType + " : verdict", Comment: ptr("Local-policy entry, from pods and node -> pick chain")},
		{Name: mapNoEndpoints, Type: entryType + " : verdict", Comment: ptr("entry without endpoints -> reject or drop")},
		{Name: mapClusterIPOf, Type: entryType + " : " + at, Comment: ptr("consistentHash entry -> its Service port's cluster IP")},
		{Name: mapClusterPortOf, Type: entryType + " : inet_service", Comment: ptr("consistentHash entry -> its Service port's port")},
		{Name: mapRoundRobinPicks, TypeOf: "numgen inc mod 1 : verdict", Comment: ptr("round-robin index -> pick-at chain")},
		{Name: mapRoundRobinClusterPicks, TypeOf: "numgen inc mod 1 : verdict", Comment: ptr("round-robin index -> pick-cluster-at chain")},
	}
	for _, proto := range allProtocols() {
		// typeof, because the index has numgen's type, which has no name of its own.
		typeOf := fmt.Sprintf("%s daddr . %s dport . numgen random mod 1 : %s daddr . %s dport", ip, proto, ip, proto)
		maps = append(maps,
			&knftables.Map{Name: endpointsMap(mapEndpoints, proto), TypeOf: typeOf, Comment: ptr("address . port . index -> endpoint")},
			&knftables.Map{Name: endpointsMap(mapClusterEndpoints, proto), TypeOf: typeOf, Comment: ptr("address . port . index -> cluster-policy endpoint")})
	}
	return sets, maps
}

// fixedRules returns the rules of the skeleton's chains.
func (c *compiler) fixedRules() []*knftables.Rule {
	ip := c.ip
	var rules []*knftables.Rule
	rule := func(chain string, parts ...string) {
		var nonEmpty []string
		for _, p := range parts {
			if p != "" {
				nonEmpty = append(nonEmpty, p)
			}
		}
		rules = append(rules, &knftables.Rule{Chain: chain, Rule: strings.Join(nonEmpty, " ")})
	}
	key := c.entryKey()

	// Only new connections are checked, as upstream does: narrowing the source ranges
	// must not cut connections already made, and established packets skip the lookup.
	rule(chainFirewallPrerouting, "ct state new", key, "@"+setFirewallIPs, "jump", chainFirewallCheck)
	rule(chainFirewallOutput, "ct state new", key, "@"+setFirewallIPs, "jump", chainFirewallCheck)
	rule(chainFirewallCheck, key, ".", ip, "saddr", "@"+setFirewallAllow, "return")
	rule(chainFirewallCheck, "fib saddr type local", key, "@"+setFirewallLocal, "return")
	rule(chainFirewallCheck, "drop")

	rule(chainNATPrerouting, "jump", chainServices)
	rule(chainNATOutput, "jump", chainServices)

	// Masquerade decisions come first: the DNAT rules below end the chain.
	mark := c.markMasq()
	if c.cfg.MasqueradeAll {
		rule(chainServices, ip, "daddr", "@"+setClusterIPs, mark)
	} else if notLocal := c.localMatch(true); notLocal != "" {
		rule(chainServices, ip, "daddr", "@"+setClusterIPs, notLocal, mark)
	}
	rule(chainServices, key, "@"+setExternalMasq, mark)
	rule(chainServices, "fib saddr type local", key, "@"+setExternalLocal, mark)
	if local := c.localMatch(false); local != "" {
		rule(chainServices, local, key, "vmap", "@"+mapShortCircuit)
	}
	rule(chainServices, "fib saddr type local", key, "vmap", "@"+mapShortCircuit)
	rule(chainServices, key, "vmap", "@"+mapServiceIPs)

	for _, ch := range []string{chainFilterInput, chainFilterForward, chainFilterOutput} {
		rule(ch, "ct state new", key, "vmap", "@"+mapNoEndpoints)
	}
	// A new connection still addressed to a cluster IP after DNAT is to an undefined
	// port. Later packets of a connection were judged by its first one (upstream guards
	// the check the same way), and skip the lookup.
	rule(chainFilterForward, "ct state new", ip, "daddr", "@"+setClusterIPs, "reject")
	rule(chainFilterOutput, "ct state new", ip, "daddr", "@"+setClusterIPs, "reject")
	rule(chainReject, "reject")

	m := c.masqMark()
	rule(chainNATPostrouting, "meta mark &", m, "!= 0 meta mark set meta mark xor", m, "masquerade fully-random")
	rule(chainNATPostrouting, "ct status dnat", ip, "saddr .", ip, "daddr", "@"+setHairpin, "masquerade fully-random")
	return rules
}

func ptr[T any](v T) *T { return &v }
