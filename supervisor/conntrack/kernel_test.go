package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// newNetns creates a fresh network namespace, deleted when the test ends, and returns its
// name and a handle on it.
func newNetns(t *testing.T) (string, netns.NsHandle) {
	t.Helper()
	name := testutil.NewNetns(t, "spct-")
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("opening namespace %s: %v", name, err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return name, h
}

// newInNamespace calls New from a thread moved into ns, the way the proxy runs when its
// whole process lives in a namespace, and moves the thread back.
func newInNamespace(t *testing.T, ns netns.NsHandle) *Netlink {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("getting the test's namespace: %v", err)
	}
	defer func() { _ = orig.Close() }()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("entering namespace: %v", err)
	}
	ct, newErr := New()
	if err := netns.Set(orig); err != nil {
		// The thread is stuck in the wrong namespace; leaving it locked makes the
		// runtime end it with this goroutine.
		t.Fatalf("returning to the test's namespace: %v", err)
	}
	runtime.UnlockOSThread()
	if newErr != nil {
		t.Fatal(newErr)
	}
	return ct
}

// insertFlow creates flow in namespace ns with the conntrack CLI.
func insertFlow(t *testing.T, ns string, flow *netlink.ConntrackFlow) {
	t.Helper()
	k := keyOf(flow)
	proto := protocolName(k.proto)
	args := []string{"netns", "exec", ns, "conntrack", "-I", "-p", proto,
		"-s", k.origSrc.Addr().String(), "-d", k.origDst.Addr().String(),
		"--sport", strconv.Itoa(int(k.origSrc.Port())), "--dport", strconv.Itoa(int(k.origDst.Port())),
		"-r", k.replySrc.Addr().String(), "-q", k.replyDst.Addr().String(),
		"--reply-port-src", strconv.Itoa(int(k.replySrc.Port())), "--reply-port-dst", strconv.Itoa(int(k.replyDst.Port())),
		"-t", "300",
	}
	switch proto {
	case string(tables.UDP):
		args = append(args, "-u", "SEEN_REPLY")
	case string(tables.TCP):
		state := "ESTABLISHED"
		if info, ok := flow.ProtoInfo.(*netlink.ProtoInfoTCP); ok && info.State == tcpSynSent {
			state = "SYN_SENT"
		}
		args = append(args, "--state", state)
	case string(tables.SCTP):
		args = append(args, "--state", "ESTABLISHED", "--orig-vtag", "1", "--reply-vtag", "2")
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("inserting %s: %v: %s", FlowString(flow), err, out)
	}
}

// listFlows returns the flows of a family in namespace ns as conntrack -L shows them, in
// FlowString form, sorted.
func listFlows(t *testing.T, ns string, family tables.Family) []string {
	t.Helper()
	fam := "ipv4"
	if family == tables.IPv6 {
		fam = "ipv6"
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "conntrack", "-L", "-f", fam).Output()
	if err != nil {
		t.Fatalf("conntrack -L -f %s: %v", fam, err)
	}
	var flows []string
	for line := range strings.Lines(string(out)) {
		if s, ok := parseListed(line); ok {
			flows = append(flows, s)
		}
	}
	slices.Sort(flows)
	return flows
}

// parseListed turns a line of conntrack -L into FlowString form: the original tuple is
// the first src/dst/sport/dport, the reply source the second src/sport.
func parseListed(line string) (string, bool) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return "", false
	}
	seen := map[string][]string{}
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			seen[k] = append(seen[k], v)
		}
	}
	if len(seen["src"]) < 2 || len(seen["dst"]) < 1 || len(seen["sport"]) < 2 || len(seen["dport"]) < 1 {
		return "", false
	}
	hp := func(addr, port string) string {
		return netip.AddrPortFrom(netip.MustParseAddr(addr), mustPort(port)).String()
	}
	return fmt.Sprintf("%s %s -> %s via %s", fields[0],
		hp(seen["src"][0], seen["sport"][0]), hp(seen["dst"][0], seen["dport"][0]),
		hp(seen["src"][1], seen["sport"][1])), true
}

