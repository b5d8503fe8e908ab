// Package netns builds throwaway topologies of Linux network namespaces for real-kernel
// tests of the service proxy, and sends real TCP, UDP and SCTP traffic through them.
//
// The standard topology, dual-stack throughout:
//
//	client ─eth0──────ext0─┐                                       ┌─vpod-remote──eth0─ remote
//	pod1   ─eth0─────vpod1─┼─ node ─cluster0────────cluster0─ node2 ┘
//	pod2   ─eth0─────vpod2─┘
//
// node is where the proxy's rules go: it forwards, and it is the only path between the
// client, its pods and node2. Pods are wired like a typical routed CNI: each pod holds a /32
// (/128) and a default route onlink via the pod gateway address, which node carries on every
// pod veth; node reaches each pod by a host route. node2 forwards for its remote pod and
// never masquerades, so a server in remote sees the client's own address unless node
// rewrote it. node's uplink (default route) is the client, standing in for the world
// outside the cluster.
//
// Every namespace name carries a random prefix, so parallel tests, parallel test binaries
// and leftovers of crashed runs never collide. Interface names are local to their namespace
// and therefore fixed.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// Addresses of the standard topology. They exist only inside the test's own namespaces.
const (
	// NodeIPv4 is node's primary address (on the client link): the NodePort address.
	NodeIPv4 = "192.168.100.1"
	// NodeIPv6 is node's primary IPv6 address (on the client link).
	NodeIPv6 = "fd00:100::1"
	// NodeClusterIPv4 is node's address on the cluster network towards node2.
	NodeClusterIPv4 = "172.30.0.1"
	// NodeClusterIPv6 is node's IPv6 address on the cluster network towards node2.
	NodeClusterIPv6 = "fd00:30::1"
	// Node2IPv4 is node2's address on the cluster network.
	Node2IPv4 = "172.30.0.2"
	// Node2IPv6 is node2's IPv6 address on the cluster network.
	Node2IPv6 = "fd00:30::2"
	// ClientIPv4 is the external client's address.
	ClientIPv4 = "192.168.100.2"
	// ClientIPv6 is the external client's IPv6 address.
	ClientIPv6 = "fd00:100::2"
	// Pod1IPv4 is pod1's address, in node's pod CIDR.
	Pod1IPv4 = "10.244.1.2"
	// Pod1IPv6 is pod1's IPv6 address, in node's pod CIDR.
	Pod1IPv6 = "fd00:10:244:1::2"
	// Pod2IPv4 is pod2's address, in node's pod CIDR.
	Pod2IPv4 = "10.244.1.3"
	// Pod2IPv6 is pod2's IPv6 address, in node's pod CIDR.
	Pod2IPv6 = "fd00:10:244:1::3"
	// RemoteIPv4 is the remote pod's address, in node2's pod CIDR.
	RemoteIPv4 = "10.244.2.2"
	// RemoteIPv6 is the remote pod's IPv6 address, in node2's pod CIDR.
	RemoteIPv6 = "fd00:10:244:2::2"
	// PodGatewayIPv4 is the pods' default gateway; node holds it as a /32 on every pod veth.
	PodGatewayIPv4 = "10.244.1.1"
	// PodGatewayIPv6 is the pods' IPv6 default gateway; node holds it as a /128 on every pod veth.
	PodGatewayIPv6 = "fd00:10:244:1::1"
	// RemoteGatewayIPv4 is the remote pod's default gateway, held by node2.
	RemoteGatewayIPv4 = "10.244.2.1"
	// RemoteGatewayIPv6 is the remote pod's IPv6 default gateway, held by node2.
	RemoteGatewayIPv6 = "fd00:10:244:2::1"

	// ClientCIDRv4 is the subnet between client and node.
	ClientCIDRv4 = "192.168.100.0/24"
	// ClientCIDRv6 is the IPv6 subnet between client and node.
	ClientCIDRv6 = "fd00:100::/64"
	// ClusterNetworkCIDRv4 is the subnet between node and node2.
	ClusterNetworkCIDRv4 = "172.30.0.0/24"
	// ClusterNetworkCIDRv6 is the IPv6 subnet between node and node2.
	ClusterNetworkCIDRv6 = "fd00:30::/64"
	// NodePodCIDRv4 is node's pod CIDR (pod1, pod2).
	NodePodCIDRv4 = "10.244.1.0/24"
	// NodePodCIDRv6 is node's IPv6 pod CIDR (pod1, pod2).
	NodePodCIDRv6 = "fd00:10:244:1::/64"
	// Node2PodCIDRv4 is node2's pod CIDR (remote).
	Node2PodCIDRv4 = "10.244.2.0/24"
	// Node2PodCIDRv6 is node2's IPv6 pod CIDR (remote).
	Node2PodCIDRv6 = "fd00:10:244:2::/64"
	// ClusterPodCIDRv4 covers every pod CIDR, for ClusterCIDR-style local detection.
	ClusterPodCIDRv4 = "10.244.0.0/16"
	// ClusterPodCIDRv6 covers every IPv6 pod CIDR.
	ClusterPodCIDRv6 = "fd00:10:244::/48"
)

