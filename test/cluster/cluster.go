// Package cluster runs a real, throwaway, dual-stack Kubernetes cluster of several nodes
// (two by default, $CLUSTER_NODES) for the cluster test layer: the control plane of
// test/controlplane (etcd + kube-apiserver) plus kube-controller-manager and
// kube-scheduler, and nodes each made of containerd 1.6 (Debian), runc, the bridge CNI
// plugin and a kubelet, all v1.36.3 built from the k8s.io/kubernetes module
// (hack/build-apiserver.sh --node). Cluster DNS is CoreDNS, built from its Go module,
// behind a kube-dns Service. No registry is reachable: every image is built offline
// (hack/build-image.sh) and imported into every node's containerd.
//
// Each node lives in a network namespace of its own, joined by a veth to the bridge of a
// namespace that plays the outside world, the nodes' LAN and their default gateway, so
// nothing the cluster does touches the host's network, and unanswered Service traffic is
// not answered by the host's own default route. Each node's pod CIDRs are routed to it
// from the other nodes, so pods reach pods across nodes without NAT. The control plane
// runs in node-1's namespace. The nodes' processes run there through `nsenter --net`
// (not `ip netns exec`, which remounts /sys and hides the cgroup hierarchy). Close, or
// the next Start after a crashed run, leaves the host as it was found: no process, mount,
// network namespace or cgroup of the cluster remains.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Addresses of the cluster. Every node has an IPv4 and an IPv6 address on a veth whose
// other end is a port of the outside namespace's bridge (ExtIP, ExtIPv6 there): the
// nodes' LAN and their default gateway. Pod CIDRs (from ClusterCIDRs, one of each family
// per node, allocated by kube-controller-manager) are routed between the nodes by their
// addresses, as a routing CNI does, so pods reach pods on other nodes without NAT.
const (
	ExtIP = "172.31.0.1"
	// APIServerIP is node-1's address, where kube-apiserver listens (APIPort).
	APIServerIP = "172.31.0.2"
	ExtIPv6     = "fd00:172:31::1"
	DNSIP       = "10.96.0.10"
	APIPort     = 6443
	// PauseImage is the nodes' sandbox image (hack/pause).
	PauseImage = "localhost/pause:3.10"
	// NodesEnv sets how many nodes Start runs when Options.Nodes is 0 (default 2).
	NodesEnv = "CLUSTER_NODES"
	// maxNodes keeps the nodes' addresses and names simple (one digit).
	maxNodes = 9
)

// ServiceCIDRs and ClusterCIDRs are the cluster's Service and pod ranges, IPv4 first
// (the primary family): every Service is IPv4 unless it asks for IPv6 or both.
var (
	ServiceCIDRs = []string{"10.96.0.0/16", "fd00:10:96::/112"}
	ClusterCIDRs = []string{"10.244.0.0/16", "fd00:10:244::/56"}
)

// Options configure Start.
type Options struct {
	// RepoRoot is the repository, for hack/build-apiserver.sh and hack/build-image.sh.
	RepoRoot string
	// Logf reports progress (default none).
	Logf func(format string, args ...any)
	// Images are extra image archives (hack/build-image.sh output) to import into every
	// node's containerd, with the name to import each under ("localhost/NAME").
	Images map[string]string
	// Nodes is the number of nodes (default $CLUSTER_NODES, else 2; at most 9).
	Nodes int
}

// Cluster is a running cluster: one control plane (in the first node's namespace, as
// on a control-plane node) and its Nodes.
type Cluster struct {
	// Nodes are the nodes, node-1 first.
	Nodes []*Node
	// ExtNS is the outside world's namespace: the nodes' LAN and default gateway.
	ExtNS string
	// CP is the control plane; its Host is https://Nodes[0].IP:APIPort.
	CP *controlplane.ControlPlane
	// Client is an admin client (dialing inside the first node's namespace).
	Client kubernetes.Interface
	// Dir holds the configurations, the nodes' state and every log.
	Dir string
	// Kubeconfig is the admin kubeconfig, for programs run inside a node's namespace.
	Kubeconfig string
	// StartTime is how long Start took once the binaries and images were built.
	StartTime time.Duration
	// Bins are the paths of the Kubernetes binaries by name (kubelet, kubectl, ...).
	Bins map[string]string

	opts   Options
	st     state
	stopCP func() error
	// dnsArchive is CoreDNS's image archive; its name carries the tag.
	dnsArchive string
	// ownImages are the nodes' own image archives (pause, CoreDNS) and the caller's.
	ownImages map[string]string

	mu sync.Mutex
	// children are the control plane's processes besides etcd and kube-apiserver.
	children map[string]*controlplane.Child
}

