package migrate

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestPublishedSync: a healthy instance's published last sync lags the real one by less
// than SyncResolution and moves at most once per SyncResolution however often it syncs,
// at a moment of the node's own; a failing instance's is exact (it does not move).
func TestPublishedSync(t *testing.T) {
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		node  string
		every time.Duration
		exact bool
		// wantChanges is how many distinct values an hour of syncs every `every` publishes.
		wantChanges int
	}{
		{name: "syncs every 30s publish 12 values an hour", node: "node-1", every: 30 * time.Second, wantChanges: 12},
		{name: "syncs every second publish 12 values an hour", node: "node-2", every: time.Second, wantChanges: 12},
		{name: "a failing instance publishes its last sync exactly", node: "node-1", every: 30 * time.Second, exact: true, wantChanges: 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[time.Time]bool{}
			for last := start; last.Before(start.Add(time.Hour)); last = last.Add(tc.every) {
				got := PublishedSync(tc.node, last, tc.exact)
				if got.After(last) || last.Sub(got) >= SyncResolution {
					t.Fatalf("PublishedSync(%v) = %v: lags %v, want within [0, %v)", last, got, last.Sub(got), SyncResolution)
				}
				if tc.exact && !got.Equal(last) {
					t.Fatalf("exact PublishedSync(%v) = %v", last, got)
				}
				seen[got] = true
			}
			if len(seen) < tc.wantChanges-1 || len(seen) > tc.wantChanges+1 {
				t.Errorf("%d distinct values in an hour, want ~%d", len(seen), tc.wantChanges)
			}
		})
	}
	if !PublishedSync("node-1", time.Time{}, false).IsZero() {
		t.Errorf("no sync yet must publish nothing")
	}
	// The nodes of a fleet move at moments of their own, not all at once.
	moments := map[time.Time]bool{}
	for i := range 100 {
		moments[PublishedSync(fmt.Sprintf("node-%d", i), start, false)] = true
	}
	if len(moments) < 50 {
		t.Errorf("100 nodes publish their sync at only %d distinct moments", len(moments))
	}
}

// TestFailingReason: one line, bounded, worded so that it stays the same while the fault
// lasts.
func TestFailingReason(t *testing.T) {
	queued := time.Date(2025, 3, 1, 12, 0, 3, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		healthy, up bool
		down, err   string
		queued      time.Time
		want        string
	}{
		{name: "healthy", healthy: true, up: true, want: ""},
		{name: "down after a panic: the first line, not the stack", down: "panic: boom\ngoroutine 1 [running]:\nmain.main()", want: "down: panic: boom"},
		{name: "down without a reason", want: "down"},
		{name: "sync failing", up: true, err: "nft: Error: Could not process rule: No such file or directory\n  add rule ...", want: "sync failing: nft: Error: Could not process rule: No such file or directory"},
		{name: "stale with a queued update names when it was queued", up: true, queued: queued, want: "stale: an update queued at 2025-03-01T12:00:03Z is not programmed"},
		{name: "stale sync loop", up: true, want: "stale: the sync loop finishes no sync"},
		{name: "a long error is cut", up: true, err: strings.Repeat("x", 500), want: "sync failing: " + strings.Repeat("x", MaxReasonLen-3-len("sync failing: ")) + "..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FailingReason(tc.healthy, tc.up, tc.down, tc.err, tc.queued); got != tc.want {
				t.Errorf("FailingReason = %q, want %q", got, tc.want)
			}
		})
	}
}

// fleet is a fake API server holding node statuses, Nodes and Services, whose lists page
// (Limit and Continue) as a real one does, and which counts the requests.
type fleet struct {
	client *fake.Clientset
	gets   map[string]int
	lists  map[string]int
	// listAlloc is what the fake's lists allocated (bytes): its copies of every object
	// of the kind on every page, which a real API server does not put in the reader.
	listAlloc uint64
}