func mustPort(s string) uint16 {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		panic(err)
	}
	return uint16(n)
}

// TestKernelCleanup inserts real conntrack entries into a fresh namespace, runs the
// Cleaner on it through netlink and checks with conntrack -L that exactly the stale
// flows went, in both families and for both ways of binding to the namespace.
func TestKernelCleanup(t *testing.T) {
	testutil.RequireKernel(t, "ip", "conntrack")

	for _, bind := range []struct {
		name string
		open func(*testing.T, netns.NsHandle) *Netlink
	}{
		{"NewAt", func(t *testing.T, ns netns.NsHandle) *Netlink {
			ct, err := NewAt(ns)
			if err != nil {
				t.Fatal(err)
			}
			return ct
		}},
		{"New inside the namespace", newInNamespace},
	} {
		t.Run(bind.name, func(t *testing.T) {
			name, handle := newNetns(t)
			ct := bind.open(t, handle)
			t.Cleanup(ct.Close)
			testKernelCleanup(t, name, ct)
		})
	}
}

func testKernelCleanup(t *testing.T, ns string, ct Interface) {
	// Per family: the DNS port loses endpoint A; "sig", an SCTP port, loses A too; "web",
	// TCP, loses A; "new" gets its first endpoint; "tcp-new", a TCP port, is new. Every
	// flow gets its own client port, as the kernel refuses two entries with the same tuple.
	type addrs struct {
		family                                            tables.Family
		client, cluster, external, lb, node, other, fresh string
		sig, web, tcpNew, a, b                            string
	}
	fams := []addrs{
		{tables.IPv4, "10.0.0.1", clusterIP, externalIP, lbIP, nodeIP, otherIP, "172.30.0.20",
			"172.30.0.30", "172.30.0.40", "172.30.0.50", epA, epB},
		{tables.IPv6, "fd00::1", clusterIP6, externalIP6, lbIP6, nodeIP6, "fd00:96::99", "fd00:96::20",
			"fd00:96::30", "fd00:96::40", "fd00:96::50", epA6, epB6},
	}

	var before, after []*tables.ServicePort
	var flows []*netlink.ConntrackFlow
	var gone []string
	clientPort := uint16(40000)
	add := func(a addrs, proto tables.Protocol, frontend, backend string, stale bool) {
		clientPort++
		from := netip.AddrPortFrom(ip(a.client), clientPort).String()
		f := flow(proto, from, frontend, backend)
		flows = append(flows, f)
		if stale {
			gone = append(gone, FlowString(f))
		}
	}
	// addSyn adds a TCP flow whose SYN got no answer.
	addSyn := func(a addrs, frontend, backend string, stale bool) {
		add(a, tables.TCP, frontend, backend, stale)
		flows[len(flows)-1].ProtoInfo = &netlink.ProtoInfoTCP{State: tcpSynSent}
	}

	for _, a := range fams {
		dns := func(mods ...func(*tables.ServicePort)) *tables.ServicePort {
			sp := dnsPort(func(sp *tables.ServicePort) {
				sp.ClusterIP = ip(a.cluster)
				sp.ExternalIPs = []netip.Addr{ip(a.external)}
				sp.LoadBalancerIPs = []netip.Addr{ip(a.lb)}
			}, endpoints(a.a, a.b))
			for _, mod := range mods {
				mod(sp)
			}
			return sp
		}
		named := func(name string, addr string, port, nodePort uint16) func(*tables.ServicePort) {
			return func(sp *tables.ServicePort) {
				sp.Name.Name = name
				sp.ClusterIP = ip(addr)
				sp.ExternalIPs, sp.LoadBalancerIPs = nil, nil
				sp.Port, sp.NodePort = port, nodePort
			}
		}
		before = append(before,
			dns(),
			dns(named("sig", a.sig, 9000, 0), protocol(tables.SCTP)),
			dns(named("web", a.web, 80, 30080), protocol(tables.TCP)),
			dns(named("new", a.fresh, 5000, 30500), endpoints()),
		)
		after = append(after,
			dns(endpoints(a.b)),
			dns(named("sig", a.sig, 9000, 0), protocol(tables.SCTP), endpoints(a.b)),
			dns(named("web", a.web, 80, 30080), protocol(tables.TCP), endpoints(a.b)),
			dns(named("new", a.fresh, 5000, 30500), endpoints(a.a)),
			dns(named("tcp-new", a.tcpNew, 80, 0), protocol(tables.TCP)),
		)

		hp := func(host string, port uint16) string {
			return netip.AddrPortFrom(ip(host), port).String()
		}
		add(a, tables.UDP, hp(a.cluster, 53), a.a, true)
		add(a, tables.UDP, hp(a.external, 53), a.a, true)
		add(a, tables.UDP, hp(a.lb, 53), a.a, true)
		add(a, tables.UDP, hp(a.node, 30053), a.a, true)
		add(a, tables.UDP, hp(a.cluster, 53), a.b, false)
		add(a, tables.UDP, hp(a.node, 30053), a.b, false)
		add(a, tables.UDP, hp(a.other, 53), a.a, false)
		add(a, tables.UDP, hp(a.cluster, 54), a.a, false)
		add(a, tables.SCTP, hp(a.sig, 9000), a.a, true)
		add(a, tables.SCTP, hp(a.sig, 9000), a.b, false)
		add(a, tables.TCP, hp(a.web, 80), a.a, false)
		add(a, tables.TCP, hp(a.node, 30080), a.a, false)
		add(a, tables.UDP, hp(a.fresh, 5000), "", true)
		add(a, tables.UDP, hp(a.node, 30500), "", true)
		add(a, tables.UDP, hp(a.fresh, 5000), a.a, false)
		add(a, tables.UDP, hp(a.fresh, 5001), "", false)
		add(a, tables.UDP, hp(a.other, 5000), "", false)
		addSyn(a, hp(a.tcpNew, 80), "", true)
		addSyn(a, hp(a.tcpNew, 80), a.a, false)
		add(a, tables.TCP, hp(a.tcpNew, 80), "", false)
		addSyn(a, hp(a.web, 80), "", false)
	}

	for _, f := range flows {
		insertFlow(t, ns, f)
	}
	want := map[tables.Family][]string{}
	for _, f := range flows {
		if s := FlowString(f); !slices.Contains(gone, s) {
			want[familyOf(f)] = append(want[familyOf(f)], s)
		}
	}
	for _, family := range []tables.Family{tables.IPv4, tables.IPv6} {
		all := listFlows(t, ns, family)
		if len(all) != len(flows)/2 {
			t.Fatalf("%s table holds %d flows after inserting %d:\n%s", family, len(all), len(flows)/2, strings.Join(all, "\n"))
		}
	}

	deleted, err := NewCleaner(ct).Cleanup(context.Background(), before, after)
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if deleted != len(gone) {
		t.Errorf("Cleanup deleted %d flows, want %d", deleted, len(gone))
	}
	for _, family := range []tables.Family{tables.IPv4, tables.IPv6} {
		w := want[family]
		slices.Sort(w)
		if diff := cmp.Diff(w, listFlows(t, ns, family)); diff != "" {
			t.Errorf("%s flows left (-want +got):\n%s", family, diff)
		}
	}

	// A second run finds nothing left to delete.
	deleted, err = NewCleaner(ct).Cleanup(context.Background(), before, after)
	if err != nil || deleted != 0 {
		t.Errorf("second Cleanup = %d, %v; want 0, nil", deleted, err)
	}
}
