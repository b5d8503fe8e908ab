package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/tables"
)

// Cleaner deletes stale conntrack flows after syncs. There is one per node,
// shared by every proxy instance: the conntrack table is the node's, not an instance's.
type Cleaner struct {
	ct Interface
	// mu serialises cleanups: instances sync independently, and concurrent dumps of a
	// large table would multiply the memory held for no gain.
	mu sync.Mutex
}

// NewCleaner returns a Cleaner working on ct.
func NewCleaner(ct Interface) *Cleaner {
	return &Cleaner{ct: ct}
}

// Cleanup deletes the conntrack flows made stale by a sync that replaced before with after,
// the previous and the current ports of the Services that changed. A Service port is
// identified by its name and protocol, in the family of its cluster IP; a port missing
// from after, or without a cluster IP there, was deleted. Only flows of the ports given
// are deleted:
//
//   - UDP and SCTP flows sent to one of a port's addresses (cluster IP, external IPs,
//     load balancer IPs) on its port, or to its NodePort on any address, and DNATed to
//     an endpoint that went away (one the port had in either endpoint list and has in
//     neither now);
//   - when a UDP or SCTP port had no endpoints (HasEndpoints false, or the port did not
//     exist) and now has some, flows to those addresses and to its NodePort that were
//     not DNATed: they carry a verdict taken while nothing served the port, and would
//     keep every later packet of the connection away from the new endpoints;
//   - when a TCP port is new (or reachable on an address it was not before), flows to
//     it that were not DNATed and never saw a reply (SYN_SENT). A SYN that arrived before
//     any proxy had rules for the address left such an entry, with no translation, for
//     120 s; every SYN of that tuple, a retransmission or a reused client port, would
//     follow it around the new rules (kubernetes/kubernetes#48719, which upstream leaves
//     open). A flow that never got an answer is no connection, so nothing working is
//     lost. TCP flows DNATed to a gone endpoint are left: the endpoint resets them.
//
// SCTP flows reported without ports, as netlink v1.3.1 reports them all, are matched on
// addresses alone: flows through any port of a Service address DNATed to a gone
// endpoint's address, and flows to the cluster IP that were not DNATed; their NodePort
// flows cannot be told apart and are left.
//
// Each family with anything to clean costs one dump of its conntrack table, matched in
// memory, and one delete of exactly the flows found stale. Cleanup deletes what it can
// and returns how many flows it deleted with every error met, joined.
func (c *Cleaner) Cleanup(ctx context.Context, before, after []*tables.ServicePort) (deleted int, err error) {
	return c.CleanupChange(ctx, Change{Before: before, After: after})
}

// Serving holds, per Service port, endpoints that still answer although the port's
// endpoint lists may leave them out: upstream's serving endpoints, those whose
// EndpointSlice condition "serving" is true or unset, whatever their readiness,
// termination, topology hints or the port's traffic policies. Each endpoint counts in
// the family of its address.
type Serving map[tables.ServicePortName][]tables.Endpoint

// Change is what one sync changed for Cleaner.CleanupChange.
type Change struct {
	// Before and After are the previous and current ports of the Services that changed,
	// as for Cleanup.
	Before, After []*tables.ServicePort
	// WasServing are endpoints that were still serving before the sync besides those
	// of Before's endpoint lists (what the previous cleanup was given as Serving and
	// kept): they can go away without leaving Before's lists, and their flows are stale
	// once they do.
	WasServing Serving
	// Serving are the endpoints serving now besides After's endpoint lists. An endpoint
	// there is never gone: a pod that started to terminate keeps its UDP flows while it
	// still serves, as upstream does, although no new flow reaches it.
	Serving Serving
}

// CleanupChange is Cleanup for a change that also says which endpoints served besides
// the ports' endpoint lists, before and after the sync.
func (c *Cleaner) CleanupChange(ctx context.Context, ch Change) (deleted int, err error) {
	start := time.Now()
	logger := klog.FromContext(ctx)

	plans := planCleanup(logger, ch)
	if len(plans) == 0 {
		logger.V(4).Info("No conntrack flows can be stale", "before", len(ch.Before), "after", len(ch.After))
		return 0, nil
	}

	c.mu.Lock()
	defer c.mu.Unlock()

	var errs []error
	scanned := 0
	for _, family := range []tables.Family{tables.IPv4, tables.IPv6} {
		p := plans[family]
		if p == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("cleaning up %s conntrack flows: %w", family, err))
			break
		}
		n, seen, err := c.cleanFamily(logger, family, p)
		deleted += n
		scanned += seen
		if err != nil {
			errs = append(errs, err)
		}
	}

	err = errors.Join(errs...)
	logger.V(2).Info("Cleaned up stale conntrack flows", "deleted", deleted, "scanned", scanned,
		"elapsed", time.Since(start), "failed", err != nil)
	return deleted, err
}