func newFleet(t testing.TB) *fleet {
	t.Helper()
	f := &fleet{client: fake.NewClientset(), gets: map[string]int{}, lists: map[string]int{}}
	f.client.PrependReactor("get", "*", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		f.gets[a.GetResource().Resource]++
		return false, nil, nil
	})
	page := func(gvr schema.GroupVersionResource, gvk schema.GroupVersionKind) k8stesting.ReactionFunc {
		return func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
			f.lists[gvr.Resource]++
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			defer func() { runtime.ReadMemStats(&m1); f.listAlloc += m1.TotalAlloc - m0.TotalAlloc }()
			la := a.(k8stesting.ListAction)
			obj, err := f.client.Tracker().List(gvr, gvk, a.GetNamespace())
			if err != nil {
				return true, nil, err
			}
			opts := a.(k8stesting.ListActionImpl).ListOptions
			items, err := meta.ExtractList(obj)
			if err != nil {
				return true, nil, err
			}
			var sel []k8sruntime.Object
			for _, it := range items {
				m, err := meta.Accessor(it)
				if err != nil {
					return true, nil, err
				}
				if la.GetListRestrictions().Labels.Matches(labels.Set(m.GetLabels())) {
					sel = append(sel, it)
				}
			}
			from, _ := strconv.Atoi(opts.Continue)
			to := len(sel)
			if opts.Limit > 0 && from+int(opts.Limit) < to {
				to = from + int(opts.Limit)
			}
			if err := meta.SetList(obj, sel[from:to]); err != nil {
				return true, nil, err
			}
			if to < len(sel) {
				la, _ := meta.ListAccessor(obj)
				la.SetContinue(strconv.Itoa(to))
			}
			return true, obj, nil
		}
	}
	f.client.PrependReactor("list", "configmaps", page(corev1.SchemeGroupVersion.WithResource("configmaps"), corev1.SchemeGroupVersion.WithKind("ConfigMap")))
	f.client.PrependReactor("list", "nodes", page(corev1.SchemeGroupVersion.WithResource("nodes"), corev1.SchemeGroupVersion.WithKind("Node")))
	f.client.PrependReactor("list", "services", page(corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service")))
	return f
}

// addStatus stores node's status as the API server would have at written.
func (f *fleet) addStatus(t testing.TB, node string, st NodeStatus, written time.Time) {
	t.Helper()
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName(node), Namespace: statusNS,
			Labels: map[string]string{LabelComponent: ComponentNodeStatus},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "shardproxy", Operation: metav1.ManagedFieldsOperationUpdate,
				Time: &metav1.Time{Time: written}, FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:` + StatusKey + `":{}}}`)}}}},
		Data: map[string]string{StatusKey: string(data)},
	}
	if err := f.client.Tracker().Add(cm); err != nil {
		t.Fatal(err)
	}
}

