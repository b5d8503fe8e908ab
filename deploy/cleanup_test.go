package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestCleanupManifest renders deploy/cleanup, the uninstall's per-node cleanup: one
// DaemonSet and nothing else; on every node (all taints tolerated) in the node's network
// namespace, the release's image runs `shardproxy cleanup --all` (cmd/shardproxy's
// TestCleanupAllInNamespace shows on the real kernel what that deletes) as an init
// container with the supervisor's privileges (NET_ADMIN, user 65532) and no API token,
// and then idles with no capability.
func TestCleanupManifest(t *testing.T) {
	objs := render(t, "cleanup")
	if len(objs) != 1 {
		t.Fatalf("%d objects, want the DaemonSet only", len(objs))
	}
	ds := only[appsv1.DaemonSet](t, objs, "DaemonSet")
	checkImages(t, ds)
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork {
		t.Error("not hostNetwork: it would clean up its own pod namespace, not the node's")
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("mounts a ServiceAccount token it does not need")
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Error("does not tolerate every taint: tainted nodes would keep their tables")
	}
	if len(pod.InitContainers) != 1 {
		t.Fatalf("%d init containers, want the cleanup", len(pod.InitContainers))
	}
	ic := pod.InitContainers[0]
	if len(ic.Command) != 0 || !slices.Equal(ic.Args, []string{"cleanup", "--all"}) {
		t.Errorf("init container command %q args %q, want the image's entrypoint with cleanup --all", ic.Command, ic.Args)
	}
	sc := ic.SecurityContext
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) ||
		sc.RunAsUser == nil || *sc.RunAsUser != imageUID || (sc.Privileged != nil && *sc.Privileged) {
		t.Errorf("cleanup securityContext %+v, want the supervisor's: user %d, NET_ADMIN only, not privileged", sc, imageUID)
	}
	for _, c := range pod.Containers {
		if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil || len(c.SecurityContext.Capabilities.Add) != 0 ||
			!slices.Equal(c.SecurityContext.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s may hold capabilities: it only idles", c.Name)
		}
	}
}