// cleanFamily dumps one family's table, picks the stale flows and deletes exactly those.
// It returns how many flows it deleted and how many it looked at.
func (c *Cleaner) cleanFamily(logger logr.Logger, family tables.Family, p *plan) (deleted, scanned int, err error) {
	flows, listErr := c.ct.ListEntries(family)
	if listErr != nil {
		listErr = fmt.Errorf("listing %s conntrack flows: %w", family, listErr)
		if len(flows) == 0 {
			return 0, 0, listErr
		}
		// An interrupted dump still names flows that are stale; delete those.
		logger.Error(listErr, "Cleaning up from an incomplete conntrack dump", "family", family, "flows", len(flows))
	}

	stale := exactFilter{}
	for _, flow := range flows {
		if p.stale(flow) {
			stale[keyOf(flow)] = struct{}{}
			logger.V(5).Info("Deleting stale conntrack flow", "family", family, "flow", FlowString(flow))
		}
	}
	if len(stale) == 0 {
		return 0, len(flows), listErr
	}

	n, err := c.ct.DeleteFilters(family, stale)
	if err != nil {
		err = fmt.Errorf("deleting %d stale %s conntrack flows (%d deleted): %w", len(stale), family, n, err)
	}
	logger.V(4).Info("Deleted stale conntrack flows", "family", family, "stale", len(stale), "deleted", n)
	return int(n), len(flows), errors.Join(listErr, err)
}

// frontend is where a client sends to reach a Service port: a Service address and port.
type frontend struct {
	proto uint8
	addr  netip.AddrPort
}

// nodePort is a Service port's NodePort, on whatever address it was reached.
type nodePort struct {
	proto uint8
	port  uint16
}

// endpointSet holds endpoints as the reply source of a DNATed flow shows them.
type endpointSet map[netip.AddrPort]struct{}

// plan says which flows of one family are stale.
type plan struct {
	// goneByFrontend holds, per frontend, the endpoints that went away behind it; a flow
	// to the frontend DNATed to one of them is stale.
	goneByFrontend map[frontend]endpointSet
	// goneByNodePort is goneByFrontend for NodePorts.
	goneByNodePort map[nodePort]endpointSet
	// rejectFrontends are frontends of ports that just got their first endpoints; a flow
	// to one that was not DNATed is stale.
	rejectFrontends map[frontend]struct{}
	// rejectNodePorts is rejectFrontends for NodePorts.
	rejectNodePorts map[nodePort]struct{}

	// netlink (v1.3.1) does not parse SCTP ports: it reports every SCTP flow with ports
	// zero. Such flows are matched on addresses alone, which cannot find NodePort flows.
	// goneByAddr is goneByFrontend without ports, for SCTP.
	goneByAddr map[netip.Addr]map[netip.Addr]struct{}
	// rejectClusterIPs is rejectFrontends without ports, for SCTP; only cluster IPs,
	// since an external or LB IP may be a host address serving other SCTP traffic that
	// was never meant to be DNATed.
	rejectClusterIPs map[netip.Addr]struct{}

	// synSentFrontends are the frontends of TCP ports new to the instance; a flow to one
	// that was not DNATed and never answered is stale.
	synSentFrontends map[frontend]struct{}
	// synSentNodePorts is synSentFrontends for NodePorts.
	synSentNodePorts map[nodePort]struct{}
}

func newPlan() *plan {
	return &plan{
		goneByFrontend:   map[frontend]endpointSet{},
		goneByNodePort:   map[nodePort]endpointSet{},
		rejectFrontends:  map[frontend]struct{}{},
		rejectNodePorts:  map[nodePort]struct{}{},
		goneByAddr:       map[netip.Addr]map[netip.Addr]struct{}{},
		rejectClusterIPs: map[netip.Addr]struct{}{},
		synSentFrontends: map[frontend]struct{}{},
		synSentNodePorts: map[nodePort]struct{}{},
	}
}

