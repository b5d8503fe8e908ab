package deploy

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestServerDryRun sends every object of the base and of each overlay to a real
// kube-apiserver v1.36.3 as `kubectl apply --dry-run=server` would: admission, defaulting
// and validation run, nothing is stored. Unknown fields are errors (strict field
// validation), so a misspelled field fails here rather than being dropped on a cluster.
// Then it creates the base's RBAC for real and asks the authorizer what the
// ServiceAccount may do.
func TestServerDryRun(t *testing.T) {
	cp, create := startControlPlane(t)
	ctx := t.Context()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}

	// A dry run cannot create a namespace that later objects of the same dry run live in
	// (kubectl apply --dry-run=server has the same limit): create the rendered Namespaces
	// for real first, after dry-running them.
	for _, k := range kustomizations {
		for _, obj := range objectsOf(render(t, k.dir), "Namespace") {
			if err := create(ctx, obj, dryRun); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Errorf("Namespace %s: %v", obj.GetName(), err)
			}
			if err := create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("creating Namespace %s: %v", obj.GetName(), err)
			}
		}
	}
	dirs := []string{"cleanup"} // the uninstall's DaemonSet, in kube-system
	for _, k := range kustomizations {
		dirs = append(dirs, k.dir)
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			for _, obj := range render(t, dir) {
				if obj.GetKind() == "Namespace" {
					continue
				}
				if err := create(ctx, obj, dryRun); err != nil {
					t.Errorf("%s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
				}
			}
		})
	}

	// The check must be able to fail: the same DaemonSet with a misspelled field and with
	// a value of the wrong type is refused.
	t.Run("an invalid DaemonSet is refused", func(t *testing.T) {
		ds := objectsOf(render(t, "base"), "DaemonSet")[0]
		for name, mutate := range map[string]func(*unstructured.Unstructured){
			"unknown field": func(o *unstructured.Unstructured) {
				_ = unstructured.SetNestedField(o.Object, true, "spec", "template", "spec", "hostNetwrok")
			},
			"wrong type": func(o *unstructured.Unstructured) {
				_ = unstructured.SetNestedField(o.Object, "yes", "spec", "template", "spec", "hostNetwork")
			},
			"selector does not match the template": func(o *unstructured.Unstructured) {
				_ = unstructured.SetNestedField(o.Object, "other", "spec", "selector", "matchLabels", "app.kubernetes.io/name")
			},
		} {
			bad := ds.DeepCopy()
			mutate(bad)
			err := create(ctx, bad, dryRun)
			if err == nil {
				t.Errorf("%s: the apiserver accepted it", name)
				continue
			}
			t.Logf("%s: refused: %v", name, err)
		}
	})

	t.Run("RBAC grants what the supervisor uses, nothing more", func(t *testing.T) {
		client := cp.Client()
		var sa string
		for _, obj := range render(t, "base") {
			switch obj.GetKind() {
			case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Namespace", "Role", "RoleBinding":
				err := create(ctx, obj, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
				if obj.GetKind() == "Namespace" && apierrors.IsAlreadyExists(err) {
					err = nil // created above for the dry runs
				}
				if err != nil {
					t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
				}
				if obj.GetKind() == "ServiceAccount" {
					sa = "system:serviceaccount:" + obj.GetNamespace() + ":" + obj.GetName()
				}
			}
		}
		for _, tc := range []struct {
			verb, group, resource, namespace string
			allowed                          bool
		}{
			// supervisor/watch.go: one informer per resource and label selector, and
			// scope.go's read of an object leaving a scoped node's watches.
			{"get", "", "services", "team-a", true},
			{"get", "discovery.k8s.io", "endpointslices", "team-a", true},
			{"list", "", "services", "", true},
			{"watch", "", "services", "", true},
			{"list", "discovery.k8s.io", "endpointslices", "", true},
			{"watch", "discovery.k8s.io", "endpointslices", "", true},
			{"list", "networking.k8s.io", "servicecidrs", "", true},
			{"watch", "networking.k8s.io", "servicecidrs", "", true},
			{"list", "", "nodes", "", true},
			{"watch", "", "nodes", "", true},
			// supervisor.waitForNode.
			{"get", "", "nodes", "", true},
			// supervisor/events.go: client-go's recorder creates, then patches repeats.
			{"create", "", "events", "team-a", true},
			{"patch", "", "events", "team-a", true},
			// migrate.Publisher: the node status, in its own namespace only.
			{"get", "", "configmaps", "shardproxy-system", true},
			{"create", "", "configmaps", "shardproxy-system", true},
			{"update", "", "configmaps", "shardproxy-system", true},
			// supervisor.seedHoldings: one page of the node statuses.
			{"list", "", "configmaps", "shardproxy-system", true},
			// supervisor/published.go: the published node address list (otherNodeAddresses: published).
			{"watch", "", "configmaps", "shardproxy-system", true},
			{"watch", "", "configmaps", "kube-system", false},
			{"update", "", "configmaps", "kube-system", false},
			{"create", "", "configmaps", "kube-system", false},
			{"delete", "", "configmaps", "shardproxy-system", false},

			{"update", "", "services", "team-a", false},
			{"update", "", "nodes", "", false},
			{"patch", "", "nodes", "", false},
			{"create", "discovery.k8s.io", "endpointslices", "team-a", false},
			{"update", "", "events", "team-a", false},
			{"create", "events.k8s.io", "events", "team-a", false},
			{"get", "", "secrets", "kube-system", false},
			{"list", "", "secrets", "", false},
			{"list", "", "configmaps", "", false},
			{"list", "", "pods", "", false},
			{"get", "coordination.k8s.io", "leases", "kube-system", false},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: tc.verb, Group: tc.group, Resource: tc.resource, Namespace: tc.namespace,
				},
			}}
			got, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("SubjectAccessReview: %v", err)
			}
			if got.Status.Allowed != tc.allowed {
				t.Errorf("%s may %s %s.%s in %q: %v, want %v (%s)", sa, tc.verb, tc.resource, tc.group, tc.namespace,
					got.Status.Allowed, tc.allowed, got.Status.Reason)
			}
		}
	})

	// After the RBAC subtest: it creates the ServiceAccount, the namespace and the Role.
	t.Run("a node writes only its own status", func(t *testing.T) {
		testNodeStatusPolicy(t, cp, create)
	})
}

