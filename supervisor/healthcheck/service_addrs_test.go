package healthcheck

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// recordingListener serves every (address, port) on an ephemeral loopback port and
// records, in order, each socket opened and closed: "open 192.0.2.1:30001".
type recordingListener struct {
	mu  sync.Mutex
	log []string
}

var _ Listener = &recordingListener{}

func (r *recordingListener) Listen(addr netip.Addr, port int) (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	where := netip.AddrPortFrom(addr, uint16(port)).String()
	r.record("open " + where)
	return &recordedListener{Listener: l, closed: func() { r.record("close " + where) }}, nil
}

func (r *recordingListener) record(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

// take returns what was recorded since the last call.
func (r *recordingListener) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

type recordedListener struct {
	net.Listener
	once   sync.Once
	closed func()
}

func (l *recordedListener) Close() error {
	l.once.Do(l.closed)
	return l.Listener.Close()
}

// TestServiceHealthListenAddresses: a health check listens on its instance's node port
// addresses of the Service's IP families only, follows changes of either, and moves
// between instances with different addresses by opening the new sockets before closing
// the old ones (the port answers somewhere throughout).
func TestServiceHealthListenAddresses(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	svc := nsn("shop", "frontend")
	v4, v6, dual := HealthCheck{Port: 30001, IPv4: true}, HealthCheck{Port: 30001, IPv6: true}, HealthCheck{Port: 30001, IPv4: true, IPv6: true}
	type step struct {
		what string
		do   func(sh *ServiceHealth)
		want []string
	}
	sync := func(inst string, hc HealthCheck) func(sh *ServiceHealth) {
		return func(sh *ServiceHealth) { sh.SyncServices(inst, map[types.NamespacedName]HealthCheck{svc: hc}) }
	}
	addrs := func(inst string, list ...string) func(sh *ServiceHealth) {
		return func(sh *ServiceHealth) {
			var out []netip.Addr
			for _, s := range list {
				out = append(out, a(s))
			}
			sh.SetInstanceAddrs(inst, out)
		}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "families pick the addresses", steps: []step{
			{"team-a has one address per family", addrs("team-a", "192.0.2.1", "2001:db8::1"), nil},
			{"an IPv4 Service", sync("team-a", v4), []string{"open 192.0.2.1:30001"}},
			{"becomes dual-stack", sync("team-a", dual), []string{"open [2001:db8::1]:30001"}},
			{"then IPv6 only", sync("team-a", v6), []string{"close 192.0.2.1:30001"}},
		}},
		{name: "moves with the instance's addresses, opening first", steps: []step{
			{"team-a's addresses", addrs("team-a", "192.0.2.1", "2001:db8::1"), nil},
			{"team-a serves it", sync("team-a", dual), []string{"open 192.0.2.1:30001", "open [2001:db8::1]:30001"}},
			{"team-a's nodePortAddresses change", addrs("team-a", "192.0.2.2", "2001:db8::1"),
				[]string{"open 192.0.2.2:30001", "close 192.0.2.1:30001"}},
		}},
		{name: "moves between instances, opening first", steps: []step{
			{"team-a's addresses", addrs("team-a", "192.0.2.1", "2001:db8::1"), nil},
			{"team-b's addresses", addrs("team-b", "198.51.100.1", "2001:db8::1"), nil},
			{"team-a serves it", sync("team-a", dual), []string{"open 192.0.2.1:30001", "open [2001:db8::1]:30001"}},
			{"team-b takes it over", sync("team-b", dual), []string{"open 198.51.100.1:30001", "close 192.0.2.1:30001"}},
			{"team-a lets go", func(sh *ServiceHealth) { sh.SyncServices("team-a", nil) }, nil},
		}},
		{name: "no address in the Service's families listens nowhere", steps: []step{
			{"team-a has IPv4 only", addrs("team-a", "192.0.2.1"), nil},
			{"an IPv6 Service", sync("team-a", v6), nil},
			{"team-a gets an IPv6 address", addrs("team-a", "192.0.2.1", "2001:db8::1"), []string{"open [2001:db8::1]:30001"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingListener{}
			sh := NewServiceHealth(rec, &fakeRecorder{}, nil)
			t.Cleanup(sh.Close)
			for _, st := range tc.steps {
				st.do(sh)
				if got := rec.take(); !slices.Equal(got, st.want) {
					t.Errorf("%s: sockets %v, want %v", st.what, got, st.want)
				}
			}
		})
	}
}

// TestServiceHealthNoAddressIsReported: a health check with nowhere to listen is a
// Warning event naming why, as a port that cannot be bound is.
func TestServiceHealthNoAddressIsReported(t *testing.T) {
	rec := &fakeRecorder{}
	sh := NewServiceHealth(&recordingListener{}, rec, nil)
	t.Cleanup(sh.Close)
	sh.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("192.0.2.1")})
	sh.SyncServices("team-a", map[types.NamespacedName]HealthCheck{nsn("shop", "v6"): {Port: 30001, IPv6: true}})
	events := rec.take()
	if len(events) != 1 || !strings.Contains(events[0].message, "no node port address in the Service's IP families") {
		t.Errorf("events %s, want one saying there is no address to listen on", fmt.Sprint(events))
	}
}

