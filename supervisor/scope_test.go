package supervisor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestWatchSelectors: the label selectors each node sends, per resource, for given
// configurations (also the number of watches: one per selector).
func TestWatchSelectors(t *testing.T) {
	const (
		all     = ""
		noHead  = "!service.kubernetes.io/headless"
		named   = "service.kubernetes.io/service-proxy-name in (team-a,team-b,team-c)"
		shadow  = "shardproxy.io/shadow in (team-a,team-b,team-c)"
		node    = "metadata.name=node-1"
		noLabel = "<none>"
		// apiServer is the one more EndpointSlice watch every node makes: the API
		// server's endpoints, in namespace default, reserved from user addresses.
		apiServer = "kubernetes.io/service-name=kubernetes"
	)
	teams := []config.Instance{{Name: "a", ProxyNames: []string{"team-b", "team-a"}}, {Name: "c", ProxyNames: []string{"team-c"}}}
	for _, tc := range []struct {
		name         string
		instances    []config.Instance
		serviceCIDRs bool
		otherNodes   bool
		// published reads the other Nodes' addresses from the published list.
		published bool
		// want maps resources to label selectors, nodes to field selectors.
		want map[string][]string
	}{{
		name:         "a default instance watches every Service",
		instances:    append([]config.Instance{{Name: "d", Default: true}}, teams...),
		serviceCIDRs: true,
		want:         map[string][]string{"services": {all}, "endpointslices": {noHead, apiServer}, "servicecidrs": {all}, "nodes": {node}},
	}, {
		name:         "named instances only: their proxy names and their shadows",
		instances:    teams,
		serviceCIDRs: true,
		want: map[string][]string{"services": {named, shadow},
			"endpointslices": {noHead + "," + named, noHead + "," + shadow, apiServer}, "servicecidrs": {all}, "nodes": {node}},
	}, {
		name:      "without the ServiceCIDR API every Service (the address precedence needs their cluster IPs)",
		instances: teams,
		want:      map[string][]string{"services": {all}, "endpointslices": {noHead, apiServer}, "servicecidrs": nil, "nodes": {node}},
	}, {
		name:         "reserving other nodes' addresses: still one Node watch, of every Node",
		instances:    teams,
		serviceCIDRs: true,
		otherNodes:   true,
		want: map[string][]string{"services": {named, shadow},
			"endpointslices": {noHead + "," + named, noHead + "," + shadow, apiServer}, "servicecidrs": {all}, "nodes": {all}},
	}, {
		name:         "reserving other nodes' addresses from the published list: this Node, and the list alone",
		instances:    teams,
		serviceCIDRs: true,
		otherNodes:   true,
		published:    true,
		want: map[string][]string{"services": {named, shadow},
			"endpointslices": {noHead + "," + named, noHead + "," + shadow, apiServer}, "servicecidrs": {all}, "nodes": {node},
			"configmaps": {"metadata.name=shardproxy-nodeaddresses"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
			opts := WatchOptions{ServiceCIDRs: tc.serviceCIDRs, OtherNodes: tc.otherNodes}
			if tc.published {
				opts.PublishedNodeAddresses = &types.NamespacedName{Namespace: "shardproxy-system", Name: "shardproxy-nodeaddresses"}
			}
			w, err := NewWatches(client, "node-1", watchScope(tc.instances, tc.serviceCIDRs), opts)
			if err != nil {
				t.Fatal(err)
			}
			startWatches(t, w)
			got := map[string][]string{}
			for _, a := range client.Actions() {
				wa, ok := a.(k8stesting.WatchAction)
				if !ok || a.GetVerb() != "watch" {
					continue
				}
				res := a.GetResource().Resource
				f := wa.GetWatchRestrictions().Fields.String()
				if res == "nodes" || res == "configmaps" {
					got[res] = append(got[res], f)
					continue
				}
				if f != "" {
					t.Errorf("%s watch fields %q", res, f)
				}
				got[res] = append(got[res], wa.GetWatchRestrictions().Labels.String())
			}
			for _, sels := range got {
				sort.Strings(sels)
				for i, s := range sels {
					if s == noLabel {
						sels[i] = all
					}
				}
			}
			for res, want := range tc.want {
				sort.Strings(want)
				if len(want) == 0 {
					want = nil
				}
				if !slices.Equal(got[res], want) {
					t.Errorf("%s watches %q, want %q", res, got[res], want)
				}
			}
		})
	}
}

func startWatches(t *testing.T, w *Watches) {
	t.Helper()
	router, err := selector.NewRouter([]selector.Spec{{Name: "default", Default: true}})
	if err != nil {
		t.Fatal(err)
	}
	d := selector.NewDispatcher(router, map[string]selector.Sink{}, w.SlicesOf, selector.Events{})
	if err := w.Connect(d, func(*corev1.Node, bool) {}, func() {}, func() {}, func() {}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := w.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// mergerRecorder records what a merger delivers.
type mergerRecorder struct {
	mu     sync.Mutex
	events []string
}

func (r *mergerRecorder) add(kind string, obj any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	svc := obj.(*corev1.Service)
	r.events = append(r.events, fmt.Sprintf("%s %s@%s", kind, svc.Name, svc.ResourceVersion))
}

// TestMergerJoinsOverlappingWatches: two watches (owner label, shadow label) joined as
// one stream. A Service moving between them in one write arrives in either order; it is
// never deleted on the way, and an older version from the slower watch never overtakes
// a newer one.
func TestMergerJoinsOverlappingWatches(t *testing.T) {
	svc := func(rv string, lbls map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: rv, Labels: lbls}}
	}
	owned := map[string]string{selector.LabelServiceProxyName: "team-a"}
	shadowed := map[string]string{selector.LabelShadow: "team-a"}
	other := map[string]string{selector.LabelServiceProxyName: "elsewhere"}
	type step struct {
		watch  int
		delete bool
		obj    *corev1.Service
	}
	for _, tc := range []struct {
		name  string
		steps []step
		// current is what the apiserver holds when the merger reads (nil: gone).
		current *corev1.Service
		want    []string
	}{{
		name:    "shadow to owner, leaving the shadow watch first",
		steps:   []step{{1, false, svc("5", shadowed)}, {1, true, svc("6", shadowed)}, {0, false, svc("6", owned)}},
		current: svc("6", owned),
		want:    []string{"changed web@5", "changed web@6"},
	}, {
		name:    "shadow to owner, entering the owner watch first",
		steps:   []step{{1, false, svc("5", shadowed)}, {0, false, svc("6", owned)}, {1, true, svc("6", shadowed)}},
		current: svc("6", owned),
		want:    []string{"changed web@5", "changed web@6"},
	}, {
		name:    "relabelled to a proxy not on this node",
		steps:   []step{{0, false, svc("5", owned)}, {0, true, svc("6", owned)}},
		current: svc("6", other),
		want:    []string{"changed web@5", "deleted web@6"},
	}, {
		name:  "deleted",
		steps: []step{{0, false, svc("5", owned)}, {0, true, svc("6", owned)}},
		want:  []string{"changed web@5", "deleted web@6"},
	}, {
		name: "in both watches: each version once, none older",
		steps: []step{{0, false, svc("5", nil)}, {1, false, svc("5", nil)}, {1, false, svc("7", nil)},
			{0, false, svc("6", nil)}, {0, false, svc("7", nil)}, {0, true, svc("8", nil)}, {1, true, svc("8", nil)}},
		want: []string{"changed web@5", "changed web@7", "deleted web@8"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &mergerRecorder{}
				get := func(_ context.Context, ns, name, rv string) (metav1.Object, error) {
					if tc.current == nil {
						return nil, nil
					}
					return tc.current, nil
				}
				m, err := newMerger("Services", watchScope([]config.Instance{{Name: "a", ProxyNames: []string{"team-a"}}}, true), get,
					func(o any) { rec.add("changed", o) }, func(o any) { rec.add("deleted", o) })
				if err != nil {
					t.Fatal(err)
				}
				go m.run(t.Context())
				for _, s := range tc.steps {
					h := m.handlers(s.watch)
					if s.delete {
						h.OnDelete(s.obj)
					} else {
						h.OnAdd(s.obj, false)
					}
					synctest.Wait() // the leave's read answered, as when the watches are slower than it
				}
				rec.mu.Lock()
				defer rec.mu.Unlock()
				if !slices.Equal(rec.events, tc.want) {
					t.Errorf("%s: delivered %q, want %q", tc.name, rec.events, tc.want)
				}
				m.mu.Lock()
				defer m.mu.Unlock()
				if tc.want[len(tc.want)-1][:7] == "deleted" && len(m.held) != 0 {
					t.Errorf("%s: the merger still holds %v", tc.name, m.held)
				}
			})
		})
	}
}

