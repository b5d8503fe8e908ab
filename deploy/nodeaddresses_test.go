package deploy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/cmd/shardproxy/app"
	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// nodeAddressesExample is an overlay with the node address writer's Component.
const nodeAddressesExample = "node-addresses/example"

// TestNodeAddressesComponent renders node-addresses/example (the alongside overlay, the
// writer's Component, otherNodeAddresses: published) and checks that the writer runs the
// release's image as `node-addresses` in the supervisors' statusNamespace, with a
// ServiceAccount of its own, and that the DaemonSet is the alongside overlay's.
func TestNodeAddressesComponent(t *testing.T) {
	objs := render(t, nodeAddressesExample)
	ds := only[appsv1.DaemonSet](t, objs, "DaemonSet")
	checkImages(t, ds)
	cm := only[corev1.ConfigMap](t, objs, "ConfigMap")
	cfg := decodeConfig(t, nodeAddressesExample, cm.Data[configKey])
	if cfg.OtherNodeAddresses != config.OtherNodeAddressesPublished {
		t.Errorf("otherNodeAddresses %q, want published", cfg.OtherNodeAddresses)
	}
	dep := only[appsv1.Deployment](t, objs, "Deployment")
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	want := releaseRepository + ":" + repoVersion(t)
	if c.Image != want {
		t.Errorf("the writer runs image %q, want the release's %q", c.Image, want)
	}
	if len(c.Args) < 3 || c.Args[0] != "node-addresses" || c.Args[1] != "--namespace" || c.Args[2] != cfg.StatusNamespace {
		t.Errorf("the writer's args %v, want node-addresses --namespace %s (the supervisors' statusNamespace)", c.Args, cfg.StatusNamespace)
	}
	// The writer's admission policy (policy.yaml) names the default list and Lease.
	for _, a := range c.Args {
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); slices.Contains([]string{"name", "lease-name"}, name) && strings.HasPrefix(a, "-") {
			t.Errorf("the writer's args %v set --%s: its admission policy allows only %s and %s", c.Args, name, nodeaddrs.DefaultName, nodeaddrs.DefaultLeaseName)
		}
	}
	var policy *unstructured.Unstructured
	for _, o := range objectsOf(objs, "ValidatingAdmissionPolicy") {
		if o.GetName() == "shardproxy-node-addresses" {
			policy = o
		}
	}
	if policy == nil {
		t.Error("no admission policy shardproxy-node-addresses for the writer")
	} else {
		text := fmt.Sprint(policy.Object["spec"])
		for _, want := range []string{"'system:serviceaccount:" + dep.Namespace + ":" + pod.ServiceAccountName + "'",
			"'" + dep.Namespace + "'", "'" + nodeaddrs.DefaultName + "'", "'" + nodeaddrs.DefaultLeaseName + "'"} {
			if !strings.Contains(text, want) {
				t.Errorf("the writer's admission policy does not name %s: %s", want, text)
			}
		}
	}
	if dep.Namespace != cfg.StatusNamespace {
		t.Errorf("the Deployment is in %s, the list and the Lease in %s", dep.Namespace, cfg.StatusNamespace)
	}
	if pod.ServiceAccountName == ds.Spec.Template.Spec.ServiceAccountName || pod.ServiceAccountName == "" {
		t.Errorf("the writer runs as ServiceAccount %q, the supervisors as %q: it needs its own (the node-status policy binds the supervisors')",
			pod.ServiceAccountName, ds.Spec.Template.Spec.ServiceAccountName)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2 (a standby takes the Lease)", dep.Spec.Replicas)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the writer's security context %+v: want non-root, no escalation, every capability dropped", sc)
	}
	if pod.HostNetwork {
		t.Error("the writer needs no host network")
	}
	// The kubelet probes /healthz on the port the writer serves by default (its args set
	// no --bind-address).
	if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--bind-address") }) {
		t.Errorf("the writer's args %v set --bind-address: the port and probes follow its default", c.Args)
	}
	if len(c.Ports) != 1 || fmt.Sprintf("0.0.0.0:%d", c.Ports[0].ContainerPort) != app.DefaultNodeAddressesBindAddress {
		t.Errorf("the writer's ports %+v, want one, the port of %s", c.Ports, app.DefaultNodeAddressesBindAddress)
	}
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || len(c.Ports) != 1 ||
			(p.HTTPGet.Port.String() != c.Ports[0].Name && int32(p.HTTPGet.Port.IntValue()) != c.Ports[0].ContainerPort) {
			t.Errorf("the writer's %s probe %+v, want /healthz on its port", name, p)
		}
	}
}

