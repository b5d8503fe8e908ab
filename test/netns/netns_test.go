package netns_test

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

const (
	serverPort = 8080
	closedPort = 9999
	// droppedPort is dropped by a rule in pod1, to see a timeout.
	droppedPort = 7777
)

// TestTopologyRoutesWithoutProxy checks the wiring alone: without any proxy rules every
// namespace reaches every pod directly, and nobody rewrites source addresses.
func TestTopologyRoutesWithoutProxy(t *testing.T) {
	tp := netns.New(t)
	for _, s := range []struct{ ns, name string }{
		{tp.Pod1, "pod1"},
		{tp.Pod2, "pod2"},
		{tp.Remote, "remote"},
		{tp.Node, "node"},
	} {
		tp.StartServer(s.ns, s.name, "tcp", serverPort)
		tp.StartServer(s.ns, s.name, "udp", serverPort)
	}

	tests := []struct {
		name       string
		from       string
		addr       string
		wantServer string
		wantSource string
	}{
		{"client reaches pod1", tp.Client, netns.Pod1IPv4, "pod1", netns.ClientIPv4},
		{"client reaches pod1 over IPv6", tp.Client, netns.Pod1IPv6, "pod1", netns.ClientIPv6},
		{"client reaches remote pod unmasqueraded", tp.Client, netns.RemoteIPv4, "remote", netns.ClientIPv4},
		{"client reaches remote pod unmasqueraded over IPv6", tp.Client, netns.RemoteIPv6, "remote", netns.ClientIPv6},
		{"pod1 reaches remote pod through both nodes", tp.Pod1, netns.RemoteIPv4, "remote", netns.Pod1IPv4},
		{"pod1 reaches remote pod through both nodes over IPv6", tp.Pod1, netns.RemoteIPv6, "remote", netns.Pod1IPv6},
		{"remote pod reaches pod2", tp.Remote, netns.Pod2IPv4, "pod2", netns.RemoteIPv4},
		{"remote pod reaches pod2 over IPv6", tp.Remote, netns.Pod2IPv6, "pod2", netns.RemoteIPv6},
		{"pod2 reaches pod1 through node", tp.Pod2, netns.Pod1IPv4, "pod1", netns.Pod2IPv4},
		{"pod2 reaches pod1 through node over IPv6", tp.Pod2, netns.Pod1IPv6, "pod1", netns.Pod2IPv6},
		{"node reaches pod1", tp.Node, netns.Pod1IPv4, "pod1", netns.PodGatewayIPv4},
		{"node2 reaches pod1 through node", tp.Node2, netns.Pod1IPv4, "pod1", netns.Node2IPv4},
		{"client reaches node's primary IP", tp.Client, netns.NodeIPv4, "node", netns.ClientIPv4},
		{"client reaches node's primary IP over IPv6", tp.Client, netns.NodeIPv6, "node", netns.ClientIPv6},
		// The reply would leave by the cluster link with that link's address if the UDP
		// server did not answer from the address it was asked on.
		{"node2 reaches node's primary IP", tp.Node2, netns.NodeIPv4, "node", netns.Node2IPv4},
		{"node2 reaches node's primary IP over IPv6", tp.Node2, netns.NodeIPv6, "node", netns.Node2IPv6},
	}
	for _, tc := range tests {
		for _, proto := range []string{"tcp", "udp"} {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				got, err := tp.Dial(tc.from, proto, tc.addr, serverPort)
				if err != nil {
					t.Fatal(err)
				}
				want := netns.Reply{Server: tc.wantServer, Source: tc.wantSource}
				if got != want {
					t.Errorf("reply = %+v, want %+v", got, want)
				}
			})
		}
	}
}