// Node is one node of the cluster: a network namespace with its own containerd and
// kubelet (own root, cert, pod-logs and state directories, cgroup root, socket), CNI
// bridge and pod CIDRs.
type Node struct {
	// Name is the Node object's name, node-N.
	Name string
	// NS is the node's network namespace.
	NS string
	// IP and IPv6 are the node's addresses (its InternalIPs, IPv4 first).
	IP, IPv6 string
	// Dir holds the node's configuration, state and logs (inside Cluster.Dir).
	Dir string
	// PodCIDRs are the node's pod CIDRs, IPv4 first, once Start has returned.
	PodCIDRs []string

	c *Cluster
	// index is the node's position in Cluster.Nodes (0 for node-1).
	index int
	sock  string
	// cgroup is the kubelet's cgroup root, below the cluster's.
	cgroup string

	mu       sync.Mutex
	children map[string]*controlplane.Child
}

// Start brings the cluster up: namespaces, control plane, controller manager and
// scheduler, and on every node at once containerd with the images, the kubelet and CNI;
// then the routes between the nodes' pod CIDRs and CoreDNS. It returns once every node
// is Ready and CoreDNS is available. On error the returned Cluster (if not nil) must be
// closed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.Nodes == 0 {
		n, err := NodesFromEnv()
		if err != nil {
			return nil, err
		}
		opts.Nodes = n
	}
	if opts.Nodes < 1 || opts.Nodes > maxNodes {
		return nil, fmt.Errorf("cluster: %d nodes: want 1 to %d", opts.Nodes, maxNodes)
	}
	if err := checkTools(); err != nil {
		return nil, err
	}
	RemoveStale(opts.Logf)
	bins, err := buildBinaries(ctx, opts)
	if err != nil {
		return nil, err
	}
	c, err := newCluster(opts, bins)
	if err != nil {
		return c, err
	}
	start := time.Now()
	step := func(name string, fn func(context.Context) error) error {
		t0 := time.Now()
		if err := fn(ctx); err != nil {
			return fmt.Errorf("cluster: %s: %w", name, err)
		}
		opts.Logf("cluster: %s up in %v", name, time.Since(t0).Round(time.Millisecond))
		return nil
	}
	if err := step("network namespaces", c.setupNetwork); err != nil {
		return c, err
	}
	// Every node's containerd and images while the control plane starts: neither needs
	// the other, and importing the images is most of a node's start-up.
	nodesUp := make(chan error, 1)
	go func() {
		nodesUp <- step(fmt.Sprintf("containerd with the images on %d nodes", len(c.Nodes)), c.startRuntimes)
	}()
	err = step("control plane", c.startControlPlane)
	if err == nil {
		err = step("controller manager and scheduler", c.startControllers)
	}
	if nodesErr := <-nodesUp; err == nil {
		err = nodesErr
	}
	if err != nil {
		return c, err
	}
	for _, s := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"kubelets", c.eachNode((*Node).startKubelet)},
		{"CNI", c.eachNode((*Node).configureCNI)},
		{"routes between the nodes' pod CIDRs", c.routePodCIDRs},
		{"nodes Ready", c.eachNode((*Node).waitReady)},
		{"CoreDNS", c.startDNS},
	} {
		if err := step(s.name, s.fn); err != nil {
			return c, err
		}
	}
	opts.Logf("cluster: %d nodes Ready with CoreDNS in %v (dir %s)", len(c.Nodes), time.Since(start).Round(time.Second), c.Dir)
	c.StartTime = time.Since(start)
	return c, nil
}

