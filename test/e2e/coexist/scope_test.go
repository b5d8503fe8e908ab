package coexist

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// testScopedWatch: the supervisor here runs no default instance, so it watches only the
// Services (and their EndpointSlices) labelled for team-a or team-b or shadowed for them
// (supervisor/scope.go). A Service handed between the two instances stays in the watch
// and no connection fails; relabelled to a proxy this node does not run, it leaves the
// watch and every table of the node; labelled back, it returns with its endpoints.
func testScopedWatch(t *testing.T) {
	e, _ := environment(t)
	servers(t, e)
	if log := e.SupervisorLog(); !strings.Contains(log, `"Watches connected"`) ||
		!strings.Contains(log, "service.kubernetes.io/service-proxy-name in (team-a,team-b)") {
		t.Errorf("the supervisor does not log a watch scoped to its proxy names:\n%s", tail(log, 30))
	}
	ip := service(t, e, "scoped", "team-a")
	// Early: the audit gives a Service a grace of a minute or two without slices.
	waitForeignSlices := foreignSlices(t, e)
	name := "scoped"
	if mode == modeNFTables {
		name += "-nft"
	}
	reach(t, e, e.TP.Pod2, ip)

	l := startLoad(e, "a Service handed team-a -> team-b -> team-a -> team-b -> team-a in the scoped watch", e.TP.Pod2, ip)
	for _, to := range []string{"team-b", "team-a", "team-b", "team-a"} {
		// Connections before and after each move, not only across it.
		before := l.ok.Load()
		testutil.Eventually(t, waitTimeout, "20 connections", func() bool { return l.ok.Load() >= before+20 })
		relabel(t, e, name, to)
		testutil.Eventually(t, waitTimeout, to+" to own "+ip, func() bool { return tableHolds(e, "shardproxy-"+to, ip) })
	}
	before := l.ok.Load()
	testutil.Eventually(t, waitTimeout, "20 connections", func() bool { return l.ok.Load() >= before+20 })
	if _, failed := l.finish(t); failed != 0 {
		t.Errorf("%d connections failed while the Service moved between instances", failed)
	}

	relabel(t, e, name, "not-on-this-node")
	testutil.Eventually(t, waitTimeout, ip+" to leave every table of the node", func() bool {
		out, err := e.TP.ListRuleset(e.TP.Node)
		return err == nil && !strings.Contains(out, ip+" ")
	})
	relabel(t, e, name, "team-a")
	reach(t, e, e.TP.Pod2, ip) // both endpoints: the slices came back into the watch too
	if !tableHolds(e, "shardproxy-team-a", ip) {
		t.Errorf("%s is back, but not in team-a's table", ip)
	}
	// Leaving the watches, the Service and its slices were each read once (RBAC: get).
	if log := e.SupervisorLog(); strings.Contains(log, "Reading an object that left a watch") {
		t.Errorf("the supervisor could not read an object that left its watches:\n%s", tail(log, 30))
	}
	waitForeignSlices()
}

// foreignSlices: a selector-less Service labelled team-a whose EndpointSlice another
// controller wrote without the Service's labels is outside this node's scoped slice
// watch; the supervisor says so with a Warning event on the Service naming the label
// (supervisor/sliceaudit.go), after its grace (a minute, and up to a minute's spread).
// It creates both and returns the wait for the event.
func foreignSlices(t *testing.T, e *env.Env) (wait func()) {
	ctx := context.Background()
	name := passName("foreign")
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "coexist", Name: name,
		Labels: map[string]string{selector.LabelServiceProxyName: "team-a"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}}}
	if _, err := e.Client.CoreV1().Services("coexist").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.DeleteService(context.Background(), "coexist", name) })
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "coexist", Name: name + "-foreign", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "foreign-controller.example.com"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{netns.Pod1IPv4}}},
	}
	if _, err := e.Client.DiscoveryV1().EndpointSlices("coexist").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.Client.DiscoveryV1().EndpointSlices("coexist").Delete(context.Background(), sl.Name, metav1.DeleteOptions{})
	})
	return func() { waitNotWatched(t, e, name) }
}

// waitNotWatched waits for the EndpointSlicesNotWatched event on Service name.
func waitNotWatched(t *testing.T, e *env.Env, name string) {
	t.Helper()
	ctx := context.Background()
	var msg string
	testutil.Eventually(t, 3*time.Minute, "a Warning event EndpointSlicesNotWatched on "+name, func() bool {
		list, err := e.Client.CoreV1().Events("coexist").List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + name + ",reason=EndpointSlicesNotWatched"})
		if err != nil || len(list.Items) == 0 {
			return false
		}
		msg = list.Items[0].Message
		return list.Items[0].Type == corev1.EventTypeWarning
	})
	if !strings.Contains(msg, selector.LabelServiceProxyName+"=team-a") || !strings.Contains(msg, "1 EndpointSlice") {
		t.Errorf("the event does not name the slice and the label it lacks: %q", msg)
	}
	t.Logf("event on %s: %s", name, msg)
}

func ptr[T any](v T) *T { return &v }

func relabel(t *testing.T, e *env.Env, name, proxyName string) {
	t.Helper()
	if err := e.Relabel(context.Background(), "coexist", name, proxyName); err != nil {
		t.Fatal(err)
	}
}

// tableHolds reports whether the node's ip table holds addr.
func tableHolds(e *env.Env, table, addr string) bool {
	out, err := e.TP.Exec(e.TP.Node, "nft", "list", "table", "ip", table)
	return err == nil && strings.Contains(out, addr+" ")
}
