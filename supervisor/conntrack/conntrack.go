// Package conntrack deletes the kernel conntrack flows that keep traffic pinned to a
// Service backend that no longer exists, or to a verdict taken before the Service's rules
// could apply.
//
// NAT is decided on a flow's first packet only; every later packet follows the conntrack
// entry. TCP and SCTP endpoints that go away reset their connections, so clients open new
// ones, but a UDP client keeps sending into the stale entry until it times out. The
// Cleaner removes exactly those entries after each successful sync, the way upstream
// kube-proxy's pkg/proxy/conntrack does; SCTP is cleaned the same way for safety. Beyond
// upstream, it also removes the unanswered TCP entries of SYNs that reached a Service
// address before any rule did, which would otherwise turn away every SYN of that tuple
// for two minutes.
//
// The whole decision lives here: the Sweeper works out, after each sync of an instance,
// what changed and which endpoints still serve besides the rules (terminating pods, the
// model of a Service another local instance took over), and the Cleaner turns that into
// the stale flows and deletes them. The supervisor only answers the Sweeper's questions
// about the node (Node).
package conntrack

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shardproxy/shardproxy/tables"
)

// dumpAttempts bounds how often a conntrack dump is retried when the kernel reports that
// the table changed under it (NLM_F_DUMP_INTR), which a busy node sees routinely.
const dumpAttempts = 3

// Interface is the part of the kernel's conntrack table the Cleaner needs.
type Interface interface {
	// ListEntries returns every flow of the family.
	ListEntries(family tables.Family) ([]*netlink.ConntrackFlow, error)
	// DeleteFilters deletes every flow of the family that matches at least one filter
	// and returns how many it deleted.
	DeleteFilters(family tables.Family, filters ...netlink.CustomConntrackFilter) (uint, error)
}

var _ Interface = &Netlink{}

// Netlink is the Interface on the kernel, over a ctnetlink socket bound to one network
// namespace for its whole life.
type Netlink struct {
	handle *netlink.Handle
}

// New returns a Netlink on the network namespace of the calling thread, which is the
// process's namespace unless the caller moved the thread. The socket stays in that
// namespace even if the thread moves later.
func New() (*Netlink, error) {
	h, err := netlink.NewHandle(syscall.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening conntrack netlink socket: %w", err)
	}
	return &Netlink{handle: h}, nil
}

// NewAt returns a Netlink on the network namespace ns, whatever namespace the calling
// thread is in; tests use it to work on a namespace they created.
func NewAt(ns netns.NsHandle) (*Netlink, error) {
	h, err := netlink.NewHandleAt(ns, syscall.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening conntrack netlink socket in namespace %s: %w", ns, err)
	}
	return &Netlink{handle: h}, nil
}

// Close releases the socket.
func (n *Netlink) Close() {
	n.handle.Close()
}

// ListEntries dumps the family's conntrack table. An interrupted dump is retried; if it
// never completes, the flows seen are returned together with an error wrapping
// netlink.ErrDumpInterrupted, so callers can act on what they got.
func (n *Netlink) ListEntries(family tables.Family) ([]*netlink.ConntrackFlow, error) {
	var flows []*netlink.ConntrackFlow
	var err error
	for range dumpAttempts {
		flows, err = n.handle.ConntrackTableList(netlink.ConntrackTable, inetFamily(family))
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return flows, fmt.Errorf("dumping %s conntrack table: %w", family, err)
	}
	return flows, nil
}

// DeleteFilters deletes the family's flows that match any filter. netlink dumps the table
// again to find them; when that dump is interrupted it deletes what it saw, and the
// delete is retried so that flows it missed go too.
func (n *Netlink) DeleteFilters(family tables.Family, filters ...netlink.CustomConntrackFilter) (uint, error) {
	var total uint
	var err error
	for range dumpAttempts {
		var deleted uint
		deleted, err = n.handle.ConntrackDeleteFilters(netlink.ConntrackTable, inetFamily(family), filters...)
		total += deleted
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return total, fmt.Errorf("deleting %s conntrack flows: %w", family, err)
	}
	return total, nil
}

// inetFamily is the address family ctnetlink filters a dump by.
func inetFamily(family tables.Family) netlink.InetFamily {
	if family == tables.IPv6 {
		return syscall.AF_INET6
	}
	return syscall.AF_INET
}
