package conntrack

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// flowKey identifies one conntrack entry the way the kernel does: both tuples, the
// protocol and the zone.
type flowKey struct {
	proto    uint8
	zone     uint16
	origSrc  netip.AddrPort
	origDst  netip.AddrPort
	replySrc netip.AddrPort
	replyDst netip.AddrPort
}

// keyOf returns the key of a flow as netlink reports it.
func keyOf(flow *netlink.ConntrackFlow) flowKey {
	return flowKey{
		proto:    flow.Forward.Protocol,
		zone:     flow.Zone,
		origSrc:  addrPort(flow.Forward.SrcIP, flow.Forward.SrcPort),
		origDst:  addrPort(flow.Forward.DstIP, flow.Forward.DstPort),
		replySrc: addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort),
		replyDst: addrPort(flow.Reverse.DstIP, flow.Reverse.DstPort),
	}
}

// addrPort converts a tuple's address, 4 or 16 bytes long, to a comparable value;
// IPv4-mapped IPv6 addresses become IPv4 so both spellings compare equal.
func addrPort(ip net.IP, port uint16) netip.AddrPort {
	addr, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(addr.Unmap(), port)
}

// exactFilter matches exactly the flows it holds. The Cleaner decides which flows are
// stale from one dump, and the delete must not widen that decision: netlink dumps the
// table again to delete, and a flow created in between is matched only if it is the very
// same connection.
type exactFilter map[flowKey]struct{}

var _ netlink.CustomConntrackFilter = exactFilter(nil)

// MatchConntrackFlow reports whether flow is one of the flows of the filter.
func (f exactFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	_, ok := f[keyOf(flow)]
	return ok
}
