package supervisor

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// hostAddrsFake is a host whose interface addresses a test changes: list is
// Deps.InterfaceAddrs, events Deps.AddrEvents (nil events: none are reported).
type hostAddrsFake struct {
	mu     sync.Mutex
	addrs  []netip.Addr
	err    error
	failed int // listings that returned err
	kick   chan struct{}
	events func(ctx context.Context, changed func()) error
}

func newHostAddrsFake(reportEvents bool, addrs ...string) *hostAddrsFake {
	h := &hostAddrsFake{kick: make(chan struct{}, 1)}
	h.set(addrs...)
	if reportEvents {
		h.events = func(ctx context.Context, changed func()) error {
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-h.kick:
					changed()
				}
			}
		}
	}
	return h
}

func (h *hostAddrsFake) list() ([]netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		h.failed++
		return nil, h.err
	}
	return slices.Clone(h.addrs), nil
}

// failedLists counts the listings that failed.
func (h *hostAddrsFake) failedLists() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed
}

// report reports a change (none made).
func (h *hostAddrsFake) report() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// set replaces the addresses and reports the change.
func (h *hostAddrsFake) set(addrs ...string) {
	h.mu.Lock()
	h.addrs, h.err = nil, nil
	for _, a := range addrs {
		h.addrs = append(h.addrs, netip.MustParseAddr(a))
	}
	h.mu.Unlock()
	h.report()
}

// fail makes the listing fail and reports a change.
func (h *hostAddrsFake) fail(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
	h.report()
}

// TestCIDRNodePortAddressesFollowInterfaces: an instance with CIDR nodePortAddresses
// serves NodePorts on an address added to the node after the start and stops on its
// removal, without a restart, whether the change is reported (netlink) or only found by
// the periodic re-read; a failed listing keeps the addresses in use; the instances the
// change does not concern keep theirs. (Before, the addresses were read at start and on
// Node changes only.)
func TestCIDRNodePortAddressesFollowInterfaces(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events bool
		resync time.Duration
	}{
		{name: "reported changes", events: true, resync: time.Hour},
		{name: "periodic re-read only", resync: 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newHostAddrsFake(tc.events, "192.168.100.1", "10.77.1.9")
			f := startSupervisorWith(t, fixtureOptions{addrs: host, addrResync: tc.resync, configure: func(c *config.Config) {
				for i := range c.Instances {
					if c.Instances[i].Name == "team-a" {
						c.Instances[i].NodePortAddresses = []string{"10.77.0.0/24"}
					}
				}
			}})
			inst := func(name string) func() []netip.Addr {
				return func() []netip.Addr {
					if p := f.sup.Instance(name); p != nil {
						return p.NodePortIPs()
					}
					return nil
				}
			}
			teamA, def := inst("team-a"), inst("default")
			waitAddrs := func(what string, get func() []netip.Addr, want ...string) {
				t.Helper()
				var got []netip.Addr
				testutil.Eventually(t, waitTimeout, what, func() bool {
					got = get()
					return slices.Equal(addrStrings(got), want)
				})
			}
			waitAddrs("team-a on nothing at start (no address in 10.77.0.0/24)", teamA)
			waitAddrs("the default instance on the Node's primary IP", def, "192.168.100.1")

			host.set("192.168.100.1", "10.77.1.9", "10.77.0.5", "fe80::1")
			waitAddrs("team-a on the added 10.77.0.5", teamA, "10.77.0.5")
			host.fail(errors.New("netlink: simulated failure"))
			// Two failed re-reads: the refreshes are serialized, so the first one is
			// done with team-a when the second lists.
			testutil.Eventually(t, waitTimeout, "a failed re-read", func() bool { return host.failedLists() >= 1 })
			host.report()
			testutil.Eventually(t, waitTimeout, "a second failed re-read", func() bool { return host.failedLists() >= 2 })
			if got := teamA(); !slices.Equal(addrStrings(got), []string{"10.77.0.5"}) {
				t.Errorf("a failed listing changed team-a's NodePort addresses to %v", got)
			}
			host.set("192.168.100.1", "10.77.1.9")
			waitAddrs("team-a on nothing once 10.77.0.5 is gone", teamA)
			if got := def(); !slices.Equal(addrStrings(got), []string{"192.168.100.1"}) {
				t.Errorf("the default instance's NodePort addresses moved to %v", got)
			}
		})
	}
}

func addrStrings(addrs []netip.Addr) []string {
	out := []string{}
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}