// stale reports whether the plan deletes flow.
func (p *plan) stale(flow *netlink.ConntrackFlow) bool {
	k := keyOf(flow)
	switch {
	case k.proto == syscall.IPPROTO_SCTP && k.origDst.Port() == 0:
		return p.staleWithoutPorts(k)
	case k.proto == syscall.IPPROTO_TCP:
		return p.staleSynSent(flow, k)
	case k.proto != syscall.IPPROTO_UDP && k.proto != syscall.IPPROTO_SCTP:
		return false
	}
	fe := frontend{proto: k.proto, addr: k.origDst}
	np := nodePort{proto: k.proto, port: k.origDst.Port()}
	if _, ok := p.goneByFrontend[fe][k.replySrc]; ok {
		return true
	}
	if _, ok := p.goneByNodePort[np][k.replySrc]; ok {
		return true
	}
	if k.replySrc != k.origDst {
		// DNATed: it reached an endpoint that is still there.
		return false
	}
	_, ok := p.rejectFrontends[fe]
	if !ok {
		_, ok = p.rejectNodePorts[np]
	}
	return ok
}

// tcpSynSent is the kernel's TCP conntrack state of a connection whose SYN never got an
// answer (TCP_CONNTRACK_SYN_SENT).
const tcpSynSent = 1

// staleSynSent is stale for a TCP flow: not DNATed, never answered, to a frontend or
// NodePort of a TCP port new to the instance.
func (p *plan) staleSynSent(flow *netlink.ConntrackFlow, k flowKey) bool {
	if k.replySrc != k.origDst {
		return false
	}
	info, ok := flow.ProtoInfo.(*netlink.ProtoInfoTCP)
	if !ok || info.State != tcpSynSent {
		return false
	}
	if _, ok := p.synSentFrontends[frontend{proto: k.proto, addr: k.origDst}]; ok {
		return true
	}
	_, ok = p.synSentNodePorts[nodePort{proto: k.proto, port: k.origDst.Port()}]
	return ok
}

// staleWithoutPorts is stale for an SCTP flow reported without its ports.
func (p *plan) staleWithoutPorts(k flowKey) bool {
	dst, replySrc := k.origDst.Addr(), k.replySrc.Addr()
	if _, ok := p.goneByAddr[dst][replySrc]; ok {
		return true
	}
	if replySrc != dst {
		return false
	}
	_, ok := p.rejectClusterIPs[dst]
	return ok
}

// addGone marks flows DNATed to gone through any frontend of sp as stale.
func (p *plan) addGone(sp *servicePort, gone endpointSet) {
	for _, addr := range sp.frontends {
		fe := frontend{proto: sp.proto, addr: addr}
		if p.goneByFrontend[fe] == nil {
			p.goneByFrontend[fe] = endpointSet{}
		}
		for ep := range gone {
			p.goneByFrontend[fe][ep] = struct{}{}
		}
	}
	if sp.nodePort != 0 {
		np := nodePort{proto: sp.proto, port: sp.nodePort}
		if p.goneByNodePort[np] == nil {
			p.goneByNodePort[np] = endpointSet{}
		}
		for ep := range gone {
			p.goneByNodePort[np][ep] = struct{}{}
		}
	}
}

// addGoneAddrs marks SCTP flows reported without ports, DNATed to one of gone through
// any address of sp, as stale.
func (p *plan) addGoneAddrs(sp *servicePort, gone map[netip.Addr]struct{}) {
	for _, addr := range sp.frontends {
		if p.goneByAddr[addr.Addr()] == nil {
			p.goneByAddr[addr.Addr()] = map[netip.Addr]struct{}{}
		}
		for ep := range gone {
			p.goneByAddr[addr.Addr()][ep] = struct{}{}
		}
	}
}

// addReject marks flows to any frontend of sp that were not DNATed as stale.
func (p *plan) addReject(sp *servicePort) {
	for _, addr := range sp.frontends {
		p.rejectFrontends[frontend{proto: sp.proto, addr: addr}] = struct{}{}
	}
	if sp.nodePort != 0 {
		p.rejectNodePorts[nodePort{proto: sp.proto, port: sp.nodePort}] = struct{}{}
	}
	if sp.proto == syscall.IPPROTO_SCTP {
		// The cluster IP comes first.
		p.rejectClusterIPs[sp.frontends[0].Addr()] = struct{}{}
	}
}