func (f *fleet) add(t testing.TB, objs ...k8sruntime.Object) {
	t.Helper()
	for _, o := range objs {
		if err := f.client.Tracker().Add(o); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterStatus: per instance, the nodes running it, those healthy, those failing
// or stale and why (a stale status with its Node's state), the Services that are its to
// serve, and the oldest last sync; --instance narrows it; Nodes without a status are
// counted.
func TestClusterStatus(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	healthy := func(names ...string) InstanceStatus {
		return InstanceStatus{ProxyNames: names, LastSync: now.Add(-2 * time.Minute)}
	}
	f := newFleet(t)
	f.addStatus(t, "node-1", NodeStatus{Instances: map[string]InstanceStatus{
		"default": {Default: true, LastSync: now.Add(-3 * time.Minute)}, "team-a": healthy("team-a")}}, now.Add(-time.Minute))
	f.addStatus(t, "node-2", NodeStatus{Instances: map[string]InstanceStatus{
		"default": {Default: true, LastSync: now.Add(-time.Minute)},
		"team-a":  {ProxyNames: []string{"team-a", "team-a2"}, Failing: "sync failing: nft: Error", LastSync: now.Add(-20 * time.Minute)}}}, now.Add(-30*time.Second))
	// node-3's supervisor stopped an hour ago; its Node is NotReady. node-4 is gone.
	f.addStatus(t, "node-3", NodeStatus{Instances: map[string]InstanceStatus{"default": {Default: true, LastSync: now.Add(-time.Hour)}}}, now.Add(-time.Hour))
	f.addStatus(t, "node-4", NodeStatus{Instances: map[string]InstanceStatus{"team-a": healthy("team-a")}}, now.Add(-time.Hour))
	// node-5 runs a supervisor older than LastSync: it writes only on change, so an old
	// status is not stale.
	f.addStatus(t, "node-5", NodeStatus{Instances: map[string]InstanceStatus{"default": {Default: true}}}, now.Add(-time.Hour))
	f.add(t, nodeObject("node-1", corev1.ConditionTrue), nodeObject("node-2", corev1.ConditionTrue), nodeObject("node-3", corev1.ConditionFalse),
		nodeObject("node-5", corev1.ConditionTrue), nodeObject("node-6", corev1.ConditionTrue))
	f.add(t, svc("shop", "cart", ""), svc("shop", "web", "team-a"), svc("shop", "api", "team-a2"), svc("shop", "other", "legacy"),
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "ext"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName}})
	clock := LocalClock(func() time.Time { return now })

	for _, tc := range []struct {
		name     string
		instance string
		want     string
		wantErr  string
	}{
		{name: "every instance", want: `{"name":"default","default":true,"nodes":4,"healthy":3,"services":1,` +
			`"oldestSync":"2025-03-01T11:00:00Z","oldestSyncNode":"node-3","newestSync":"2025-03-01T11:59:00Z",` +
			`"problems":[{"node":"node-3","reason":"status stale, Node NotReady","written":"2025-03-01T11:00:00Z","lastSync":"2025-03-01T11:00:00Z"}]}|` +
			`{"name":"team-a","proxyNames":["team-a","team-a2"],"nodes":3,"healthy":1,"services":2,` +
			`"oldestSync":"2025-03-01T11:40:00Z","oldestSyncNode":"node-2","newestSync":"2025-03-01T11:58:00Z",` +
			`"problems":[{"node":"node-4","reason":"status stale, Node gone","written":"2025-03-01T11:00:00Z","lastSync":"2025-03-01T11:58:00Z"},` +
			`{"node":"node-2","reason":"sync failing: nft: Error","written":"2025-03-01T11:59:30Z","lastSync":"2025-03-01T11:40:00Z"}]}`},
		{name: "one instance", instance: "team-a", want: `{"name":"team-a",`},
		{name: "an instance no node runs", instance: "team-z", wantErr: `no node in shardproxy-system reports an instance "team-z"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, err := ReadClusterStatus(context.Background(), f.client, statusNS, clock, tc.instance)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ci := range cs.Instances {
				b, _ := json.Marshal(ci)
				got = append(got, string(b))
			}
			if !strings.HasPrefix(strings.Join(got, "|"), tc.want) {
				t.Errorf("instances:\n%s\nwant:\n%s", strings.Join(got, "|\n"), strings.ReplaceAll(tc.want, "|", "|\n"))
			}
			if tc.instance != "" && len(cs.Instances) != 1 {
				t.Errorf("--instance %s gave %d instances", tc.instance, len(cs.Instances))
			}
			if cs.Nodes != 5 || cs.NodesWithoutStatus.Count != 1 || cs.NodesWithoutStatus.Sample[0] != "node-6" {
				t.Errorf("nodes %d, without status %+v; want 5 and node-6", cs.Nodes, cs.NodesWithoutStatus)
			}
			var out strings.Builder
			if err := WriteClusterStatus(&out, cs); err != nil {
				t.Fatal(err)
			}
			t.Logf("\n%s", out.String())
		})
	}
}

// TestClusterStatusFleet reads 5,000 node statuses (three instances, one on half the
// nodes; some failing, some stale), 5,000 Nodes and 3,000 Services through lists of 500:
// ten requests per kind, no Get, and it reports its time and memory.
func TestClusterStatusFleet(t *testing.T) {
	const nodes = 5000
	now := time.Now().UTC().Truncate(time.Second)
	f := newFleet(t)
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		st := NodeStatus{Instances: map[string]InstanceStatus{
			"default": {Default: true, LastSync: now.Add(-time.Duration(i%300) * time.Second)},
			"team-a":  {ProxyNames: []string{"team-a"}, LastSync: now.Add(-time.Minute)},
		}}
		if i%2 == 0 {
			st.Instances["team-b"] = InstanceStatus{ProxyNames: []string{"team-b"}, LastSync: now.Add(-time.Minute)}
		}
		written := now.Add(-time.Minute)
		switch {
		case i < 3:
			st.Instances["team-a"] = InstanceStatus{ProxyNames: []string{"team-a"}, Failing: "sync failing: nft: Error: Could not process rule", LastSync: now.Add(-time.Hour)}
		case i < 5:
			written = now.Add(-time.Hour)
		}
		f.addStatus(t, name, st, written)
		if i < nodes-1 {
			f.add(t, nodeObject(name, corev1.ConditionTrue))
		}
	}
	for i := range 3000 {
		label := []string{"", "team-a", "team-b", "other"}[i%4]
		f.add(t, svc(fmt.Sprintf("ns-%d", i%50), fmt.Sprintf("svc-%d", i), label))
	}
	clock := LocalClock(func() time.Time { return now })

	heapBefore := testutil.LiveHeap()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	cs, err := ReadClusterStatus(context.Background(), f.client, statusNS, clock, "")
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	retained := int64(testutil.LiveHeap()) - int64(heapBefore)

	want := map[string][3]int{"default": {nodes, nodes - 2, 750}, "team-a": {nodes, nodes - 5, 750}, "team-b": {nodes / 2, nodes/2 - 1, 750}}
	for _, ci := range cs.Instances {
		w := want[ci.Name]
		if ci.Nodes != w[0] || ci.Healthy != w[1] || ci.Services != w[2] || len(ci.Problems) != w[0]-w[1] {
			t.Errorf("%s: nodes %d healthy %d services %d problems %d; want %v", ci.Name, ci.Nodes, ci.Healthy, ci.Services, len(ci.Problems), w)
		}
	}
	if len(cs.Instances) != 3 || cs.Nodes != nodes {
		t.Errorf("%d instances over %d statuses", len(cs.Instances), cs.Nodes)
	}
	if len(f.gets) != 0 || f.lists["configmaps"] != nodes/listPage || f.lists["nodes"] != nodes/listPage || f.lists["services"] != 3000/listPage {
		t.Errorf("requests: gets %v, lists %v; want no get and pages of %d", f.gets, f.lists, listPage)
	}
	var out strings.Builder
	if err := WriteClusterStatus(&out, cs); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d node statuses, %d Nodes, 3000 Services in %d lists: %v (the fake API server's list calls included), "+
		"%.1f MB allocated by the reader (%.1f MB more by the fake's lists), %.2f MB kept by the result\n%s",
		nodes, nodes-1, f.lists["configmaps"]+f.lists["nodes"]+f.lists["services"], elapsed.Round(time.Millisecond),
		float64(after.TotalAlloc-before.TotalAlloc-f.listAlloc)/1e6, float64(f.listAlloc)/1e6, float64(retained)/1e6, out.String())
	runtime.KeepAlive(cs)
}
