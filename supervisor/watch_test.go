package supervisor

import (
	"context"
	"fmt"
	"maps"
	goruntime "runtime"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// deliveredSink counts what the dispatcher hands an instance.
type deliveredSink struct {
	mu       sync.Mutex
	services map[types.NamespacedName]bool
	slices   map[string]bool
}

func (c *deliveredSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.services[types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}] = true
	done := make(chan struct{})
	close(done)
	return done
}
func (c *deliveredSink) DeleteService(types.NamespacedName) {}
func (c *deliveredSink) UpdateEndpointSlice(sl *discoveryv1.EndpointSlice) {
	time.Sleep(20 * time.Microsecond) // an instance does some work per event
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slices[sl.Namespace+"/"+sl.Name] = true
}
func (c *deliveredSink) DeleteEndpointSlice(*discoveryv1.EndpointSlice) {}

// TestStartWaitsForHandlers: when Start returns, every Service and EndpointSlice of the
// initial lists has reached the instances, not only the informers' caches; otherwise an
// instance's first full sync (at a restart) programs part of the cluster, and Services
// whose slices are still on their way reject traffic until the next sync (seen at
// 10,000 Services: a first sync with 9,767 Services and 43,470 of 100,000 endpoints).
func TestStartWaitsForHandlers(t *testing.T) {
	const n = 3000
	var objs []runtime.Object
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs,
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Port: 80}}}},
			&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-x",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4})
	}
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	client := testutil.NewClientset(objs...)
	w, err := NewWatches(client, "node-1", []string{""}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := selector.NewRouter([]selector.Spec{{Name: "default", Default: true}})
	if err != nil {
		t.Fatal(err)
	}
	sink := &deliveredSink{services: map[types.NamespacedName]bool{}, slices: map[string]bool{}}
	d := selector.NewDispatcher(router, map[string]selector.Sink{"default": sink}, w.SlicesOf, selector.Events{})
	if err := w.Connect(d, func(*corev1.Node, bool) {}, func() {}, func() {}, func() {}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	services, slices := len(sink.services), len(sink.slices)
	sink.mu.Unlock()
	if services != n || slices != n {
		t.Errorf("when Start returned, the instance had %d of %d Services and %d of %d EndpointSlices", services, n, slices, n)
	}
}

// TestSlicesOfSharedBuckets: the slice index groups Services in buckets
// (serviceBuckets); with more Services than buckets many share one, and SlicesOf still
// lists exactly a Service's own slices: none of another Service of its bucket, none of
// a same-named Service of another namespace, none without the Service label.
func TestSlicesOfSharedBuckets(t *testing.T) {
	const n = 2 * serviceBuckets
	var objs []runtime.Object
	slice := func(ns, name, svc string) *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			AddressType: discoveryv1.AddressTypeIPv4}
		if svc != "" {
			sl.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
		}
		return sl
	}
	for i := range n {
		svc := fmt.Sprintf("svc-%d", i)
		objs = append(objs, slice("a", svc+"-1", svc), slice("a", svc+"-2", svc), slice("b", svc+"-1", svc))
	}
	objs = append(objs, slice("a", "unlabelled", ""))
	w, err := NewWatches(testutil.NewClientset(objs...), "node-1", []string{""}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	buckets := map[string]int{}
	for i := range n {
		svc := fmt.Sprintf("svc-%d", i)
		buckets[serviceBucket("a", svc)]++
		for _, tc := range []struct {
			ns   string
			want []string
		}{{"a", []string{"a/" + svc + "-1", "a/" + svc + "-2"}}, {"b", []string{"b/" + svc + "-1"}}} {
			var got []string
			for _, sl := range w.SlicesOf(tc.ns, svc) {
				got = append(got, sl.Namespace+"/"+sl.Name)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("SlicesOf(%s, %s) = %v, want %v", tc.ns, svc, got, tc.want)
			}
		}
	}
	if len(buckets) > serviceBuckets || len(buckets) < serviceBuckets/2 {
		t.Errorf("%d Services fell into %d buckets, want at most %d and most of them used", n, len(buckets), serviceBuckets)
	}
}

// TestSliceIndexHeap bounds the heap the slice index keeps per Service (one slice
// each): a set per Service was ~300 bytes; a bucket's set costs a few dozen per member.
func TestSliceIndexHeap(t *testing.T) {
	const n, maxBytes = 30000, 80
	var objs []*discoveryv1.EndpointSlice
	for i := range n {
		svc := fmt.Sprintf("svc-%05d", i)
		objs = append(objs, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}})
	}
	fill := func(indexers cache.Indexers) cache.Indexer {
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, indexers)
		for _, o := range objs {
			if err := idx.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		return idx
	}
	before := testutil.LiveHeap()
	plain := fill(cache.Indexers{})
	mid := testutil.LiveHeap()
	indexed := fill(cache.Indexers{byServiceIndex: sliceServiceIndex})
	after := testutil.LiveHeap()
	perService := float64(int64(after-mid)-int64(mid-before)) / n
	goruntime.KeepAlive(plain)
	goruntime.KeepAlive(indexed)
	t.Logf("slice index: %.0f bytes of heap per Service", perService)
	if perService > maxBytes {
		t.Errorf("the slice index keeps %.0f bytes per Service, want at most %d", perService, maxBytes)
	}
}

// TestWatchIndexes: the Service and EndpointSlice informers keep no index but the
// slices' by-Service one (client-go's factories add a by-namespace index of every key,
// which no one here reads), whatever the scope.
func TestWatchIndexes(t *testing.T) {
	w, err := NewWatches(testutil.NewClientset(), "node-1", []string{"a=b", "c=d"}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, sw := range w.scoped {
		if got := slices.Collect(maps.Keys(sw.services.GetIndexer().GetIndexers())); len(got) != 0 {
			t.Errorf("scope %d: Service indexes %v, want none", i, got)
		}
		if got := slices.Collect(maps.Keys(sw.slices.GetIndexer().GetIndexers())); !slices.Equal(got, []string{byServiceIndex}) {
			t.Errorf("scope %d: EndpointSlice indexes %v, want only %s", i, got, byServiceIndex)
		}
	}
}
