package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// inNetns runs fn on an OS thread switched into the namespace named ns: the sockets fn
// opens belong to it.
func inNetns(ns string, fn func() error) error {
	target, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err // the thread stays locked and is discarded
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			errc <- err
			return
		}
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(fnErr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// netnsListener is the real TCPListener, opening its sockets in namespace ns.
type netnsListener struct{ ns string }

func (l netnsListener) Listen(addr netip.Addr, port int) (net.Listener, error) {
	var out net.Listener
	err := inNetns(l.ns, func() error {
		var err error
		out, err = TCPListener{}.Listen(addr, port)
		return err
	})
	return out, err
}

// dialIn connects to addr:port from inside ns; nil means something answered.
func dialIn(ns string, addr netip.Addr, port int) error {
	return inNetns(ns, func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// TestServiceHealthListensInsideNodePortAddressesOnly runs health-check node ports on a
// real kernel, in a namespace holding node addresses inside and outside the instances'
// nodePortAddresses, IPv4 and IPv6: the port answers on the addresses inside and refuses
// connections on those outside and on other families; moving the Service to an instance
// with other addresses moves the listeners, and a client probing all the addresses the
// whole time always finds one answering.
func TestServiceHealthListensInsideNodePortAddressesOnly(t *testing.T) {
	testutil.RequireKernel(t, "ip")
	ns := testutil.NewNetns(t, "sphc-")
	a := netip.MustParseAddr
	// team-a's nodePortAddresses hold the first two, team-b's the next two; the last two
	// are node addresses outside both.
	teamA := []netip.Addr{a("192.0.2.1"), a("2001:db8:1::1")}
	teamB := []netip.Addr{a("198.51.100.1"), a("2001:db8:2::1")}
	outside := []netip.Addr{a("203.0.113.1"), a("2001:db8:3::1")}
	// The node's addresses sit on lo: nothing else is needed to bind and reach them.
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	for _, addr := range append(append(append([]netip.Addr{}, teamA...), teamB...), outside...) {
		bits := 32
		if addr.Is6() {
			bits = 128
		}
		if out, err := exec.Command("ip", "-n", ns, "addr", "add", netip.PrefixFrom(addr, bits).String(), "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("adding %s: %v: %s", addr, err, out)
		}
	}

	sh := NewServiceHealth(netnsListener{ns: ns}, &fakeRecorder{}, nil)
	t.Cleanup(sh.Close)
	sh.SetInstanceAddrs("team-a", teamA)
	sh.SetInstanceAddrs("team-b", teamB)
	svc := types.NamespacedName{Namespace: "shop", Name: "frontend"}
	const port = 30123
	check := func(what string, answering, refused []netip.Addr) {
		t.Helper()
		for _, addr := range answering {
			if err := dialIn(ns, addr, port); err != nil {
				t.Errorf("%s: %s: %v, want an answer", what, addr, err)
			}
		}
		for _, addr := range refused {
			if err := dialIn(ns, addr, port); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: %s: %v, want connection refused", what, addr, err)
			}
		}
	}
	all := func(lists ...[]netip.Addr) []netip.Addr {
		var out []netip.Addr
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}

	sh.SyncServices("team-a", map[types.NamespacedName]HealthCheck{svc: {Port: port, IPv4: true}})
	check("IPv4 Service of team-a", teamA[:1], all(teamA[1:], teamB, outside))
	sh.SyncServices("team-a", map[types.NamespacedName]HealthCheck{svc: {Port: port, IPv4: true, IPv6: true}})
	check("dual-stack Service of team-a", teamA, all(teamB, outside))

	// Move it to team-b while a client probes every address: some address must answer
	// at every instant.
	ctx, cancel := context.WithCancel(context.Background())
	var probes, gaps atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			answered := false
			for _, addr := range all(teamA, teamB) {
				if dialIn(ns, addr, port) == nil {
					answered = true
					break
				}
			}
			probes.Add(1)
			if !answered {
				gaps.Add(1)
			}
		}
	})
	testutil.Eventually(t, 5*time.Second, "the prober to start", func() bool { return probes.Load() > 5 })
	sh.SyncServices("team-b", map[types.NamespacedName]HealthCheck{svc: {Port: port, IPv4: true, IPv6: true}})
	sh.SyncServices("team-a", nil)
	before := probes.Load()
	testutil.Eventually(t, 5*time.Second, "more probes after the move", func() bool { return probes.Load() > before+5 })
	cancel()
	wg.Wait()
	if gaps.Load() != 0 {
		t.Errorf("%d of %d probes found no address answering during the move", gaps.Load(), probes.Load())
	}
	t.Logf("%d probes during the move, %d without an answer", probes.Load(), gaps.Load())
	check("after the move to team-b", teamB, all(teamA, outside))
}