// TestDialErrors checks that the failure modes tests assert on are told apart.
func TestDialErrors(t *testing.T) {
	tp := netns.New(t)
	tp.StartServer(tp.Pod1, "pod1", "tcp", droppedPort)
	tp.StartServer(tp.Pod1, "pod1", "udp", droppedPort)
	if err := tp.NFT(tp.Pod1, `
table inet test {
	chain input {
		type filter hook input priority filter; policy accept;
		meta l4proto { tcp, udp } th dport 7777 drop
	}
}
`); err != nil {
		t.Fatal(err)
	}
	ruleset, err := tp.ListRuleset(tp.Pod1)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ruleset, "dport 7777 drop") {
		t.Fatalf("ruleset lacks the drop rule:\n%s", ruleset)
	}

	tests := []struct {
		name  string
		proto string
		addr  string
		port  int
		check func(error) bool
	}{
		{"closed TCP port is refused", "tcp", netns.Pod1IPv4, closedPort, netns.IsRefused},
		{"closed TCP port is refused over IPv6", "tcp", netns.Pod1IPv6, closedPort, netns.IsRefused},
		{"closed UDP port is refused", "udp", netns.Pod1IPv4, closedPort, netns.IsRefused},
		{"closed UDP port is refused over IPv6", "udp", netns.Pod1IPv6, closedPort, netns.IsRefused},
		{"dropped TCP times out", "tcp", netns.Pod1IPv4, droppedPort, netns.IsTimeout},
		{"dropped UDP times out over IPv6", "udp", netns.Pod1IPv6, droppedPort, netns.IsTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := tp.DialWith(tp.Client, tc.proto, tc.addr, tc.port, netns.DialOptions{Timeout: 300 * time.Millisecond})
			if err == nil {
				t.Fatal("dial succeeded, want an error")
			}
			if !tc.check(err) {
				t.Errorf("unexpected error kind: %v", err)
			}
			if netns.IsRefused(err) && netns.IsTimeout(err) {
				t.Errorf("error is both refused and timeout: %v", err)
			}
		})
	}
}

// TestDialFromReusesSourcePort checks that back-to-back requests can share one source port,
// as UDP conntrack tests need.
func TestDialFromReusesSourcePort(t *testing.T) {
	tp := netns.New(t)
	tp.StartServer(tp.Pod1, "pod1", "tcp", serverPort)
	tp.StartServer(tp.Pod1, "pod1", "udp", serverPort)
	for _, proto := range []string{"udp", "tcp"} {
		for i := range 3 {
			got, err := tp.DialFrom(tp.Client, proto, netns.Pod1IPv4, serverPort, 40000)
			if err != nil {
				t.Fatalf("%s request %d: %v", proto, i, err)
			}
			if got.Source != netns.ClientIPv4 {
				t.Errorf("%s request %d: source = %s, want %s", proto, i, got.Source, netns.ClientIPv4)
			}
		}
	}
	out, err := tp.Exec(tp.Pod1, "ss", "-Htan", "sport", "= :8080", "and", "dport", "= :40000")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "\n"); n != 1 {
		t.Errorf("want one TCP socket from :40000 left (in TIME-WAIT), got:\n%s", out)
	}
}

// TestNodeSettings checks the sysctls and names that proxy tests rely on.
func TestNodeSettings(t *testing.T) {
	tp := netns.New(t)
	for _, tc := range []struct {
		ns, path, want string
	}{
		{tp.Node, "/proc/sys/net/ipv4/ip_forward", "1"},
		{tp.Node, "/proc/sys/net/ipv6/conf/all/forwarding", "1"},
		{tp.Node2, "/proc/sys/net/ipv4/ip_forward", "1"},
		{tp.Node, "/proc/sys/net/ipv4/conf/" + netns.NodePod1Interface + "/rp_filter", "0"},
		{tp.Pod1, "/proc/sys/net/ipv4/conf/all/rp_filter", "0"},
		{tp.Client, "/proc/sys/net/ipv4/ip_forward", "0"},
	} {
		out, err := tp.Exec(tc.ns, "cat", tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out); got != tc.want {
			t.Errorf("%s in %s = %s, want %s", tc.path, tc.ns, got, tc.want)
		}
	}
	out, err := tp.Exec(tp.Node, "ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{netns.NodePod1Interface, netns.NodePod2Interface} {
		if !strings.HasPrefix(name, netns.PodInterfacePrefix) || !strings.Contains(out, " "+name+"@") {
			t.Errorf("node has no pod interface %s:\n%s", name, out)
		}
	}
}