// Interface names of the standard topology; each is local to its namespace.
const (
	// PodInterfacePrefix starts the name of every node-side pod veth, for
	// InterfaceNamePrefix-style local detection.
	PodInterfacePrefix = "vpod"
	// NodePod1Interface is node's end of pod1's veth.
	NodePod1Interface = PodInterfacePrefix + "1"
	// NodePod2Interface is node's end of pod2's veth.
	NodePod2Interface = PodInterfacePrefix + "2"
	// Node2RemoteInterface is node2's end of the remote pod's veth.
	Node2RemoteInterface = PodInterfacePrefix + "-remote"
	// NodeClientInterface is node's end of the client link; it carries NodeIPv4/NodeIPv6.
	NodeClientInterface = "ext0"
	// ClusterInterface is the name of both ends of the node–node2 link.
	ClusterInterface = "cluster0"
	// LeafInterface is the only interface (besides lo) in client, pod1, pod2 and remote.
	LeafInterface = "eth0"
)

// execTimeout bounds one Exec; anything longer belongs in Start.
const execTimeout = time.Minute

// Topology is a set of network namespaces wired for service-proxy tests. All names are
// prefixed with a unique per-test prefix so parallel tests and leftovers never collide.
type Topology struct {
	// Prefix starts every namespace name of this topology.
	Prefix string
	// Node is the namespace of the node under test: the router where the proxy's rules go.
	Node string
	// Client is the namespace of the external client, outside the cluster.
	Client string
	// Pod1 is the namespace of the first pod on node.
	Pod1 string
	// Pod2 is the namespace of the second pod on node.
	Pod2 string
	// Node2 is the namespace of the second node, which routes but runs no proxy.
	Node2 string
	// Remote is the namespace of the pod behind node2.
	Remote string

	t testing.TB
	// extra are namespaces added with AddNamespace.
	extra []string
	// handles holds an open handle per namespace; written only in New.
	handles map[string]netns.NsHandle
}