// TestNodeAddressWriterRights creates node-addresses/example's RBAC, namespace and
// admission policies on a real kube-apiserver, dry-runs its workloads, then runs the real
// writer with a token of its ServiceAccount: under its policy it creates and updates the
// list and takes and renews the Lease. A supervisor's token (bound to a pod on a node)
// may not write the list. The writer may write no other ConfigMap or Lease: creating one
// is refused by its policy (RBAC cannot narrow create by name), updating or deleting one
// by its Role and, with its RBAC widened to every ConfigMap and Lease, by its policy.
func TestNodeAddressWriterRights(t *testing.T) {
	cp, create := startControlPlane(t)
	ctx := t.Context()
	admin := cp.Client()
	objs := render(t, nodeAddressesExample)
	createKinds(t, create, objs, metav1.CreateOptions{}, "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
		"Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap")
	// Nothing would run the workloads.
	createKinds(t, create, objs, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}, "DaemonSet", "Deployment")
	const ns = config.DefaultStatusNamespace
	for _, n := range []string{"node-1", "node-2"} {
		node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0." + n[len(n)-1:]}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dep := only[appsv1.Deployment](t, objs, "Deployment")
	writer := saClient(t, cp, dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName, nil)
	configMap := func(namespace, name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: map[string]string{"forged": "yes"}}
	}
	dryRun := []string{metav1.DryRunAll}
	// The writer's policy refuses in these words (the writer logs them).
	const refusal = "the node address writer (ServiceAccount " + ns + "/shardproxy-node-addresses) may write only"

	// Start the writer once its policy is in force, so that its first writes (the
	// Lease's and the list's creation) pass the policy.
	waitForPolicy(t, "the writer's policy to refuse it creating node-1's status", func() error {
		_, err := writer.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, migrate.ConfigMapName("node-1")), metav1.CreateOptions{DryRun: dryRun})
		return err
	}, refusal)
	stopWriter0 := startElected(t, writer, "writer-0", 0)
	var list *corev1.ConfigMap
	testutil.Eventually(t, time.Minute, "the writer to publish both Nodes", func() bool {
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
		list = cm
		return err == nil && strings.Contains(cm.Data[nodeaddrs.DataKey], "node-2 10.0.0.2\n")
	})
	lease, err := admin.CoordinationV1().Leases(ns).Get(ctx, nodeaddrs.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "writer-0" || lease.Spec.RenewTime == nil {
		t.Fatalf("the Lease: %v %v, want held by writer-0", lease, err)
	}
	// It updates both under its policy: the list when an address changes, the Lease
	// when it renews it (every RetryPeriod, 2 s).
	node2, err := admin.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node2.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.22"}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the writer to update the list with node-2's new address", func() bool {
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
		list = cm
		return err == nil && strings.Contains(cm.Data[nodeaddrs.DataKey], "node-2 10.0.0.22\n")
	})
	testutil.Eventually(t, time.Minute, "the writer to renew its Lease", func() bool {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, nodeaddrs.DefaultLeaseName, metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(lease.Spec.RenewTime.Time)
	})

	// A supervisor's token, bound to its pod on node-1, may not rewrite the list.
	supervisor := saClient(t, cp, "kube-system", "shardproxy", supervisorPodOn(t, admin, "node-1"))
	forged := list.DeepCopy()
	forged.Data[nodeaddrs.DataKey] = nodeaddrs.Encode(nil)
	waitForPolicy(t, "the node-status policy to refuse node-1's supervisor writing the list", func() error {
		_, err := supervisor.CoreV1().ConfigMaps(ns).Update(ctx, forged, metav1.UpdateOptions{DryRun: dryRun})
		return err
	}, "may write only ConfigMap shardproxy-node-node-1")
	if _, err := supervisor.CoreV1().ConfigMaps(ns).Update(ctx, forged, metav1.UpdateOptions{}); err == nil {
		t.Error("node-1's supervisor rewrote the published list")
	}
	// The supervisor may watch it (otherNodeAddresses: published).
	w, err := supervisor.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + nodeaddrs.DefaultName})
	if err != nil {
		t.Errorf("node-1's supervisor watching the list: %v", err)
	} else {
		w.Stop()
	}

	// What the writer may not write: node-2's status and another Lease exist (the
	// admin's), node-1's status does not yet (a node that has not published one).
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, migrate.ConfigMapName("node-2")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	otherLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptrTo("scheduler-0")}}
	if _, err := admin.CoordinationV1().Leases(ns).Create(ctx, otherLease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	updateConfigMap := func(name string) error {
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data = map[string]string{"forged": "yes"}
		_, err = writer.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{DryRun: dryRun})
		return err
	}
	updateLease := func(name string) error {
		l, err := admin.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Spec.HolderIdentity = ptrTo("forged")
		_, err = writer.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{DryRun: dryRun})
		return err
	}
	// Each write is a dry run: authorization and admission decide as for a real one, and
	// a write wrongly allowed leaves nothing behind to change the next check's answer.
	cases := []struct {
		name  string
		write func() error
		// byRole: the Role refuses it (RBAC names the objects of get and update; the
		// writer has no delete); else only the policy does.
		byRole bool
		// allowed: the writer's own objects, which it may write under either RBAC.
		allowed bool
	}{
		{name: "create node-1's status", write: func() error {
			_, err := writer.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, migrate.ConfigMapName("node-1")), metav1.CreateOptions{DryRun: dryRun})
			return err
		}},
		{name: "create another ConfigMap", write: func() error {
			_, err := writer.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, "kube-proxy"), metav1.CreateOptions{DryRun: dryRun})
			return err
		}},
		{name: "create another Lease", write: func() error {
			_, err := writer.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager", Namespace: ns}},
				metav1.CreateOptions{DryRun: dryRun})
			return err
		}},
		{name: "create a Lease named as a ConfigMap it may write", write: func() error {
			_, err := writer.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: nodeaddrs.DefaultName, Namespace: ns}},
				metav1.CreateOptions{DryRun: dryRun})
			return err
		}},
		{name: "create its list in kube-system", byRole: true, write: func() error {
			_, err := writer.CoreV1().ConfigMaps("kube-system").Create(ctx, configMap("kube-system", nodeaddrs.DefaultName), metav1.CreateOptions{DryRun: dryRun})
			return err
		}},
		{name: "update node-2's status", byRole: true, write: func() error { return updateConfigMap(migrate.ConfigMapName("node-2")) }},
		{name: "update another Lease", byRole: true, write: func() error { return updateLease(otherLease.Name) }},
		{name: "delete node-2's status", byRole: true, write: func() error {
			return writer.CoreV1().ConfigMaps(ns).Delete(ctx, migrate.ConfigMapName("node-2"), metav1.DeleteOptions{DryRun: dryRun})
		}},
		{name: "delete another Lease", byRole: true, write: func() error {
			return writer.CoordinationV1().Leases(ns).Delete(ctx, otherLease.Name, metav1.DeleteOptions{DryRun: dryRun})
		}},
		{name: "update its list", allowed: true, write: func() error { return updateConfigMap(nodeaddrs.DefaultName) }},
		{name: "update its Lease", allowed: true, write: func() error {
			// The writer renews it meanwhile: retry on a conflict.
			return retry.RetryOnConflict(retry.DefaultRetry, func() error { return updateLease(nodeaddrs.DefaultLeaseName) })
		}},
	}
	check := func(t *testing.T, widened bool) {
		for _, tc := range cases {
			err := tc.write()
			switch {
			case tc.allowed && err != nil:
				t.Errorf("%s: %v", tc.name, err)
			case tc.allowed:
			case err == nil:
				t.Errorf("%s: allowed", tc.name)
			case !apierrors.IsForbidden(err):
				t.Errorf("%s: %v, want Forbidden", tc.name, err)
			case (widened || !tc.byRole) && !strings.Contains(err.Error(), refusal):
				t.Errorf("%s: %v, want the writer's policy's refusal", tc.name, err)
			default:
				t.Logf("%s: refused: %v", tc.name, err)
			}
		}
	}
	t.Run("with its Role", func(t *testing.T) { check(t, false) })

	// An operator who widens the writer's RBAC (or an older Role) leaves its writes to the
	// policy alone: it refuses the same writes.
	widened := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "widened-node-addresses"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "delete"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "delete"}},
		}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, widened, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: widened.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: widened.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: dep.Namespace, Name: dep.Spec.Template.Spec.ServiceAccountName}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The authorizer sees the binding once its informer has it.
	testutil.Eventually(t, 30*time.Second, "the widened RBAC to reach the authorizer", func() bool {
		for _, a := range []authorizationv1.ResourceAttributes{
			{Verb: "create", Resource: "configmaps", Namespace: "kube-system"},
			{Verb: "delete", Group: "coordination.k8s.io", Resource: "leases", Namespace: ns},
		} {
			r, err := writer.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}, metav1.CreateOptions{})
			if err != nil || !r.Status.Allowed {
				return false
			}
		}
		return true
	})
	t.Run("with RBAC widened to every ConfigMap and Lease", func(t *testing.T) { check(t, true) })

	// Not only a dry run: a real create of node-1's status stores nothing.
	if _, err := writer.CoreV1().ConfigMaps(ns).Create(ctx, configMap(ns, migrate.ConfigMapName("node-1")), metav1.CreateOptions{}); err == nil {
		t.Error("the writer created node-1's status")
	}
	if _, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, migrate.ConfigMapName("node-1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node-1's status after the writer's refused create: %v, want NotFound", err)
	}

	// The writer watches its list with its rights (list and watch, narrowed by name):
	// deleted, the list is back; edited by hand, it is written back.
	cms := admin.CoreV1().ConfigMaps(ns)
	want := list.Data[nodeaddrs.DataKey]
	current := func() bool {
		cm, err := cms.Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
		return err == nil && cm.Data[nodeaddrs.DataKey] == want
	}
	if err := cms.Delete(ctx, nodeaddrs.DefaultName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	testutil.Eventually(t, 30*time.Second, "the writer to publish the deleted list again", current)
	t.Logf("the deleted list was back after %v", time.Since(deleted).Round(time.Millisecond))
	edited, err := cms.Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edited.Data[nodeaddrs.DataKey] = nodeaddrs.Encode(nil)
	if _, err := cms.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	editedAt := time.Now()
	testutil.Eventually(t, 30*time.Second, "the writer to write the edited list back", current)
	t.Logf("the edited list was written back after %v", time.Since(editedAt).Round(time.Millisecond))

	// A writer whose token may not list the Nodes (bound to the writer's Role, not to its
	// ClusterRole) takes the Lease: it fails its first sync within its bound, releases the
	// Lease and returns an error, and the rightful writer takes over at once (its Lease
	// lasts 2 minutes: only a release lets another lead within the test's 30 s) and
	// publishes the Node added meanwhile.
	stopWriter0()
	const noNodes = "writer-without-nodes"
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: noNodes}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: noNodes},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: dep.Spec.Template.Spec.ServiceAccountName},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: noNodes, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const syncTimeout = 3 * time.Second
	bad := &nodeaddrs.Writer{Client: saClient(t, cp, ns, noNodes, nil), Namespace: ns, SyncTimeout: syncTimeout,
		Logger: klog.Background().WithValues("writer", noNodes)}
	badDone := make(chan error, 1)
	badStarted := time.Now()
	go func() {
		badDone <- nodeaddrs.RunElected(ctx, bad, nodeaddrs.Election{Identity: noNodes, LeaseDuration: 2 * time.Minute,
			RenewDeadline: time.Minute, RetryPeriod: 200 * time.Millisecond})
	}()
	leases := admin.CoordinationV1().Leases(ns)
	holder := func() string {
		l, err := leases.Get(ctx, nodeaddrs.DefaultLeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	testutil.Eventually(t, 30*time.Second, noNodes+" to hold the Lease", func() bool { return holder() == noNodes })
	startElected(t, writer, "writer-1", 2*time.Minute)
	node3, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node3.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.3"}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node3, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-badDone:
		took := time.Since(badStarted)
		if err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "not done within 3s") {
			t.Errorf("the writer without node rights returned %v, want its first sync's bound exceeded, the Nodes forbidden", err)
		}
		t.Logf("the writer without node rights returned after %v: %v", took.Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatalf("the writer without node rights still runs 30 s after it started (bound %v)", syncTimeout)
	}
	if h := holder(); h == noNodes {
		t.Errorf("the Lease is still held by %s after it returned", noNodes)
	}
	released := time.Now()
	testutil.Eventually(t, 30*time.Second, "writer-1 to hold the Lease", func() bool { return holder() == "writer-1" })
	testutil.Eventually(t, 30*time.Second, "writer-1 to publish node-3", func() bool {
		cm, err := cms.Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
		return err == nil && strings.Contains(cm.Data[nodeaddrs.DataKey], "node-3 10.0.0.3\n")
	})
	t.Logf("writer-1 led and published %v after the release", time.Since(released).Round(time.Millisecond))
}

// startElected runs a writer as identity with client under leader election (leaseDuration
// 0: the usual 15 s) until the test ends or the returned func is called, and reports
// its error.
func startElected(t *testing.T, client kubernetes.Interface, identity string, leaseDuration time.Duration) func() {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	e := nodeaddrs.Election{Identity: identity}
	if leaseDuration > 0 {
		e = nodeaddrs.Election{Identity: identity, LeaseDuration: leaseDuration, RenewDeadline: leaseDuration / 2,
			RetryPeriod: 200 * time.Millisecond}
	}
	go func() {
		done <- nodeaddrs.RunElected(ctx, &nodeaddrs.Writer{Client: client, Namespace: config.DefaultStatusNamespace,
			Debounce: 100 * time.Millisecond, Logger: klog.Background().WithValues("writer", identity)}, e)
	}()
	var once sync.Once
	stopAndWait := func() {
		once.Do(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("writer %s: %v", identity, err)
			}
		})
	}
	t.Cleanup(stopAndWait)
	return stopAndWait
}
