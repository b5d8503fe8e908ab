package deploy

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/test/controlplane"
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
}

// TestNodeAddressWriterRights creates node-addresses/example's RBAC, namespace and
// admission policy on a real kube-apiserver, dry-runs its workloads, then runs the real
// writer with a token of its ServiceAccount: it publishes the Nodes' addresses and takes
// the Lease. A supervisor's token (bound to a pod on a node) may not write the list, and
// the writer may not update another ConfigMap of the namespace (a node status).
func TestNodeAddressWriterRights(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "the control-plane tests run as root (CI is root)")
	}
	if _, err := exec.LookPath("etcd"); err != nil && !testing.Short() {
		t.Fatalf("%v", controlplane.ErrEtcdNotFound)
	}
	cp := controlplane.Start(t)
	ctx := t.Context()
	admin := cp.Client()
	create := newCreateFunc(t, cp)
	objs := render(t, nodeAddressesExample)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap", "DaemonSet", "Deployment"} {
		for _, obj := range objectsOf(objs, kind) {
			opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
			if kind == "DaemonSet" || kind == "Deployment" {
				opts = dryRun // nothing would run them
			}
			if err := create(ctx, obj, opts); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s %s/%s: %v", kind, obj.GetNamespace(), obj.GetName(), err)
			}
		}
	}
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

	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- nodeaddrs.RunElected(wctx, &nodeaddrs.Writer{Client: writer, Namespace: ns, Debounce: 100 * time.Millisecond,
			Logger: klog.Background()}, nodeaddrs.Election{Identity: "writer-0"})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("the writer: %v", err)
		}
	})
	var list *corev1.ConfigMap
	testutil.Eventually(t, time.Minute, "the writer to publish both Nodes", func() bool {
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
		list = cm
		return err == nil && strings.Contains(cm.Data[nodeaddrs.DataKey], "node-2 10.0.0.2\n")
	})
	lease, err := admin.CoordinationV1().Leases(ns).Get(ctx, nodeaddrs.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "writer-0" {
		t.Errorf("the Lease: %v %v, want held by writer-0", lease, err)
	}

	// A supervisor's token, bound to its pod on node-1, may not rewrite the list.
	supervisor := saClient(t, cp, "kube-system", "shardproxy", supervisorPodOn(t, admin, "node-1"))
	forged := list.DeepCopy()
	forged.Data[nodeaddrs.DataKey] = nodeaddrs.Encode(nil)
	// The policy is enforced once the API server has loaded it: wait for its refusal.
	testutil.Eventually(t, 30*time.Second, "the node-status policy to refuse node-1's supervisor writing the list", func() bool {
		_, err := supervisor.CoreV1().ConfigMaps(ns).Update(ctx, forged, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "may write only ConfigMap shardproxy-node-node-1")
	})
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
	// The writer may not update a node's status.
	status, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "shardproxy-node-node-2", Namespace: ns}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status.Data = map[string]string{"forged": "yes"}
	if _, err := writer.CoreV1().ConfigMaps(ns).Update(ctx, status, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the writer updating node-2's status: %v, want Forbidden", err)
	}
}