// TestServiceHealthHandedToNewOwner: the old owner syncing first, without the Service
// that moved to another instance, hands the running health check to the new owner
// rather than closing it (the new owner's addresses opened before the old ones close);
// the new owner's sync keeps it; a Service nobody else took is closed.
func TestServiceHealthHandedToNewOwner(t *testing.T) {
	rec := &recordingListener{}
	sh := NewServiceHealth(rec, &fakeRecorder{}, nil)
	t.Cleanup(sh.Close)
	owners := map[types.NamespacedName]string{}
	var mu sync.Mutex
	sh.SetOwnerLookup(func(n types.NamespacedName) string { mu.Lock(); defer mu.Unlock(); return owners[n] })
	setOwner := func(n types.NamespacedName, inst string) { mu.Lock(); defer mu.Unlock(); owners[n] = inst }
	sh.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("192.0.2.1")})
	sh.SetInstanceAddrs("team-b", []netip.Addr{netip.MustParseAddr("198.51.100.1")})
	moved, dropped := nsn("shop", "moved"), nsn("shop", "dropped")
	hc := func(port int32) HealthCheck { return HealthCheck{Port: port, IPv4: true} }
	setOwner(moved, "team-a")
	setOwner(dropped, "team-a")
	sh.SyncServices("team-a", map[types.NamespacedName]HealthCheck{moved: hc(30001), dropped: hc(30002)})
	rec.take()

	setOwner(moved, "team-b") // relabeled; team-b has not synced yet
	setOwner(dropped, "")     // deleted
	sh.SyncServices("team-a", nil)
	got := rec.take()
	if slices.Index(got, "open 198.51.100.1:30001") > slices.Index(got, "close 192.0.2.1:30001") {
		t.Errorf("team-a's sync: sockets %v: the new owner's address must open before the old closes", got)
	}
	slices.Sort(got)
	if want := []string{"close 192.0.2.1:30001", "close 192.0.2.1:30002", "open 198.51.100.1:30001"}; !slices.Equal(got, want) {
		t.Errorf("team-a's sync: sockets %v, want %v", got, want)
	}
	sh.SyncServices("team-b", map[types.NamespacedName]HealthCheck{moved: hc(30001)})
	if got := rec.take(); len(got) != 0 {
		t.Errorf("team-b's sync: sockets %v, want none (it already serves the port)", got)
	}
	sh.SyncServices("team-b", nil)
	if got := rec.take(); !slices.Equal(got, []string{"close 198.51.100.1:30001"}) {
		t.Errorf("team-b dropping it: sockets %v, want it closed", got)
	}
}