// startControlPlane starts a real kube-apiserver (controlplane.Start: with etcd, its
// admission policies enforced, stopped when the test ends) and returns it with a
// createFunc against it. The control-plane tests run as root (CI is root): not root,
// the test is unavailable; as root, a missing etcd fails it (controlplane.Start would
// skip, and a root machine without etcd is a broken one).
func startControlPlane(t *testing.T) (*controlplane.ControlPlane, createFunc) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "the control-plane tests run as root (CI is root)")
	}
	if _, err := exec.LookPath("etcd"); err != nil && !testing.Short() {
		t.Fatalf("%v", controlplane.ErrEtcdNotFound)
	}
	cp := controlplane.Start(t)
	return cp, newCreateFunc(t, cp)
}

// createKinds creates the objects of objs of each of kinds, kind by kind in that order,
// with opts and strict field validation; an object that already exists is left as it is.
func createKinds(t *testing.T, create createFunc, objs []*unstructured.Unstructured, opts metav1.CreateOptions, kinds ...string) {
	t.Helper()
	opts.FieldValidation = metav1.FieldValidationStrict
	for _, kind := range kinds {
		for _, obj := range objectsOf(objs, kind) {
			if err := create(t.Context(), obj, opts); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("creating %s %s/%s: %v", kind, obj.GetNamespace(), obj.GetName(), err)
			}
		}
	}
}

// waitForPolicy waits until probe, an admission-checked write (a dry run), is refused
// with an error containing want: a ValidatingAdmissionPolicy is enforced only once the
// API server has loaded it (an informer), so nothing may count as allowed before. It
// reports a policy that never refuses and returns, so that each check after it fails on
// its own.
func waitForPolicy(t *testing.T, what string, probe func() error, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		if err = probe(); err != nil && strings.Contains(err.Error(), want) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("waited 30s for %s: the last answer was %v, want an error with %q", what, err, want)
}

// createFunc creates an object of any kind, as `kubectl create` would.
type createFunc func(ctx context.Context, obj *unstructured.Unstructured, opts metav1.CreateOptions) error

// newCreateFunc returns a createFunc against cp (a dynamic client and a discovery
// mapper).
func newCreateFunc(t *testing.T, cp *controlplane.ControlPlane) createFunc {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cp.Client().Discovery()))
	return func(ctx context.Context, obj *unstructured.Unstructured, opts metav1.CreateOptions) error {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		_, err = ri.Create(ctx, obj, opts)
		return err
	}
}
