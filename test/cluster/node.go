package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/controlplane"
)

// cniBinDir is where Debian's containernetworking-plugins installs the plugins.
const cniBinDir = "/usr/lib/cni"

// containerdConfig is containerd 1.6's configuration for this node: every path under the
// cluster's directory, the local pause image, runc with cgroupfs (cgroups are v1 here),
// and restrict_oom_score_adj, since processes here lack CAP_SYS_RESOURCE and runc fails
// ("can't get final child's PID from pipe: EOF") on a negative oom_score_adj.
const containerdConfig = `version = 2
root = "%[1]s/root"
state = "%[1]s/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "%[2]s"

[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[3]s"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[4]s"
    conf_dir = "%[5]s"
`

func (n *Node) startContainerd(ctx context.Context) error {
	dir := filepath.Join(n.Dir, "containerd")
	if err := os.MkdirAll(filepath.Join(n.Dir, "cni", "net.d"), 0o755); err != nil {
		return err
	}
	config := filepath.Join(dir, "config.toml")
	content := fmt.Sprintf(containerdConfig, dir, n.sock, PauseImage, cniBinDir, filepath.Join(n.Dir, "cni", "net.d"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(config, []byte(content), 0o644); err != nil {
		return err
	}
	// containerd runs in a UTS namespace of its own named for the node, as a node is a
	// host of its own: its containers, hostNetwork pods among them, inherit it, and
	// upstream's tests expect a hostNetwork pod to answer with its node's name ("should
	// function for service endpoints using hostNetwork"), not the machine's.
	ch, err := n.StartChild("containerd", "unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, n.Name,
		"containerd", "--config", config)
	if err != nil {
		return err
	}
	return poll(ctx, 30*time.Second, "containerd's socket", func() (bool, error) {
		if !ch.Running() {
			return false, fmt.Errorf("containerd exited: %v:\n%s", ch.ExitErr(), ch.LogTail(20))
		}
		_, err := n.ctr(ctx, "version")
		return err == nil, nil
	})
}

// ctr runs containerd's client against the node's containerd, in the CRI namespace.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	return n.Run(ctx, "ctr", append([]string{"--address", n.sock, "--namespace", "k8s.io"}, args...)...)
}

// kubeletConfig is the KubeletConfiguration: cgroupfs on cgroup v1 (which v1.36 refuses
// unless failCgroupV1 is false), a cgroup root of its own (so that another kubelet on the
// machine does not manage the same /kubepods), anonymous read access for kube-apiserver
// (kubectl logs and exec), the cluster DNS, and eviction thresholds that a shared CI
// disk does not cross.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[1]s
containerRuntimeEndpoint: unix://%[2]s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
clusterDNS: [%[3]s]
clusterDomain: cluster.local
resolvConf: %[4]s
podLogsDir: %[5]s
failSwapOn: false
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}
rotateCertificates: false
`

func (n *Node) startKubelet(ctx context.Context) error {
	if err := createCgroups(n.cgroup); err != nil {
		return err
	}
	if err := n.c.ensureLibModules(); err != nil {
		return err
	}
	dir := filepath.Join(n.Dir, "kubelet")
	resolv := filepath.Join(n.Dir, "resolv.conf")
	logs := filepath.Join(n.Dir, "pod-logs")
	for _, d := range []string{dir, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Pods with hostNetwork and dnsPolicy Default get this: nothing outside is reachable.
	if err := os.WriteFile(resolv, []byte("nameserver "+ExtIP+"\n"), 0o644); err != nil {
		return err
	}
	config := filepath.Join(n.Dir, "kubelet.yaml")
	content := fmt.Sprintf(kubeletConfig, n.cgroup, n.sock, DNSIP, resolv, logs)
	if err := os.WriteFile(config, []byte(content), 0o644); err != nil {
		return err
	}
	_, err := n.StartChild("kubelet", n.c.Bins["kubelet"],
		"--config="+config,
		"--kubeconfig="+n.c.Kubeconfig,
		"--root-dir="+dir,
		"--cert-dir="+filepath.Join(dir, "pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP+","+n.IPv6,
		"--v=1",
	)
	return err
}

// ensureLibModules creates an empty /lib/modules when the host has none (these VMs):
// the replace overlay mounts it (type Directory) into its init container.
func (c *Cluster) ensureLibModules() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := os.Stat(libModules); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	c.st.LibModules = true
	if err := c.st.save(); err != nil {
		return err
	}
	return os.Mkdir(libModules, 0o755)
}

// configureCNI writes the bridge network for the node's pod CIDRs (both families) once
// the controller manager has given the registered node them (the kubelet reports
// NotReady until then).
func (n *Node) configureCNI(ctx context.Context) error {
	if err := n.waitPodCIDRs(ctx); err != nil {
		return err
	}
	var ranges [][]map[string]string
	for _, cidr := range n.PodCIDRs {
		ranges = append(ranges, []map[string]string{{"subnet": cidr}})
	}
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       n.c.st.CgroupName + "-" + n.Name,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  ranges,
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
					"dataDir": filepath.Join(n.Dir, "cni", "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.Dir, "cni", "net.d", "10-bridge.conflist"), data, 0o644)
}

// waitReady waits for the node's Node object to be Ready.
func (n *Node) waitReady(ctx context.Context) error {
	return poll(ctx, 2*time.Minute, "node "+n.Name+" Ready", func() (bool, error) {
		if err := n.c.childrenRunning(); err != nil {
			return false, err
		}
		node, err := n.c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
}

// WaitNodesReady waits for every node to be Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context) error {
	return c.eachNode((*Node).waitReady)(ctx)
}

// childrenRunning fails with the log tails of the control plane's and nodes' processes
// that exited.
func (c *Cluster) childrenRunning() error {
	var dead []string
	check := func(prefix string, children map[string]*controlplane.Child) {
		for name, ch := range children {
			if !ch.Running() {
				dead = append(dead, fmt.Sprintf("%s%s exited (%v); log ends:\n%s", prefix, name, ch.ExitErr(), ch.LogTail(25)))
			}
		}
	}
	c.mu.Lock()
	check("", c.children)
	c.mu.Unlock()
	for _, n := range c.Nodes {
		n.mu.Lock()
		check(n.Name+"'s ", n.children)
		n.mu.Unlock()
	}
	if len(dead) > 0 {
		return fmt.Errorf("%s", strings.Join(dead, "\n"))
	}
	return nil
}

// poll calls check every 250ms until it returns true or an error, or timeout or ctx ends.
func poll(ctx context.Context, timeout time.Duration, what string, check func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	for {
		done, err := check()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-ticker.C:
		}
	}
}

// RestartContainerd stops the node's containerd and starts it again with the same
// configuration; the containers keep running under their shims meanwhile.
func (n *Node) RestartContainerd(ctx context.Context) error {
	if err := n.StopChild("containerd", 10*time.Second); err != nil {
		return err
	}
	return n.startContainerd(ctx)
}

// RestartKubelet stops the node's kubelet and starts it again with the same flags.
func (n *Node) RestartKubelet(ctx context.Context) error {
	if err := n.StopChild("kubelet", 10*time.Second); err != nil {
		return err
	}
	return n.startKubelet(ctx)
}