// wildcardListener opens each port on the dual-stack wildcard address (":port", taking
// IPv4 and IPv6 connections on one socket) in namespace ns, whatever address it is
// given.
type wildcardListener struct{ ns string }

func (l wildcardListener) Listen(_ netip.Addr, port int) (net.Listener, error) {
	var out net.Listener
	err := inNetns(l.ns, func() error {
		var err error
		out, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	})
	return out, err
}

// probeIn GETs a health check at addr:port from inside ns: its status and body.
func probeIn(t *testing.T, ns string, addr netip.Addr, port int) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(ns, func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
	}}
	resp, err := client.Get("http://" + netip.AddrPortFrom(addr, uint16(port)).String() + "/")
	if err != nil {
		t.Fatalf("probing %s port %d: %v", addr, port, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer of %s port %d: %v", addr, port, err)
	}
	return resp.StatusCode, string(body)
}

// TestServiceHealthAnswersPerFamily runs a dual-stack Service's health check on real
// sockets in a namespace: each IP family's probe gets that family's local endpoints (as
// upstream's per-family health check servers answer), so a node whose IPv6 endpoints of
// the Service are gone fails IPv6 probes while IPv4 probes pass, and back. It holds on
// the instance's node addresses (one socket per address) and on a dual-stack wildcard
// socket, where the family is the one the client reached.
func TestServiceHealthAnswersPerFamily(t *testing.T) {
	testutil.RequireKernel(t, "ip")
	ns := testutil.NewNetns(t, "sphcf-")
	v4, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8:1::1")
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	for _, p := range []string{"192.0.2.1/32", "2001:db8:1::1/128"} {
		if out, err := exec.Command("ip", "-n", ns, "addr", "add", p, "dev", "lo", "nodad").CombinedOutput(); err != nil {
			t.Fatalf("adding %s: %v: %s", p, err, out)
		}
	}
	svc := types.NamespacedName{Namespace: "shop", Name: "dual"}
	const port = 30124
	for _, lc := range []struct {
		name   string
		listen Listener
		addrs  []netip.Addr
	}{
		{"a socket per node address", netnsListener{ns: ns}, []netip.Addr{v4, v6}},
		{"a dual-stack wildcard socket", wildcardListener{ns: ns}, []netip.Addr{netip.IPv4Unspecified()}},
	} {
		t.Run(lc.name, func(t *testing.T) {
			sh := NewServiceHealth(lc.listen, &fakeRecorder{}, nil)
			defer sh.Close()
			sh.SetInstanceAddrs("team-a", lc.addrs)
			sh.SyncServices("team-a", map[types.NamespacedName]HealthCheck{svc: {Port: port, IPv4: true, IPv6: true}})
			if got := sh.Unbound(); len(got) != 0 {
				t.Fatalf("not bound: %q", got)
			}
			for _, st := range []struct {
				endpoints        LocalEndpoints
				wantV4, wantV6   int
				localV4, localV6 int
			}{
				{LocalEndpoints{IPv4: 2}, http.StatusOK, http.StatusServiceUnavailable, 2, 0},
				{LocalEndpoints{IPv6: 1}, http.StatusServiceUnavailable, http.StatusOK, 0, 1},
				{LocalEndpoints{IPv4: 1, IPv6: 3}, http.StatusOK, http.StatusOK, 1, 3},
			} {
				sh.SyncEndpoints("team-a", map[types.NamespacedName]LocalEndpoints{svc: st.endpoints})
				for _, p := range []struct {
					addr        netip.Addr
					code, local int
				}{{v4, st.wantV4, st.localV4}, {v6, st.wantV6, st.localV6}} {
					code, body := probeIn(t, ns, p.addr, port)
					want := fmt.Sprintf(`{"service":{"namespace":"shop","name":"dual"},"localEndpoints":%d,"serviceProxyHealthy":true}`, p.local)
					if code != p.code || body != want {
						t.Errorf("endpoints %+v, probe of %s: %d %s, want %d %s", st.endpoints, p.addr, code, body, p.code, want)
					}
				}
			}
		})
	}
}