// TestCleanupRemovesEverything checks that a finished test leaves no namespace and no
// process behind.
func TestCleanupRemovesEverything(t *testing.T) {
	var names []string
	var pid int
	skipped := false
	t.Run("topology", func(t *testing.T) {
		t.Cleanup(func() { skipped = t.Skipped() })
		tp := netns.New(t)
		names = tp.Namespaces()
		tp.StartServer(tp.Pod1, "pod1", "tcp", serverPort)
		pid = tp.Start(tp.Node, "sleep", "1000").Pid()
	})
	if skipped {
		testutil.Unavailable(t, "the topology subtest was skipped (not root, or -short)")
	}
	if len(names) == 0 {
		t.Fatal("subtest built no topology")
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	for _, ns := range names {
		if strings.Contains(string(out), ns) {
			t.Errorf("namespace %s left behind:\n%s", ns, out)
		}
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d started in the topology still exists (kill 0: %v)", pid, err)
	}
}

// TestEmptyHoldsOnlyAddedNamespaces checks that a topology made by Empty creates no
// namespace of the standard topology, only those added to it, and that Close deletes them.
func TestEmptyHoldsOnlyAddedNamespaces(t *testing.T) {
	testutil.RequireKernel(t, "ip")
	tp, err := netns.Empty()
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = tp.Close()
		}
	})
	if got := tp.Namespaces(); len(got) != 0 {
		t.Errorf("Namespaces() = %v, want none", got)
	}
	added, err := tp.AddNamespace("only")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tp.Exec(added, "ip", "link", "show", "lo"); err != nil {
		t.Fatalf("the added namespace: %v: %s", err, out)
	}
	if got := prefixed(t, tp.Prefix); !slices.Equal(got, []string{added}) {
		t.Errorf("namespaces with prefix %s: %v, want only %s", tp.Prefix, got, added)
	}
	closed = true
	if err := tp.Close(); err != nil {
		t.Fatal(err)
	}
	if got := prefixed(t, tp.Prefix); len(got) != 0 {
		t.Errorf("namespaces left after Close: %v", got)
	}
}

// prefixed lists the namespaces whose names start with prefix and a dash.
func prefixed(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if name, _, _ := strings.Cut(strings.TrimSpace(line), " "); strings.HasPrefix(name, prefix+"-") {
			names = append(names, name)
		}
	}
	return names
}

// TestSCTPWithoutProxy checks the SCTP helpers on the bare topology: an association
// reaches a pod directly in both families and the server sees the client's own address,
// a port nobody listens on is refused (the peer's ABORT), and a held association reports
// the client's own port. It needs a kernel with SCTP (netns.RequireSCTP).
func TestSCTPWithoutProxy(t *testing.T) {
	netns.RequireSCTP(t)
	tp := netns.New(t)
	tp.StartServer(tp.Pod1, "pod1", "sctp", serverPort)
	for _, tc := range []struct{ name, addr, wantSource string }{
		{"IPv4", netns.Pod1IPv4, netns.ClientIPv4},
		{"IPv6", netns.Pod1IPv6, netns.ClientIPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tp.Dial(tp.Client, "sctp", tc.addr, serverPort)
			if err != nil {
				t.Fatal(err)
			}
			if want := (netns.Reply{Server: "pod1", Source: tc.wantSource}); got != want {
				t.Errorf("reply = %+v, want %+v", got, want)
			}
			if _, err := tp.Dial(tp.Client, "sctp", tc.addr, closedPort); !netns.IsRefused(err) {
				t.Errorf("closed port: want refused, got %v", err)
			}
			a, err := tp.OpenSCTP(tp.Client, tc.addr, serverPort, netns.DialOptions{SourcePort: 41000})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if a.Local.Port() != 41000 || a.Reply.Server != "pod1" {
				t.Errorf("held association: local %s, reply %+v; want port 41000, pod1", a.Local, a.Reply)
			}
		})
	}
}
