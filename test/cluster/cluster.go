// Package cluster runs a real, throwaway single-node Kubernetes cluster for the cluster
// test layer: the control plane of test/controlplane (etcd + kube-apiserver) plus
// kube-controller-manager and kube-scheduler, and a node made of containerd 1.6 (Debian),
// runc, the bridge CNI plugin and a kubelet, all v1.36.3 built from the k8s.io/kubernetes
// module (hack/build-apiserver.sh --node). Cluster DNS is CoreDNS, built from its Go
// module, behind a kube-dns Service. No registry is reachable: every image is built
// offline (hack/build-image.sh) and imported into the node's containerd.
//
// The whole node lives in a network namespace of its own (with a veth to a second
// namespace that plays the outside world and the node's default gateway), so nothing the
// cluster does touches the host's network, and unanswered Service traffic is not answered
// by the host's own default route. The node's processes run there through `nsenter --net`
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

// Addresses and names of the cluster. The node's address is on a veth whose other end
// is in the outside namespace (ExtIP), the node's default gateway.
const (
	NodeName    = "node-1"
	NodeIP      = "172.31.0.2"
	ExtIP       = "172.31.0.1"
	ServiceCIDR = "10.96.0.0/16"
	ClusterCIDR = "10.244.0.0/16"
	DNSIP       = "10.96.0.10"
	APIPort     = 6443
	// PauseImage is the node's sandbox image (hack/pause).
	PauseImage = "localhost/pause:3.10"
)

// Options configure Start.
type Options struct {
	// RepoRoot is the repository, for hack/build-apiserver.sh and hack/build-image.sh.
	RepoRoot string
	// Logf reports progress (default none).
	Logf func(format string, args ...any)
	// Images are extra image archives (hack/build-image.sh output) to import into the
	// node's containerd, with the name to import each under ("localhost/NAME").
	Images map[string]string
}

// Cluster is a running cluster.
type Cluster struct {
	// NodeNS is the node's network namespace; ExtNS the outside world's.
	NodeNS, ExtNS string
	// CP is the control plane; its Host is https://NodeIP:APIPort, reachable inside NodeNS.
	CP *controlplane.ControlPlane
	// Client is an admin client (dialing inside NodeNS).
	Client kubernetes.Interface
	// Dir holds the configurations, the node's state and every log.
	Dir string
	// Kubeconfig is the admin kubeconfig, for programs run inside NodeNS.
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

	mu       sync.Mutex
	children map[string]*controlplane.Child
}

// Start brings the cluster up: namespaces, control plane, controller manager, scheduler,
// containerd with the images, kubelet, CNI, CoreDNS; it returns once the node is Ready
// and CoreDNS is available. On error the returned Cluster (if not nil) must be closed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
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
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"network namespaces", c.setupNetwork},
		{"control plane", c.startControlPlane},
		{"controller manager and scheduler", c.startControllers},
		{"containerd", c.startContainerd},
		{"images", c.importImages},
		{"kubelet", c.startKubelet},
		{"CNI", c.configureCNI},
		{"node Ready", c.waitNodeReady},
		{"CoreDNS", c.startDNS},
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.fn(ctx); err != nil {
			return c, fmt.Errorf("cluster: %s: %w", s.name, err)
		}
		opts.Logf("cluster: %s up in %v", s.name, time.Since(t0).Round(time.Millisecond))
	}
	opts.Logf("cluster: node %s Ready with CoreDNS in %v (dir %s)", NodeName, time.Since(start).Round(time.Second), c.Dir)
	c.StartTime = time.Since(start)
	return c, nil
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
		NodeNS: "spc-node-" + id, ExtNS: "spc-ext-" + id, Dir: dir, Bins: bins, opts: opts,
		children: map[string]*controlplane.Child{},
	}
	c.st = state{
		Owner: os.Getpid(), Dir: dir, Namespaces: []string{c.NodeNS, c.ExtNS},
		CgroupName: "spc-" + id, Sock: filepath.Join(dir, "containerd", "containerd.sock"),
	}
	return c, c.st.save()
}

// Close stops everything and removes every trace of the cluster from the host.
func (c *Cluster) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	children := c.children
	c.children = map[string]*controlplane.Child{}
	c.mu.Unlock()
	var errs []error
	// The kubelet first, so it stops restarting containers; then the pods' processes,
	// containerd and its shims (teardown), then the control plane.
	for _, name := range []string{"kubelet", "kube-scheduler", "kube-controller-manager"} {
		if ch := children[name]; ch != nil {
			errs = append(errs, ch.Stop(15*time.Second))
		}
	}
	errs = append(errs, teardownNode(&c.st, children["containerd"], c.opts.Logf))
	if c.stopCP != nil {
		errs = append(errs, c.stopCP())
	}
	errs = append(errs, teardownHost(c.st))
	return errors.Join(errs...)
}

// RESTConfig is the admin client configuration (dialing inside NodeNS).
func (c *Cluster) RESTConfig() *rest.Config { return c.CP.RESTConfig() }

// Dialer opens connections from inside ns (NodeNS or ExtNS).
func (c *Cluster) Dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&netns.Topology{}).Dialer(ns)
}

// Child returns the named node component (kubelet, containerd, ...), nil if none.
func (c *Cluster) Child(name string) *controlplane.Child {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.children[name]
}

// startChild runs bin inside the node's network namespace, logging to Dir/NAME.log.
func (c *Cluster) startChild(name, bin string, args ...string) (*controlplane.Child, error) {
	nsArgs := append([]string{"--net=/run/netns/" + c.NodeNS, bin}, args...)
	ch, err := controlplane.StartChild(name, filepath.Join(c.Dir, name+".log"), "nsenter", nsArgs...)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.children[name] = ch
	c.mu.Unlock()
	return ch, nil
}

// apiServer is the kube-apiserver endpoint as the node and its pods see it.
func apiServer() string { return "https://" + NodeIP + ":" + strconv.Itoa(APIPort) }