// addSynSent marks unanswered TCP flows that were not DNATed, to the given frontends
// and NodePort (0: none), as stale.
func (p *plan) addSynSent(proto uint8, frontends []netip.AddrPort, port uint16) {
	for _, addr := range frontends {
		p.synSentFrontends[frontend{proto: proto, addr: addr}] = struct{}{}
	}
	if port != 0 {
		p.synSentNodePorts[nodePort{proto: proto, port: port}] = struct{}{}
	}
}

// newFrontends returns where cur is reachable and old (nil for a new port) was not: its
// new frontends, and its NodePort if that is new (else 0).
func newFrontends(old, cur *servicePort) (frontends []netip.AddrPort, port uint16) {
	for _, addr := range cur.frontends {
		if old == nil || !slices.Contains(old.frontends, addr) {
			frontends = append(frontends, addr)
		}
	}
	if cur.nodePort != 0 && (old == nil || old.nodePort != cur.nodePort) {
		port = cur.nodePort
	}
	return frontends, port
}

// portKey identifies a Service port across syncs.
type portKey struct {
	name   tables.ServicePortName
	proto  tables.Protocol
	family tables.Family
}

// servicePort is what cleanup needs of a tables.ServicePort, in comparable form.
type servicePort struct {
	key   portKey
	proto uint8
	// frontends are the cluster IP, then the external IPs and LB IPs, with the port.
	frontends    []netip.AddrPort
	nodePort     uint16
	endpoints    endpointSet // nil for TCP
	hasEndpoints bool
}

// newServicePort converts sp; ok is false for ports that have no rules in any family
// (no cluster IP).
func newServicePort(sp *tables.ServicePort) (_ *servicePort, ok bool) {
	if sp == nil {
		return nil, false
	}
	proto, ok := protocolNumber(sp.Protocol)
	if !ok {
		return nil, false
	}
	clusterIP := sp.ClusterIP.Unmap()
	if !clusterIP.IsValid() {
		return nil, false
	}
	family := tables.IPv4
	if clusterIP.Is6() {
		family = tables.IPv6
	}
	out := &servicePort{
		key:          portKey{name: sp.Name, proto: sp.Protocol, family: family},
		proto:        proto,
		frontends:    []netip.AddrPort{netip.AddrPortFrom(clusterIP, sp.Port)},
		nodePort:     sp.NodePort,
		hasEndpoints: sp.HasEndpoints,
	}
	for _, addr := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		if addr = addr.Unmap(); family.Contains(addr) {
			out.frontends = append(out.frontends, netip.AddrPortFrom(addr, sp.Port))
		}
	}
	if proto == syscall.IPPROTO_TCP {
		// A TCP port's endpoints are never compared (planCleanup): after a first full
		// sync, a set per port of every Service was most of the cleanup's memory.
		return out, true
	}
	out.endpoints = endpointSet{}
	for _, eps := range [][]tables.Endpoint{sp.ClusterEndpoints, sp.LocalEndpoints} {
		for _, ep := range eps {
			if addr := ep.IP.Unmap(); family.Contains(addr) {
				out.endpoints[netip.AddrPortFrom(addr, ep.Port)] = struct{}{}
			}
		}
	}
	return out, true
}

// addServing adds the endpoints of serving that belong to the port, in its family.
func (p *servicePort) addServing(serving Serving) {
	if p.endpoints == nil { // TCP: never compared
		return
	}
	for _, ep := range serving[p.key.name] {
		if addr := ep.IP.Unmap(); p.key.family.Contains(addr) {
			p.endpoints[netip.AddrPortFrom(addr, ep.Port)] = struct{}{}
		}
	}
}

// indexPorts converts ports, adds the serving endpoints to their endpoints, and indexes
// them by key; keys lists the keys in the order the ports came, so logs follow the
// caller's order.
func indexPorts(ports []*tables.ServicePort, serving Serving) (byKey map[portKey]*servicePort, keys []portKey) {
	byKey = map[portKey]*servicePort{}
	for _, sp := range ports {
		p, ok := newServicePort(sp)
		if !ok {
			continue
		}
		p.addServing(serving)
		if _, dup := byKey[p.key]; !dup {
			keys = append(keys, p.key)
		}
		byKey[p.key] = p
	}
	return byKey, keys
}

