package supervisor

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// sinkLog is a selector.Sink per instance that logs what it is given.
type sinkLog struct {
	mu    sync.Mutex
	lines []string
}

type loggingSink struct {
	inst string
	log  *sinkLog
}

func (s loggingSink) add(line string) {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	s.log.lines = append(s.log.lines, s.inst+": "+line)
}

func (s loggingSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	s.add("service " + svc.Namespace + "/" + svc.Name)
	ch := make(chan struct{})
	close(ch)
	return ch
}
func (s loggingSink) DeleteService(n types.NamespacedName) { s.add("delete service " + n.String()) }
func (s loggingSink) UpdateEndpointSlice(sl *discoveryv1.EndpointSlice) {
	s.add("slice " + sl.Namespace + "/" + sl.Name)
}
func (s loggingSink) DeleteEndpointSlice(sl *discoveryv1.EndpointSlice) {
	s.add("delete slice " + sl.Namespace + "/" + sl.Name)
}

func (l *sinkLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// TestRescope: on a node without a default instance, a live change of the proxy names
// rescopes the watches: the Services and slices of an added name arrive, those of a
// removed name are deleted, and the Services of a name in both scopes are not given
// again. The watches log through the logger they are given (the supervisor's), not
// klog's global one.
func TestRescope(t *testing.T) {
	labelled := func(ns, name, proxyName string) (*corev1.Service, *discoveryv1.EndpointSlice) {
		l := map[string]string{selector.LabelServiceProxyName: proxyName}
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l, ResourceVersion: "5"}}
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1", ResourceVersion: "6",
			Labels: map[string]string{selector.LabelServiceProxyName: proxyName, discoveryv1.LabelServiceName: name}}}
		return svc, sl
	}
	a, aSlice := labelled("a", "web", "team-a")
	c, cSlice := labelled("c", "web", "team-c")
	client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, a, aSlice, c, cSlice)
	teamA := config.Instance{Name: "team-a", ProxyNames: []string{"team-a"}}
	teamC := config.Instance{Name: "team-c", ProxyNames: []string{"team-c"}}
	logs := &logCapture{}
	w, err := NewWatches(client, "node-1", watchScope([]config.Instance{teamA}, true), WatchOptions{ServiceCIDRs: true, Logger: logs.logger().WithValues("node", "node-1")})
	if err != nil {
		t.Fatal(err)
	}
	router, err := selector.NewRouter([]selector.Spec{{Name: "team-a", ProxyNames: []string{"team-a"}}, {Name: "team-c", ProxyNames: []string{"team-c"}}})
	if err != nil {
		t.Fatal(err)
	}
	log := &sinkLog{}
	d := selector.NewDispatcher(router, map[string]selector.Sink{"team-a": loggingSink{"team-a", log}, "team-c": loggingSink{"team-c", log}},
		w.SlicesOf, selector.Events{})
	if err := w.Connect(d, func(*corev1.Node, bool) {}, func() {}, func() {}, func() {}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); w.Wait() }()
	if err := w.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !sameSet(got, []string{"team-a: slice a/web-1", "team-a: service a/web"}) {
		t.Fatalf("before: %q", got)
	}

	both := watchScope([]config.Instance{teamA, teamC}, true)
	if err := w.Rescope(ctx, both, time.Minute); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Scope(), both) {
		t.Errorf("scope %q, want %q", w.Scope(), both)
	}
	testutil.Eventually(t, 5*time.Second, "team-c to get its Service", func() bool {
		return len(d.Owner(types.NamespacedName{Namespace: "c", Name: "web"})) > 0
	})
	if got := log.take(); !sameSet(got, []string{"team-c: slice c/web-1", "team-c: service c/web"}) {
		t.Errorf("after adding team-c's name (team-a's Service not given again): %q", got)
	}
	if n := len(w.HeldServices()); n != 2 {
		t.Errorf("%d Services held, want 2", n)
	}

	if err := w.Rescope(ctx, watchScope([]config.Instance{teamC}, true), time.Minute); err != nil {
		t.Fatal(err)
	}
	got := log.take()
	if !slices.Contains(got, "team-a: delete service a/web") || slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "team-c") }) {
		t.Errorf("after dropping team-a's name: %q", got)
	}
	if held := w.HeldServices(); len(held) != 1 || held[0].Namespace != "c" {
		t.Errorf("held after dropping team-a's name: %v", held)
	}
	if err := w.Rescope(ctx, []string{""}, time.Minute); err == nil {
		t.Error("rescoping to every Service did not fail")
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, want := range []string{`"msg"="Watches connected"`, `"msg"="Watches rescoped"`} {
		if !slices.ContainsFunc(logs.lines, func(l string) bool { return strings.Contains(l, want) && strings.Contains(l, `"node"="node-1"`) }) {
			t.Errorf("no %s line with the given logger's values in %q", want, logs.lines)
		}
	}
	if w.serviceMerger.logger != w.logger || w.sliceMerger.logger != w.logger {
		t.Error("the mergers do not log through the watches' logger")
	}
}

// sameSet compares two lists as sets: the dispatcher may give a slice twice (with its
// Service's snapshot and as its own event).
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
