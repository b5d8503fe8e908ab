package cluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardproxy/shardproxy/test/controlplane"
)

const (
	dirPrefix = "shardproxy-cluster-"
	stateFile = "state.json"
	cgroupFS  = "/sys/fs/cgroup"
	netnsDir  = "/run/netns"
	// libModules is where a node keeps its kernel modules.
	libModules = "/lib/modules"
)

// state is what teardown needs to undo a cluster, saved in its directory so that the next
// Start can undo one whose test process was killed.
type state struct {
	Owner      int      `json:"owner"`
	Dir        string   `json:"dir"`
	Namespaces []string `json:"namespaces"`
	// CgroupName is the cluster's cgroup: each node's kubelet has its cgroup root below.
	CgroupName string `json:"cgroupName"`
	// Socks are the nodes' containerd sockets; Sock the one of a one-node cluster's state
	// written before there were several.
	Socks []string `json:"socks"`
	Sock  string   `json:"sock,omitempty"`
	// PodNetns are the inodes of the pods' network namespaces, found at teardown.
	PodNetns []uint64 `json:"podNetns"`
	// LibModules is set when Start created an empty /lib/modules: these VMs have none,
	// and the replace overlay mounts it (type Directory) into its init container.
	LibModules bool `json:"libModules"`
}

func (s state) save() error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Dir, stateFile), data, 0o644)
}

// createCgroups creates a kubelet's cgroup root (a path such as spc-ID/node-1) in every
// v1 hierarchy (the kubelet refuses a root that does not exist); in cpuset each level
// needs its CPUs and memory nodes filled in before a child can have them.
func createCgroups(name string) error {
	for _, h := range cgroupHierarchies() {
		parent := h
		for _, part := range strings.Split(name, "/") {
			dir := filepath.Join(parent, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("creating cgroup %s: %w", dir, err)
			}
			if filepath.Base(h) == "cpuset" {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, err := os.ReadFile(filepath.Join(parent, f))
					if err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
						return fmt.Errorf("writing %s in %s: %w", f, dir, err)
					}
				}
			}
			parent = dir
		}
	}
	return nil
}

// cgroupHierarchies are the mounted cgroup hierarchies (v1 controllers and the unified one).
func cgroupHierarchies() []string {
	entries, _ := os.ReadDir(cgroupFS)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join(cgroupFS, e.Name()))
		}
	}
	return out
}

// teardownNode ends every process of the nodes: the pods' (by cgroup), the containerds,
// and containerd's shims (by the socket they were started for).
func teardownNode(s *state, containerds []*controlplane.Child, logf func(string, ...any)) error {
	var errs []error
	// The pods' network namespaces, known by inode while their processes hold them: other
	// clusters on the machine have cni-* namespaces too.
	for _, pid := range cgroupPids(s.CgroupName) {
		if ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && !slices.Contains(s.PodNetns, ino) {
			s.PodNetns = append(s.PodNetns, ino)
		}
	}
	for range 50 {
		pids := cgroupPids(s.CgroupName)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pids := cgroupPids(s.CgroupName); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("pod processes %v survived SIGKILL", pids))
	}
	errs = append(errs, stopAll(containerds, 10*time.Second))
	// A crashed run's, or one whose Child was lost: every containerd of the cluster's
	// directory (one-node clusters kept theirs in DIR/containerd, nodes in DIR/node-N).
	killMatching("containerd --config "+s.Dir+"/", logf)
	for _, sock := range append(slices.Clone(s.Socks), s.Sock) {
		if sock != "" {
			killMatching("-address "+sock, logf)
		}
	}
	return errors.Join(errs...)
}

// cgroupPids lists the processes in the cgroup subtree name of the pids hierarchy.
func cgroupPids(name string) []int {
	var pids []int
	_ = filepath.WalkDir(filepath.Join(cgroupFS, "pids", name), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// killMatching kills the processes whose command line contains pattern (a path of this
// cluster's own directory, so nothing else matches) and waits for them to go.
func killMatching(pattern string, logf func(string, ...any)) {
	for range 50 {
		pids := pidsMatching(pattern)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			logf("cluster teardown: killing %d (%s)", pid, pattern)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func pidsMatching(pattern string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(strings.ReplaceAll(string(data), "\x00", " "), pattern) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// teardownHost undoes what is left once no process of the cluster runs: mounts under its
// directory and the pods' network namespaces, cgroups, the cluster's namespaces, files.
func teardownHost(s state) error {
	var errs []error
	var mounts []string
	for _, m := range mountPoints() {
		if strings.HasPrefix(m, s.Dir+"/") {
			mounts = append(mounts, m)
		}
	}
	for _, ns := range listNetns() {
		path := filepath.Join(netnsDir, ns)
		if ino, err := nsInode(path); err == nil && strings.HasPrefix(ns, "cni-") && slices.Contains(s.PodNetns, ino) {
			mounts = append(mounts, path)
		}
	}
	// Deepest first.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
		if strings.HasPrefix(m, netnsDir+"/") {
			_ = os.Remove(m)
		}
	}
	errs = append(errs, removeCgroups(s.CgroupName))
	if s.LibModules {
		if err := os.Remove(libModules); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, ns := range s.Namespaces {
		if slices.Contains(listNetns(), ns) {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", ns, err, out))
			}
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeCgroups removes the cgroup subtree name in every hierarchy, deepest first.
func removeCgroups(name string) error {
	if name == "" {
		return nil
	}
	var errs []error
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, name), func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := removeCgroup(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeCgroup retries briefly: a cgroup whose last process just died is busy a moment.
func removeCgroup(dir string) error {
	var err error
	for range 50 {
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}

// mountPoints lists the mount points of this mount namespace.
func mountPoints() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			out = append(out, fields[4])
		}
	}
	return out
}

func listNetns() []string {
	entries, _ := os.ReadDir(netnsDir)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// RemoveStale tears down clusters whose test process died before it could, and
// returns what it could not tear down (after trying every cluster).
func RemoveStale(logf func(string, ...any)) error {
	var errs []error
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, stateFile))
		if err != nil {
			continue
		}
		var s state
		if json.Unmarshal(data, &s) != nil || s.Dir != dir || !errors.Is(syscall.Kill(s.Owner, 0), syscall.ESRCH) {
			continue
		}
		logf("cluster: tearing down %s, left by dead process %d", dir, s.Owner)
		nodeErr := teardownNode(&s, nil, logf)
		// Then whatever else the dead process ran with the cluster's directory in its
		// command line (kube-proxy, e2e.test): an e2e.test that outlived it wrote its
		// report into the directory after the teardown had removed it.
		killMatching(dir+"/", logf)
		if err := errors.Join(nodeErr, teardownHost(s)); err != nil {
			logf("cluster: tearing down %s: %v", dir, err)
			errs = append(errs, fmt.Errorf("tearing down %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// nsInode is the inode of a namespace file (/proc/PID/ns/net or a bind mount of one).
func nsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