// New builds the standard topology and registers t.Cleanup to delete every namespace and
// kill every process it started. It skips the test (t.Skip with the reason) when not root
// or when ip is missing.
func New(t testing.TB) *Topology {
	t.Helper()
	testutil.RequireKernel(t, "ip")
	tp, err := Build()
	if tp != nil {
		tp.t = t
		t.Cleanup(func() {
			if err := tp.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// Build builds the standard topology for callers that are not tests (the demo); Close
// removes it. On error the returned Topology, if any, still needs Close.
func Build() (*Topology, error) {
	prefix, err := freePrefix()
	if err != nil {
		return nil, fmt.Errorf("choosing a namespace prefix: %w", err)
	}
	tp := &Topology{
		Prefix:  prefix,
		Node:    prefix + "-node",
		Client:  prefix + "-client",
		Pod1:    prefix + "-pod1",
		Pod2:    prefix + "-pod2",
		Node2:   prefix + "-node2",
		Remote:  prefix + "-remote",
		handles: map[string]netns.NsHandle{},
	}
	if err := tp.build(); err != nil {
		return tp, fmt.Errorf("building topology %s: %w", prefix, err)
	}
	return tp, nil
}

// Empty returns a topology without any namespace yet, for callers that wire their own
// with AddNamespace (a fleet of nodes); Close deletes what AddNamespace made.
func Empty() (*Topology, error) {
	prefix, err := freePrefix()
	if err != nil {
		return nil, fmt.Errorf("choosing a namespace prefix: %w", err)
	}
	return &Topology{Prefix: prefix, handles: map[string]netns.NsHandle{}}, nil
}

// Namespaces returns the names of the standard topology's namespaces: none for a
// topology made by Empty. Namespaces added with AddNamespace are not among them.
func (tp *Topology) Namespaces() []string {
	if tp.Node == "" {
		return nil
	}
	return []string{tp.Node, tp.Client, tp.Pod1, tp.Pod2, tp.Node2, tp.Remote}
}

// freePrefix returns "sp" and 6 random hex digits that no existing namespace starts with.
func freePrefix() (string, error) {
	for range 10 {
		b := make([]byte, 3)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		prefix := "sp" + hex.EncodeToString(b)
		taken, err := filepath.Glob(filepath.Join("/run/netns", prefix+"-*"))
		if err != nil {
			return "", err
		}
		if len(taken) == 0 {
			return prefix, nil
		}
	}
	return "", errors.New("every random prefix tried is taken")
}

// build creates and wires the namespaces. Each namespace's sysctl defaults are set before
// any veth lands in it, so the veths inherit them.
func (tp *Topology) build() error {
	for _, ns := range tp.Namespaces() {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %w: %s", ns, err, bytes.TrimSpace(out))
		}
		h, err := netns.GetFromName(ns)
		if err != nil {
			return fmt.Errorf("opening namespace %s: %w", ns, err)
		}
		tp.handles[ns] = h
		if err := tp.Do(ns, func() error { return writeSysctls(baseSysctls) }); err != nil {
			return fmt.Errorf("setting sysctls in %s: %w", ns, err)
		}
	}
	for _, ns := range []string{tp.Node, tp.Node2} {
		if err := tp.Do(ns, func() error { return writeSysctls(routerSysctls) }); err != nil {
			return fmt.Errorf("setting sysctls in %s: %w", ns, err)
		}
	}

	// Links first, everything up, then addresses and routes: nothing gets configured on a
	// link without carrier.
	steps := []struct {
		ns    string
		lines []string
	}{
		{tp.Node, []string{
			"link set lo up",
			"link add " + NodeClientInterface + " type veth peer name " + LeafInterface + " netns " + tp.Client,
			"link add " + NodePod1Interface + " type veth peer name " + LeafInterface + " netns " + tp.Pod1,
			"link add " + NodePod2Interface + " type veth peer name " + LeafInterface + " netns " + tp.Pod2,
			"link add " + ClusterInterface + " type veth peer name " + ClusterInterface + " netns " + tp.Node2,
			"link set " + NodeClientInterface + " up",
			"link set " + NodePod1Interface + " up",
			"link set " + NodePod2Interface + " up",
			"link set " + ClusterInterface + " up",
		}},
		{tp.Node2, []string{
			"link set lo up",
			"link add " + Node2RemoteInterface + " type veth peer name " + LeafInterface + " netns " + tp.Remote,
			"link set " + ClusterInterface + " up",
			"link set " + Node2RemoteInterface + " up",
		}},
		{tp.Client, upLeaf()},
		{tp.Pod1, upLeaf()},
		{tp.Pod2, upLeaf()},
		{tp.Remote, upLeaf()},

		{tp.Node, []string{
			"addr add " + NodeIPv4 + "/24 dev " + NodeClientInterface,
			"addr add " + NodeIPv6 + "/64 dev " + NodeClientInterface + " nodad",
			"addr add " + NodeClusterIPv4 + "/24 dev " + ClusterInterface,
			"addr add " + NodeClusterIPv6 + "/64 dev " + ClusterInterface + " nodad",
			"addr add " + PodGatewayIPv4 + "/32 dev " + NodePod1Interface,
			"addr add " + PodGatewayIPv6 + "/128 dev " + NodePod1Interface + " nodad",
			"addr add " + PodGatewayIPv4 + "/32 dev " + NodePod2Interface,
			"addr add " + PodGatewayIPv6 + "/128 dev " + NodePod2Interface + " nodad",
			"route add " + Pod1IPv4 + "/32 dev " + NodePod1Interface,
			"route add " + Pod1IPv6 + "/128 dev " + NodePod1Interface,
			"route add " + Pod2IPv4 + "/32 dev " + NodePod2Interface,
			"route add " + Pod2IPv6 + "/128 dev " + NodePod2Interface,
			"route add " + Node2PodCIDRv4 + " via " + Node2IPv4,
			"route add " + Node2PodCIDRv6 + " via " + Node2IPv6,
			"route add default via " + ClientIPv4,
			"route add default via " + ClientIPv6,
		}},
		{tp.Node2, []string{
			"addr add " + Node2IPv4 + "/24 dev " + ClusterInterface,
			"addr add " + Node2IPv6 + "/64 dev " + ClusterInterface + " nodad",
			"addr add " + RemoteGatewayIPv4 + "/32 dev " + Node2RemoteInterface,
			"addr add " + RemoteGatewayIPv6 + "/128 dev " + Node2RemoteInterface + " nodad",
			"route add " + RemoteIPv4 + "/32 dev " + Node2RemoteInterface,
			"route add " + RemoteIPv6 + "/128 dev " + Node2RemoteInterface,
			"route add default via " + NodeClusterIPv4,
			"route add default via " + NodeClusterIPv6,
		}},
		{tp.Client, []string{
			"addr add " + ClientIPv4 + "/24 dev " + LeafInterface,
			"addr add " + ClientIPv6 + "/64 dev " + LeafInterface + " nodad",
			"route add default via " + NodeIPv4,
			"route add default via " + NodeIPv6,
		}},
		{tp.Pod1, podLeaf(Pod1IPv4, Pod1IPv6, PodGatewayIPv4, PodGatewayIPv6)},
		{tp.Pod2, podLeaf(Pod2IPv4, Pod2IPv6, PodGatewayIPv4, PodGatewayIPv6)},
		{tp.Remote, podLeaf(RemoteIPv4, RemoteIPv6, RemoteGatewayIPv4, RemoteGatewayIPv6)},
	}
	for _, s := range steps {
		if err := ipBatch(s.ns, s.lines); err != nil {
			return err
		}
	}
	return tp.waitAddressesUsable()
}

func upLeaf() []string {
	return []string{"link set lo up", "link set " + LeafInterface + " up"}
}

func podLeaf(ip4, ip6, gw4, gw6 string) []string {
	return []string{
		"addr add " + ip4 + "/32 dev " + LeafInterface,
		"addr add " + ip6 + "/128 dev " + LeafInterface + " nodad",
		"route add default via " + gw4 + " dev " + LeafInterface + " onlink",
		"route add default via " + gw6 + " dev " + LeafInterface + " onlink",
	}
}

// ipBatch runs lines as one `ip -batch` inside ns.
func ipBatch(ns string, lines []string) error {
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("configuring %s: ip -batch: %w: %s", ns, err, bytes.TrimSpace(out))
	}
	return nil
}

// waitAddressesUsable waits until no IPv6 address is tentative. With DAD off none should
// be, but a veth that got carrier late may hold one back for a moment.
func (tp *Topology) waitAddressesUsable() error {
	deadline := time.Now().Add(5 * time.Second)
	for _, ns := range tp.Namespaces() {
		for {
			out, err := exec.Command("ip", "-n", ns, "-6", "addr", "show", "tentative").CombinedOutput()
			if err != nil {
				return fmt.Errorf("listing tentative addresses in %s: %w: %s", ns, err, bytes.TrimSpace(out))
			}
			if len(bytes.TrimSpace(out)) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("IPv6 addresses in %s still tentative: %s", ns, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// baseSysctls apply to every namespace: no reverse-path filtering (the proxy's DNAT and
// the asymmetric routes through node2 would trip it) and no DAD, so IPv6 addresses work at
// once. "default" matters for veths created later; "all" for the effective value.
var baseSysctls = []sysctl{
	{"net/ipv4/conf/all/rp_filter", "0"},
	{"net/ipv4/conf/default/rp_filter", "0"},
	{"net/ipv6/conf/all/accept_dad", "0"},
	{"net/ipv6/conf/default/accept_dad", "0"},
}

// routerSysctls apply to node and node2. No ICMP redirects: the client's default route is
// the node, so traffic to an unprogrammed LB or external IP leaves by the interface it came
// in on, and the redirects the node would send share the per-peer ICMP rate limit with the
// rejects the tests wait for.
var routerSysctls = []sysctl{
	{"net/ipv4/ip_forward", "1"},
	{"net/ipv4/conf/all/send_redirects", "0"},
	{"net/ipv4/conf/default/send_redirects", "0"},
	{"net/ipv6/conf/all/forwarding", "1"},
	{"net/ipv6/conf/default/forwarding", "1"},
}

type sysctl struct{ path, value string }

// writeSysctls writes sysctls of the calling thread's network namespace: /proc/sys/net
// resolves against the namespace of the thread that opens it.
func writeSysctls(sysctls []sysctl) error {
	for _, s := range sysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", s.path), []byte(s.value), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", s.path, err)
		}
	}
	return nil
}

// Close deletes the namespaces. Test cleanups run last-in first-out, so servers and
// processes registered after New are gone by now and no socket pins a namespace.
func (tp *Topology) Close() error {
	var errs []error
	for ns, h := range tp.handles {
		if err := h.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing handle of namespace %s: %w", ns, err))
		}
	}
	tp.handles = map[string]netns.NsHandle{}
	for _, ns := range append(tp.Namespaces(), tp.extra...) {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); errors.Is(err, os.ErrNotExist) {
			continue // never created, or already gone
		}
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting namespace %s: %w: %s", ns, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

// AddNamespace creates one more namespace "<prefix>-<suffix>", deleted by Close, and
// returns its name.
func (tp *Topology) AddNamespace(suffix string) (string, error) {
	ns := tp.Prefix + "-" + suffix
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add %s: %w: %s", ns, err, bytes.TrimSpace(out))
	}
	tp.extra = append(tp.extra, ns)
	return ns, nil
}

// Do runs fn on an OS thread switched into namespace ns, so sockets fn creates, and
// processes it forks, belong to ns. A socket keeps its namespace when used from other
// goroutines later; goroutines fn starts do not run in ns.
func (tp *Topology) Do(ns string, fn func() error) error {
	target, ok := tp.handles[ns]
	if !ok {
		h, err := netns.GetFromName(ns)
		if err != nil {
			return fmt.Errorf("opening namespace %s: %w", ns, err)
		}
		defer h.Close()
		target = h
	}
	errc := make(chan error, 1)
	go func() {
		// The thread is unlocked only once it is back in its original namespace; if that
		// fails, returning while locked makes the runtime discard the thread.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("getting current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering namespace %s: %w", ns, err)
			return
		}
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("leaving namespace %s: %w", ns, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// Exec runs a command inside namespace ns and returns its combined output; the error
// includes the output.
func (tp *Topology) Exec(ns string, args ...string) (string, error) {
	return tp.execStdin(ns, nil, args...)
}

func (tp *Topology) execStdin(ns string, stdin io.Reader, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), execTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("running %q in %s: %w: %s", strings.Join(args, " "), ns, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// NFT loads an nft script into namespace ns with `nft -f -`.
func (tp *Topology) NFT(ns, script string) error {
	_, err := tp.execStdin(ns, strings.NewReader(script), "nft", "-f", "-")
	return err
}

// ListRuleset returns `nft list ruleset` of namespace ns.
func (tp *Topology) ListRuleset(ns string) (string, error) {
	return tp.Exec(ns, "nft", "list", "ruleset")
}

// Process is a background command started by Start.
type Process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // of Wait; read after done is closed
}

// Start starts a long-running command in namespace ns and returns at once. The command
// runs in its own process group, which is killed on test cleanup; its output is logged
// then if the test failed. It needs a Topology made by New; others use StartProcess.
func (tp *Topology) Start(ns string, args ...string) *Process {
	tp.t.Helper()
	p, err := tp.StartProcess(ns, args...)
	if err != nil {
		tp.t.Fatal(err)
	}
	tp.t.Cleanup(func() {
		_ = p.Stop()
		if tp.t.Failed() {
			tp.t.Logf("output of %q in %s:\n%s", strings.Join(args, " "), ns, p.Output())
		}
	})
	return p
}

// StartProcess is Start for callers without a test: the caller stops the process.
func (tp *Topology) StartProcess(ns string, args ...string) (*Process, error) {
	p := &Process{
		cmd:  exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...),
		out:  &syncBuffer{},
		done: make(chan struct{}),
	}
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	// Pdeathsig covers a test binary that dies without running cleanups.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %q in %s: %w", strings.Join(args, " "), ns, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Output returns what the process has written to stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop kills the process group, waits for the process to exit and returns what Wait
// returned. It may be called more than once.
func (p *Process) Stop() error {
	select {
	case <-p.done:
	default:
		// The group id is the pid (Setpgid); killing the group also ends whatever the
		// command forked.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return p.err
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of stdout and stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
