package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/shardproxy/shardproxy/tables"
)

var _ Interface = &Fake{}

// Fake is an in-memory conntrack table for tests. It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	flows []*netlink.ConntrackFlow
	calls []string

	// ListErr, when set before use, is returned by every ListEntries.
	ListErr error
	// DeleteErr, when set before use, is returned by every DeleteFilters, which then
	// deletes nothing.
	DeleteErr error
}

// NewFake returns a Fake holding flows.
func NewFake(flows ...*netlink.ConntrackFlow) *Fake {
	f := &Fake{}
	f.Add(flows...)
	return f
}

// Add inserts flows into the table.
func (f *Fake) Add(flows ...*netlink.ConntrackFlow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows = append(f.flows, flows...)
}

// Flows returns the flows left in the table, in insertion order.
func (f *Fake) Flows() []*netlink.ConntrackFlow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// FlowStrings returns the flows left in the table as FlowString spells them, in
// insertion order.
func (f *Fake) FlowStrings() []string {
	var out []string
	for _, flow := range f.Flows() {
		out = append(out, FlowString(flow))
	}
	return out
}

// Calls returns every call made so far, in order, as "ListEntries IPv4" or
// "DeleteFilters IPv6".
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// ListEntries returns copies of the family's flows, as a fresh dump would.
func (f *Fake) ListEntries(family tables.Family) ([]*netlink.ConntrackFlow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "ListEntries "+family.String())
	if f.ListErr != nil {
		return nil, f.ListErr
	}
	var out []*netlink.ConntrackFlow
	for _, flow := range f.flows {
		if familyOf(flow) == family {
			c := *flow
			out = append(out, &c)
		}
	}
	return out, nil
}

// DeleteFilters deletes the family's flows that match any filter, as netlink does.
func (f *Fake) DeleteFilters(family tables.Family, filters ...netlink.CustomConntrackFilter) (uint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "DeleteFilters "+family.String())
	if f.DeleteErr != nil {
		return 0, f.DeleteErr
	}
	var deleted uint
	f.flows = slices.DeleteFunc(f.flows, func(flow *netlink.ConntrackFlow) bool {
		if familyOf(flow) != family {
			return false
		}
		for _, filter := range filters {
			if filter.MatchConntrackFlow(flow) {
				deleted++
				return true
			}
		}
		return false
	})
	return deleted, nil
}

// familyOf returns the family of a flow, from its FamilyType or else its addresses.
func familyOf(flow *netlink.ConntrackFlow) tables.Family {
	switch flow.FamilyType {
	case syscall.AF_INET:
		return tables.IPv4
	case syscall.AF_INET6:
		return tables.IPv6
	}
	if flow.Forward.DstIP.To4() != nil {
		return tables.IPv4
	}
	return tables.IPv6
}

// NewFlow returns a flow as the kernel reports it for a client that sent to frontend and
// was DNATed to backend; backend equal to frontend makes a flow that was not DNATed.
// The client is not SNATed. proto is tables.TCP, tables.UDP or tables.SCTP.
func NewFlow(proto tables.Protocol, client, frontend, backend netip.AddrPort) *netlink.ConntrackFlow {
	family := uint8(syscall.AF_INET)
	if !frontend.Addr().Unmap().Is4() {
		family = syscall.AF_INET6
	}
	num, ok := protocolNumber(proto)
	if !ok {
		num = syscall.IPPROTO_TCP
	}
	return &netlink.ConntrackFlow{
		FamilyType: family,
		Forward: netlink.IPTuple{
			Protocol: num,
			SrcIP:    netIP(client.Addr()),
			SrcPort:  client.Port(),
			DstIP:    netIP(frontend.Addr()),
			DstPort:  frontend.Port(),
		},
		Reverse: netlink.IPTuple{
			Protocol: num,
			SrcIP:    netIP(backend.Addr()),
			SrcPort:  backend.Port(),
			DstIP:    netIP(client.Addr()),
			DstPort:  client.Port(),
		},
	}
}

// FlowString returns a flow as "udp 10.0.0.1:1234 -> 172.30.0.10:53 via 10.244.1.2:5353",
// its original direction and the backend it reached, for test failures and logs.
func FlowString(flow *netlink.ConntrackFlow) string {
	k := keyOf(flow)
	return fmt.Sprintf("%s %s -> %s via %s", protocolName(k.proto), k.origSrc, k.origDst, k.replySrc)
}

// netIP returns addr the way netlink spells it: 4 bytes for IPv4, 16 for IPv6.
func netIP(addr netip.Addr) net.IP {
	return net.IP(addr.Unmap().AsSlice())
}
