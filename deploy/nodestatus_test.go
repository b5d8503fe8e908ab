package deploy

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// nodeNameExtra is the user extra the API server derives from a token bound to a pod
// on a node, which base/node-status-policy.yaml matches against the ConfigMap's name.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// testNodeStatusPolicy checks base/node-status-policy.yaml on the real API server, whose
// base RBAC objects already exist: with a ServiceAccount token bound to a pod on node-1,
// as the kubelet projects it, the real migrate.Publisher writes node-1's status and
// nothing else; a token bound to no pod writes nothing; the admin is not restricted.
// It also checks what migrate's liveness relies on: the server stamps each write of the
// status in managedFields, on the clock its Date header shows.
func testNodeStatusPolicy(t *testing.T, cp *controlplane.ControlPlane, create createFunc) {
	ctx := t.Context()
	admin := cp.Client()
	createKinds(t, create, render(t, "base"), metav1.CreateOptions{}, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

	// A pod of the ServiceAccount on node-1, as the DaemonSet's would be (nothing runs it).
	for _, n := range []string{"node-1", "node-2"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	onNode1 := saClient(t, cp, "kube-system", "shardproxy", supervisorPodOn(t, admin, "node-1"))
	unbound := saClient(t, cp, "kube-system", "shardproxy", nil)

	// The API server derives the node from the pod-bound token: what the policy matches.
	review, err := onNode1.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ui := review.Status.UserInfo
	if ui.Username != "system:serviceaccount:kube-system:shardproxy" || len(ui.Extra[nodeNameExtra]) != 1 || ui.Extra[nodeNameExtra][0] != "node-1" {
		t.Fatalf("the pod-bound token authenticates as %s with extra %v: want the ServiceAccount with %s=[node-1]", ui.Username, ui.Extra, nodeNameExtra)
	}

	createIn := func(c kubernetes.Interface, name string, opts metav1.CreateOptions) (*corev1.ConfigMap, error) {
		return c.CoreV1().ConfigMaps("shardproxy-system").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shardproxy-system",
				Labels: map[string]string{migrate.LabelComponent: migrate.ComponentNodeStatus}},
			Data: map[string]string{migrate.StatusKey: `{"node":"node-1","instances":{}}`},
		}, opts)
	}
	cms := func(c kubernetes.Interface) func(string) (*corev1.ConfigMap, error) {
		return func(name string) (*corev1.ConfigMap, error) { return createIn(c, name, metav1.CreateOptions{}) }
	}
	waitForPolicy(t, "the policy to refuse node-1 writing node-2's status", func() error {
		_, err := createIn(onNode1, migrate.ConfigMapName("node-2"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}, "shardproxy ServiceAccount")

	// The admin writes node-2's status; node-1's supervisor may not touch it.
	node2, err := cms(admin)(migrate.ConfigMapName("node-2"))
	if err != nil {
		t.Fatalf("the admin creating node-2's status: %v", err)
	}
	refused := func(what string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: allowed", what)
		case !strings.Contains(err.Error(), "shardproxy ServiceAccount"):
			t.Errorf("%s: %v, want the policy's refusal", what, err)
		default:
			t.Logf("%s: refused: %v", what, err)
		}
	}
	node2.Data[migrate.StatusKey] = `{"node":"node-2","instances":{"forged":{}}}`
	_, err = onNode1.CoreV1().ConfigMaps("shardproxy-system").Update(ctx, node2, metav1.UpdateOptions{})
	refused("node-1 updating node-2's status", err)
	_, err = cms(onNode1)("kube-proxy-config")
	refused("node-1 creating another ConfigMap", err)
	_, err = cms(unbound)(migrate.ConfigMapName("node-1"))
	refused("a token bound to no pod creating node-1's status", err)

	// The real publisher, with node-1's token, writes node-1's status (create, then
	// update on the heartbeat).
	pubCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&migrate.Publisher{Client: onNode1, Namespace: "shardproxy-system", Node: "node-1", Interval: 20 * time.Millisecond,
			Source: func() migrate.NodeStatus { return migrate.NodeStatus{} }}).Run(pubCtx)
	}()
	testutil.Eventually(t, 30*time.Second, "node-1's supervisor to publish its status", func() bool {
		_, err := admin.CoreV1().ConfigMaps("shardproxy-system").Get(ctx, migrate.ConfigMapName("node-1"), metav1.GetOptions{})
		return err == nil
	})
	stop()
	<-done
	own, err := admin.CoreV1().ConfigMaps("shardproxy-system").Get(ctx, migrate.ConfigMapName("node-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st migrate.NodeStatus
	if err := json.Unmarshal([]byte(own.Data[migrate.StatusKey]), &st); err != nil || st.Node != "node-1" {
		t.Fatalf("node-1's published status %q: %v", own.Data[migrate.StatusKey], err)
	}
	own.Data[migrate.StatusKey] = `{"node":"node-1","instances":{}}`
	if _, err := onNode1.CoreV1().ConfigMaps("shardproxy-system").Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Errorf("node-1 updating its own status: %v", err)
	}

	// What migrate's liveness reads: the server's time of the last write, next to the
	// server's clock.
	own, err = admin.CoreV1().ConfigMaps("shardproxy-system").Get(ctx, migrate.ConfigMapName("node-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clock, err := migrate.NewAPIServerClock(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	now, err := clock.ServerNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stamped bool
	for _, mf := range own.ManagedFields {
		if mf.Time != nil && strings.Contains(string(mf.FieldsV1.Raw), `"f:`+migrate.StatusKey+`"`) {
			stamped = true
			if d := now.Sub(mf.Time.Time); d < -2*time.Second || d > 10*time.Second {
				t.Errorf("the status was stored at %v by managedFields, the server's Date says %v", mf.Time, now)
			}
		}
	}
	if !stamped {
		t.Errorf("no managedFields entry owns data[%s] with a time: %+v", migrate.StatusKey, own.ManagedFields)
	}
	statuses, err := migrate.ReadStatuses(ctx, admin, "shardproxy-system")
	if err != nil {
		t.Fatal(err)
	}
	if len(statuses) != 2 {
		t.Errorf("%d node statuses, want node-1's and node-2's", len(statuses))
	}
}

func ptrTo[T any](v T) *T { return &v }

// supervisorPodOn creates a pod of the shardproxy ServiceAccount on node, as the
// DaemonSet's would be (nothing runs it), and returns the reference that binds a token
// to it.
func supervisorPodOn(t *testing.T, admin kubernetes.Interface, node string) *authenticationv1.BoundObjectReference {
	t.Helper()
	pod, err := admin.CoreV1().Pods("kube-system").Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "shardproxy-" + node, Namespace: "kube-system"},
		Spec: corev1.PodSpec{ServiceAccountName: "shardproxy", NodeName: node,
			Containers: []corev1.Container{{Name: "shardproxy", Image: "shardproxy"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
}

// saClient is a client of cp with a token (TokenRequest, 10 minutes) of the
// ServiceAccount namespace/name, bound to bound (nil: to no object).
func saClient(t *testing.T, cp *controlplane.ControlPlane, namespace, name string, bound *authenticationv1.BoundObjectReference) kubernetes.Interface {
	t.Helper()
	tr, err := cp.Client().CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo[int64](600), BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(cp.RESTConfig())
	cfg.BearerToken = tr.Status.Token
	return kubernetes.NewForConfigOrDie(cfg)
}
