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

func (c *Cluster) startContainerd(ctx context.Context) error {
	dir := filepath.Join(c.Dir, "containerd")
	if err := os.MkdirAll(filepath.Join(c.Dir, "cni", "net.d"), 0o755); err != nil {
		return err
	}
	config := filepath.Join(dir, "config.toml")
	content := fmt.Sprintf(containerdConfig, dir, c.st.Sock, PauseImage, cniBinDir, filepath.Join(c.Dir, "cni", "net.d"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(config, []byte(content), 0o644); err != nil {
		return err
	}
	ch, err := c.startChild("containerd", "containerd", "--config", config)
	if err != nil {
		return err
	}
	return poll(ctx, 30*time.Second, "containerd's socket", func() (bool, error) {
		if !ch.Running() {
			return false, fmt.Errorf("containerd exited: %v:\n%s", ch.ExitErr(), ch.LogTail(20))
		}
		_, err := c.ctr(ctx, "version")
		return err == nil, nil
	})
}

// ctr runs containerd's client against the node's containerd, in the CRI namespace.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	return c.InNode(ctx, "ctr", append([]string{"--address", c.st.Sock, "--namespace", "k8s.io"}, args...)...)
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

func (c *Cluster) startKubelet(ctx context.Context) error {
	if err := createCgroups(c.st.CgroupName); err != nil {
		return err
	}
	if _, err := os.Stat(libModules); errors.Is(err, os.ErrNotExist) {
		c.st.LibModules = true
		if err := c.st.save(); err != nil {
			return err
		}
		if err := os.Mkdir(libModules, 0o755); err != nil {
			return err
		}
	}
	dir := filepath.Join(c.Dir, "kubelet")
	resolv := filepath.Join(c.Dir, "resolv.conf")
	logs := filepath.Join(c.Dir, "pod-logs")
	for _, d := range []string{dir, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Pods with hostNetwork and dnsPolicy Default get this: nothing outside is reachable.
	if err := os.WriteFile(resolv, []byte("nameserver "+ExtIP+"\n"), 0o644); err != nil {
		return err
	}
	config := filepath.Join(c.Dir, "kubelet.yaml")
	content := fmt.Sprintf(kubeletConfig, c.st.CgroupName, c.st.Sock, DNSIP, resolv, logs)
	if err := os.WriteFile(config, []byte(content), 0o644); err != nil {
		return err
	}
	_, err := c.startChild("kubelet", c.Bins["kubelet"],
		"--config="+config,
		"--kubeconfig="+c.Kubeconfig,
		"--root-dir="+dir,
		"--cert-dir="+filepath.Join(dir, "pki"),
		"--hostname-override="+NodeName,
		"--node-ip="+NodeIP,
		"--v=1",
	)
	return err
}

// configureCNI writes the bridge network for the node's pod CIDR once the controller
// manager has given the registered node one (the kubelet reports NotReady until then).
func (c *Cluster) configureCNI(ctx context.Context) error {
	var cidr string
	err := poll(ctx, 90*time.Second, "the node's pod CIDR", func() (bool, error) {
		if err := c.childrenRunning(); err != nil {
			return false, err
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		cidr = node.Spec.PodCIDR
		return cidr != "", nil
	})
	if err != nil {
		return err
	}
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       c.st.CgroupName,
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": cidr}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(c.Dir, "cni", "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, "cni", "net.d", "10-bridge.conflist"), data, 0o644)
}

func (c *Cluster) waitNodeReady(ctx context.Context) error {
	return poll(ctx, 2*time.Minute, "node "+NodeName+" Ready", func() (bool, error) {
		if err := c.childrenRunning(); err != nil {
			return false, err
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
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

// childrenRunning fails with the log tail of the first node component that exited.
func (c *Cluster) childrenRunning() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var dead []string
	for name, ch := range c.children {
		if !ch.Running() {
			dead = append(dead, fmt.Sprintf("%s exited (%v); log ends:\n%s", name, ch.ExitErr(), ch.LogTail(25)))
		}
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
func (c *Cluster) RestartContainerd(ctx context.Context) error {
	if ch := c.Child("containerd"); ch != nil {
		if err := ch.Stop(10 * time.Second); err != nil {
			return err
		}
	}
	return c.startContainerd(ctx)
}

// RestartKubelet stops the kubelet and starts it again with the same flags.
func (c *Cluster) RestartKubelet(ctx context.Context) error {
	if ch := c.Child("kubelet"); ch != nil {
		if err := ch.Stop(10 * time.Second); err != nil {
			return err
		}
	}
	return c.startKubelet(ctx)
}