// NodesFromEnv is the number of nodes $CLUSTER_NODES asks for, 2 when unset.
func NodesFromEnv() (int, error) {
	v := os.Getenv(NodesEnv)
	if v == "" {
		return 2, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxNodes {
		return 0, fmt.Errorf("cluster: %s=%q: want a number of nodes from 1 to %d", NodesEnv, v, maxNodes)
	}
	return n, nil
}

// eachNode returns a step that runs fn on every node at once and joins their errors.
func (c *Cluster) eachNode(fn func(*Node, context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		errs := make([]error, len(c.Nodes))
		var wg sync.WaitGroup
		for i, n := range c.Nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := fn(n, ctx); err != nil {
					errs[i] = fmt.Errorf("%s: %w", n.Name, err)
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
}

func newCluster(opts Options, bins map[string]string) (*Cluster, error) {
	suffix := make([]byte, 3)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(suffix)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating the cluster directory: %w", err)
	}
	c := &Cluster{
		ExtNS: "spc-ext-" + id, Dir: dir, Bins: bins, opts: opts,
		children: map[string]*controlplane.Child{},
	}
	c.st = state{Owner: os.Getpid(), Dir: dir, Namespaces: []string{c.ExtNS}, CgroupName: "spc-" + id}
	for i := range opts.Nodes {
		n := &Node{
			Name: fmt.Sprintf("node-%d", i+1), NS: fmt.Sprintf("spc-n%d-%s", i+1, id),
			IP: fmt.Sprintf("172.31.0.%d", i+2), IPv6: fmt.Sprintf("fd00:172:31::%d", i+2),
			Dir: filepath.Join(dir, fmt.Sprintf("node-%d", i+1)),
			c:   c, index: i, children: map[string]*controlplane.Child{},
		}
		n.sock = filepath.Join(n.Dir, "containerd", "containerd.sock")
		n.cgroup = c.st.CgroupName + "/" + n.Name
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		c.st.Namespaces = append(c.st.Namespaces, n.NS)
		c.st.Socks = append(c.st.Socks, n.sock)
	}
	return c, c.st.save()
}

// Close stops everything and removes every trace of the cluster from the host.
func (c *Cluster) Close() error {
	if c == nil {
		return nil
	}
	// The kubelets first (every node's at once), so they stop restarting containers;
	// then the controllers, the pods' processes, containerd and its shims (teardown),
	// then the control plane.
	var containerds, others []*controlplane.Child
	for _, n := range c.Nodes {
		n.mu.Lock()
		for name, ch := range n.children {
			if name == "containerd" {
				containerds = append(containerds, ch)
			} else {
				others = append(others, ch)
			}
		}
		n.children = map[string]*controlplane.Child{}
		n.mu.Unlock()
	}
	errs := []error{stopAll(others, 15*time.Second)}
	c.mu.Lock()
	children := c.children
	c.children = map[string]*controlplane.Child{}
	c.mu.Unlock()
	for _, ch := range children {
		errs = append(errs, ch.Stop(15*time.Second))
	}
	errs = append(errs, teardownNode(&c.st, containerds, c.opts.Logf))
	if c.stopCP != nil {
		errs = append(errs, c.stopCP())
	}
	errs = append(errs, teardownHost(c.st))
	return errors.Join(errs...)
}

// stopAll stops the processes all at once and joins their errors.
func stopAll(children []*controlplane.Child, timeout time.Duration) error {
	errs := make([]error, len(children))
	var wg sync.WaitGroup
	for i, ch := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ch.Stop(timeout)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// RESTConfig is the admin client configuration (dialing inside the first node's
// namespace).
func (c *Cluster) RESTConfig() *rest.Config { return c.CP.RESTConfig() }

// Dialer opens connections from inside ns (a node's NS, or ExtNS).
func (c *Cluster) Dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&netns.Topology{}).Dialer(ns)
}

// Node returns node-N (1-based, as the names), nil if there is none.
func (c *Cluster) Node(n int) *Node {
	if n < 1 || n > len(c.Nodes) {
		return nil
	}
	return c.Nodes[n-1]
}

// NodeByName returns the node named name, nil if none.
func (c *Cluster) NodeByName(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Child returns the named control-plane process (kube-controller-manager,
// kube-scheduler), or the named process of the first node (kubelet, containerd), nil if
// none.
func (c *Cluster) Child(name string) *controlplane.Child {
	c.mu.Lock()
	ch := c.children[name]
	c.mu.Unlock()
	if ch == nil && len(c.Nodes) > 0 {
		ch = c.Nodes[0].Child(name)
	}
	return ch
}

// startChild runs a control-plane process inside the first node's namespace, logging to
// Dir/NAME.log.
func (c *Cluster) startChild(name, bin string, args ...string) (*controlplane.Child, error) {
	ch, err := startIn(c.Nodes[0].NS, filepath.Join(c.Dir, name+".log"), name, bin, args...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.children[name] = ch
	c.mu.Unlock()
	return ch, nil
}

// Child returns the node's named process (kubelet, containerd, kube-proxy), nil if none.
func (n *Node) Child(name string) *controlplane.Child {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.children[name]
}

// StartChild runs bin inside the node's namespace as the node's process name, logging to
// the node's NAME.log, until the cluster closes or StopChild stops it.
func (n *Node) StartChild(name, bin string, args ...string) (*controlplane.Child, error) {
	ch, err := startIn(n.NS, filepath.Join(n.Dir, name+".log"), name, bin, args...)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.children[name] = ch
	n.mu.Unlock()
	return ch, nil
}

// StopChild stops the node's named process, if it runs.
func (n *Node) StopChild(name string, timeout time.Duration) error {
	n.mu.Lock()
	ch := n.children[name]
	delete(n.children, name)
	n.mu.Unlock()
	if ch == nil {
		return nil
	}
	return ch.Stop(timeout)
}

func startIn(ns, log, name, bin string, args ...string) (*controlplane.Child, error) {
	return controlplane.StartChild(name, log, "nsenter", append([]string{"--net=/run/netns/" + ns, bin}, args...)...)
}

// apiServer is the kube-apiserver endpoint as the nodes and their pods see it.
func (c *Cluster) apiServer() string {
	return "https://" + c.Nodes[0].IP + ":" + strconv.Itoa(APIPort)
}
