package cluster

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cl is the cluster every test of the package shares: bringing a node up takes a minute,
// so it is started once. Tests leave it as they found it (their own namespaces, removed).
var cl *Cluster

// shardproxyTag is the tag of the image built from the repository for this run.
const shardproxyTag = "dev"

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if testing.Short() || os.Geteuid() != 0 {
		log.Printf("cluster: skipped (needs root and no -short)")
		return m.Run()
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		log.Print(err)
		return 1
	}
	// A crashed earlier run's cluster goes first (Start would remove it too): the host
	// as found is the host without it. Snapshotting before that saw the /lib/modules a
	// crashed run had created, which the cleanup then removed: "exists: false, was true".
	removeStale(log.Printf)
	before := snapshotHost()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	images, err := BuildImages(ctx, root, []string{"TAG=" + shardproxyTag}, "shardproxy", "agnhost")
	if err != nil {
		log.Print(err)
		return 1
	}
	agnhostImage = "localhost/agnhost:" + strings.TrimSuffix(strings.TrimPrefix(filepath.Base(images["agnhost"]), "agnhost-"), ".tar")
	imagesTime := time.Since(start)
	c, err := Start(ctx, Options{RepoRoot: root, Logf: log.Printf, Images: images})
	code := 1
	if err != nil {
		log.Printf("cluster start: %v", err)
		if c != nil {
			for _, name := range []string{"kubelet", "containerd", "kube-controller-manager"} {
				if ch := c.Child(name); ch != nil {
					log.Printf("%s log tail:\n%s", name, ch.LogTail(30))
				}
			}
		}
	} else {
		cl = c
		fmt.Printf("cluster: images built in %v; node Ready with CoreDNS %v later\n", imagesTime.Round(time.Second), c.StartTime.Round(time.Second))
		code = m.Run()
	}
	t0 := time.Now()
	if err := c.Close(); err != nil {
		log.Printf("cluster teardown: %v", err)
		code = 1
	}
	after := hostState{libModules: snapshotHost().libModules}
	if c != nil {
		after = leftovers(c)
	}
	if diff := before.diff(after); diff != "" {
		log.Printf("cluster teardown left the host changed:\n%s", diff)
		return 1
	}
	fmt.Printf("cluster: torn down in %v, host as found (no process, mount, network namespace or cgroup left)\n", time.Since(t0).Round(time.Millisecond))
	return code
}

// need skips a test when there is no cluster (-short, not root).
func need(t *testing.T) *Cluster {
	t.Helper()
	if cl == nil {
		t.Skip("no cluster (needs root and no -short)")
	}
	return cl
}

// hostState is what a cluster must leave as it found it. Only what a cluster creates is
// looked at (its prefixes): other engineers' tests change the host meanwhile.
type hostState struct {
	netns, mounts, cgroups, procs []string
	libModules                    bool
}

func snapshotHost() hostState {
	var s hostState
	_, err := os.Stat(libModules)
	s.libModules = err == nil
	return s
}

// leftovers lists what of cluster c is still on the host: its namespaces, mounts under
// its directory or of its pods' namespaces, cgroups and processes. Other clusters (other
// engineers' test runs) are not looked at.
func leftovers(c *Cluster) hostState {
	var s hostState
	for _, ns := range listNetns() {
		// A pod's namespace by inode, and only a cni-* one, as teardownHost: once
		// unmounted its inode is free for any new namespace (another engineer's test
		// run's spd*-node was taken for a leftover pod namespace).
		ino, _ := nsInode(filepath.Join(netnsDir, ns))
		if slices.Contains(c.st.Namespaces, ns) || strings.HasPrefix(ns, "cni-") && slices.Contains(c.st.PodNetns, ino) {
			s.netns = append(s.netns, ns)
		}
	}
	for _, m := range mountPoints() {
		if strings.HasPrefix(m, c.Dir+"/") {
			s.mounts = append(s.mounts, m)
		}
	}
	for _, h := range cgroupHierarchies() {
		if _, err := os.Stat(filepath.Join(h, c.st.CgroupName)); err == nil {
			s.cgroups = append(s.cgroups, filepath.Join(h, c.st.CgroupName))
		}
	}
	for _, pid := range pidsMatching(c.Dir + "/") {
		s.procs = append(s.procs, fmt.Sprint(pid))
	}
	_, err := os.Stat(libModules)
	s.libModules = err == nil
	return s
}

// diff lists what after has that s had not.
func (s hostState) diff(after hostState) string {
	var b strings.Builder
	for _, kind := range []struct {
		name          string
		before, after []string
	}{
		{"network namespace", s.netns, after.netns},
		{"mount", s.mounts, after.mounts},
		{"cgroup", s.cgroups, after.cgroups},
		{"process", s.procs, after.procs},
	} {
		for _, v := range kind.after {
			if !slices.Contains(kind.before, v) {
				fmt.Fprintf(&b, "new %s: %s\n", kind.name, v)
			}
		}
	}
	if after.libModules != s.libModules {
		fmt.Fprintf(&b, "%s exists: %v, was %v\n", libModules, after.libModules, s.libModules)
	}
	return b.String()
}