// planCleanup works out, per family, which flows the change made stale; families with
// nothing to clean have no plan. An endpoint is there before (after) the sync when it is
// in a port's endpoint lists or serving (WasServing, Serving).
func planCleanup(logger logr.Logger, ch Change) map[tables.Family]*plan {
	oldPorts, oldKeys := indexPorts(ch.Before, ch.WasServing)
	newPorts, newKeys := indexPorts(ch.After, ch.Serving)

	plans := map[tables.Family]*plan{}
	planFor := func(family tables.Family) *plan {
		if plans[family] == nil {
			plans[family] = newPlan()
		}
		return plans[family]
	}

	for _, key := range oldKeys {
		old, cur := oldPorts[key], newPorts[key]
		if old.proto == syscall.IPPROTO_TCP {
			// A gone TCP endpoint resets its connections; nothing to clean.
			continue
		}
		gone := endpointSet{}
		for ep := range old.endpoints {
			if cur == nil {
				gone[ep] = struct{}{}
			} else if _, ok := cur.endpoints[ep]; !ok {
				gone[ep] = struct{}{}
			}
		}
		if len(gone) == 0 {
			continue
		}
		logger.V(4).Info("Service port lost endpoints, deleting flows to them",
			"servicePort", old.key.name, "protocol", old.key.proto, "family", old.key.family,
			"endpoints", sortedEndpoints(gone), "portDeleted", cur == nil)
		p := planFor(old.key.family)
		// The stale flows were made through the old frontends; upstream looks at the
		// current ones, which differ only when the Service changed too. Take both.
		p.addGone(old, gone)
		if cur != nil {
			p.addGone(cur, gone)
		}
		if old.proto == syscall.IPPROTO_SCTP {
			// Without ports, only an address no endpoint has any more is gone.
			goneAddrs := map[netip.Addr]struct{}{}
			for ep := range gone {
				goneAddrs[ep.Addr()] = struct{}{}
			}
			if cur != nil {
				for ep := range cur.endpoints {
					delete(goneAddrs, ep.Addr())
				}
			}
			p.addGoneAddrs(old, goneAddrs)
			if cur != nil {
				p.addGoneAddrs(cur, goneAddrs)
			}
		}
	}

	for _, key := range newKeys {
		old, cur := oldPorts[key], newPorts[key]
		if cur.proto == syscall.IPPROTO_TCP {
			// Whatever its endpoints: an entry left now would outlive the port's first
			// endpoints, which bring no new address to trigger this again.
			if frontends, port := newFrontends(old, cur); len(frontends) > 0 || port != 0 {
				logger.V(4).Info("TCP Service port reachable at new addresses, deleting unanswered flows that bypassed NAT",
					"servicePort", cur.key.name, "family", cur.key.family, "portAdded", old == nil)
				planFor(cur.key.family).addSynSent(cur.proto, frontends, port)
			}
			continue
		}
		if !cur.hasEndpoints || (old != nil && old.hasEndpoints) {
			continue
		}
		logger.V(4).Info("Service port got its first endpoints, deleting flows that bypassed NAT",
			"servicePort", cur.key.name, "protocol", cur.key.proto, "family", cur.key.family,
			"portAdded", old == nil)
		p := planFor(cur.key.family)
		p.addReject(cur)
		if old != nil {
			p.addReject(old)
		}
	}
	return plans
}

// sortedEndpoints returns eps as sorted strings, for logs.
func sortedEndpoints(eps endpointSet) []string {
	out := make([]string, 0, len(eps))
	for ep := range eps {
		out = append(out, ep.String())
	}
	slices.Sort(out)
	return out
}

// protocolNumber returns the IP protocol number of a Service protocol.
func protocolNumber(proto tables.Protocol) (uint8, bool) {
	switch proto {
	case tables.TCP:
		return syscall.IPPROTO_TCP, true
	case tables.UDP:
		return syscall.IPPROTO_UDP, true
	case tables.SCTP:
		return syscall.IPPROTO_SCTP, true
	}
	return 0, false
}

// protocolName returns the name of an IP protocol number, for logs.
func protocolName(num uint8) string {
	switch num {
	case syscall.IPPROTO_TCP:
		return string(tables.TCP)
	case syscall.IPPROTO_UDP:
		return string(tables.UDP)
	case syscall.IPPROTO_SCTP:
		return string(tables.SCTP)
	}
	return fmt.Sprintf("proto-%d", num)
}
