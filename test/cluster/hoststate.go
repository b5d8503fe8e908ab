package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// HostState is what a cluster must leave as it found it. Only what a cluster creates is
// looked at (its prefixes): other engineers' tests change the host meanwhile.
type HostState struct {
	netns, mounts, cgroups, procs []string
	libModules                    bool
}

// SnapshotHost is the host's state before a cluster starts (after RemoveStale).
func SnapshotHost() HostState {
	var s HostState
	_, err := os.Stat(libModules)
	s.libModules = err == nil
	return s
}

// leftovers lists what of cluster c is still on the host: its namespaces, mounts under
// its directory or of its pods' namespaces, cgroups and processes. Other clusters (other
// engineers' test runs) are not looked at.
func leftovers(c *Cluster) HostState {
	var s HostState
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

// Diff lists what cluster c (closed; nil if it never started) left on the host that s had
// not: "" when the host is as found.
func (s HostState) Diff(c *Cluster) string {
	after := HostState{libModules: SnapshotHost().libModules}
	if c != nil {
		after = leftovers(c)
	}
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