// TestSlicesOfJoinsWatches: a slice two watches hold (its Service moving between the
// shadow and the owner selection) is listed once, at the newer version.
func TestSlicesOfJoinsWatches(t *testing.T) {
	client := testutil.NewClientset()
	w, err := NewWatches(client, "node-1", watchScope([]config.Instance{{Name: "a", ProxyNames: []string{"team-a"}}}, true), WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice := func(name, rv string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv,
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}}
	}
	for i, objs := range [][]*discoveryv1.EndpointSlice{
		{slice("web-1", "7"), slice("web-2", "5")},
		{slice("web-1", "6"), slice("web-3", "9")},
	} {
		for _, sl := range objs {
			if err := w.scoped[i].slices.GetIndexer().Add(sl); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := map[string]string{}
	for _, sl := range w.SlicesOf("ns", "web") {
		if _, dup := got[sl.Name]; dup {
			t.Errorf("%s listed twice", sl.Name)
		}
		got[sl.Name] = sl.ResourceVersion
	}
	if want := map[string]string{"web-1": "7", "web-2": "5", "web-3": "9"}; !maps.Equal(got, want) {
		t.Errorf("SlicesOf = %v, want %v", got, want)
	}
}

// TestMergerLeaveReadsDoNotHoldOtherEvents: a tenant deleting 60 of its Services makes
// 60 reads through the client's real rate limiter (QPS 5, burst 10: 10 s of waiting),
// and another tenant's change on the same watch is still delivered at once, while the
// reads wait; the deletions are all delivered when their reads answer. (In a synctest
// bubble: the limiter's waits pass on the bubble's clock.)
func TestMergerLeaveReadsDoNotHoldOtherEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limiter := flowcontrol.NewTokenBucketRateLimiter(5, 10)
		get := func(ctx context.Context, ns, name, rv string) (metav1.Object, error) {
			if err := limiter.Wait(ctx); err != nil {
				return nil, err
			}
			return nil, nil // gone
		}
		start := time.Now()
		var mu sync.Mutex
		delivered := map[string]time.Duration{}
		note := func(kind string) func(any) {
			return func(o any) {
				mu.Lock()
				defer mu.Unlock()
				delivered[kind+" "+o.(*corev1.Service).Name] = time.Since(start)
			}
		}
		m, err := newMerger("Services", watchScope([]config.Instance{{Name: "a", ProxyNames: []string{"team-a", "team-b"}}}, true), get,
			note("changed"), note("deleted"))
		if err != nil {
			t.Fatal(err)
		}
		go m.run(t.Context())
		owned := func(name, team, rv string) *corev1.Service {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: name, ResourceVersion: rv,
				Labels: map[string]string{selector.LabelServiceProxyName: team}}}
		}
		watch := m.handlers(0) // the owners' watch carries both tenants
		for i := range 60 {
			watch.OnAdd(owned(fmt.Sprintf("a-%d", i), "team-a", "1"), false)
		}
		for i := range 60 {
			watch.OnDelete(owned(fmt.Sprintf("a-%d", i), "team-a", "2"))
		}
		watch.OnAdd(owned("b", "team-b", "3"), false)
		mu.Lock()
		took, ok := delivered["changed b"]
		mu.Unlock()
		if !ok || took != 0 {
			t.Errorf("team-b's change delivered after %v (delivered: %v), want at once", took, ok)
		}
		time.Sleep(time.Minute) // the bubble's clock: the reads' limiter waits pass
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		var last time.Duration
		for i := range 60 {
			d, ok := delivered[fmt.Sprintf("deleted a-%d", i)]
			if !ok {
				t.Fatalf("a-%d never deleted", i)
			}
			last = max(last, d)
		}
		// (60-10)/5 s: the limiter really made the reads wait.
		if last < 9*time.Second {
			t.Errorf("the last deletion came after %v, want the limiter's ~10s", last)
		}
	})
}
