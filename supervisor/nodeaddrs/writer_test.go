package nodeaddrs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
)

const testNamespace = "shardproxy-system"

func node(name string, ips ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	return n
}

// writerHarness runs a Writer against a fake clientset and counts its ConfigMap requests.
type writerHarness struct {
	t       *testing.T
	client  *fake.Clientset
	written chan int
	mu      sync.Mutex
	verbs   []string
}

func startWriter(t *testing.T, debounce time.Duration, objs ...runtime.Object) *writerHarness {
	t.Helper()
	h := &writerHarness{t: t, client: fake.NewClientset(objs...), written: make(chan int, 100)}
	h.client.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if v := a.GetVerb(); v != "list" && v != "watch" { // the requests that cost: not the watch
			h.mu.Lock()
			defer h.mu.Unlock()
			h.verbs = append(h.verbs, v)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w := &Writer{Client: h.client, Namespace: testNamespace, Debounce: debounce,
		Written: func(nodes, _ int) { h.written <- nodes }}
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

// next waits for the next write and returns its Node count.
func (h *writerHarness) next() int {
	h.t.Helper()
	select {
	case n := <-h.written:
		return n
	case <-time.After(30 * time.Second):
		h.t.Fatal("no write within 30 s")
		return 0
	}
}

func (h *writerHarness) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.verbs...)
}

func (h *writerHarness) published() string {
	h.t.Helper()
	cm, err := h.client.CoreV1().ConfigMaps(testNamespace).Get(context.Background(), DefaultName, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return cm.Data[DataKey]
}

func TestWriterPublishesTheWholeListAtStart(t *testing.T) {
	h := startWriter(t, 50*time.Millisecond, node("a", "10.0.0.1"), node("b", "10.0.0.2", "fd00::2"))
	if got := h.next(); got != 2 {
		t.Errorf("first write has %d nodes, want 2", got)
	}
	if got, want := h.published(), header+"\na 10.0.0.1\nb 10.0.0.2 fd00::2\n"; got != want {
		t.Errorf("published:\n%s\nwant:\n%s", got, want)
	}
	if got := strings.Join(h.requests(), ","); got != "get,create,get" {
		t.Errorf("requests %s, want get,create (and the test's get)", got)
	}
}

func TestWriterLeavesAnUpToDateListAlone(t *testing.T) {
	a, _ := FromNode(node("a", "10.0.0.1"))
	text := Encode([]Node{a})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: DefaultName, Namespace: testNamespace}, Data: map[string]string{DataKey: text}}
	h := startWriter(t, 50*time.Millisecond, node("a", "10.0.0.1"), cm)
	// The first publish reads the list, finds it current and writes nothing; a new
	// Node's write follows it.
	if _, err := h.client.CoreV1().Nodes().Create(context.Background(), node("b", "10.0.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := h.next(); got != 2 {
		t.Errorf("write has %d nodes, want 2", got)
	}
	if got := strings.Join(h.requests(), ","); got != "get,update" {
		t.Errorf("requests %s, want get (at start, list current), update (the new Node)", got)
	}
}

// TestWriterWritesOnlyAddressChanges: heartbeats (status updates that leave the
// addresses alone) cost no request; a burst of new Nodes within the debounce costs one
// write.
func TestWriterWritesOnlyAddressChanges(t *testing.T) {
	ctx := context.Background()
	h := startWriter(t, 500*time.Millisecond, node("a", "10.0.0.1"))
	h.next()
	before := len(h.requests())
	nodes := h.client.CoreV1().Nodes()
	for i := range 20 {
		n, err := nodes.Get(ctx, "a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.NewTime(time.Unix(int64(i), 0))}}
		if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if _, err := nodes.Create(ctx, node(fmt.Sprintf("new-%d", i), fmt.Sprintf("10.0.1.%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.next(); got != 6 {
		t.Errorf("the write after 20 heartbeats and 5 new Nodes has %d nodes, want 6 (one write for the burst)", got)
	}
	if got := h.requests()[before:]; strings.Join(got, ",") != "update" {
		t.Errorf("requests after the start: %v, want one update", got)
	}
	// A changed address is written; a deleted Node too.
	n, _ := nodes.Get(ctx, "a", metav1.GetOptions{})
	n.Status.Addresses[0].Address = "10.0.0.9"
	if _, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.next()
	if got := h.published(); !strings.Contains(got, "\na 10.0.0.9\n") {
		t.Errorf("published after the address change:\n%s", got)
	}
	if err := nodes.Delete(ctx, "new-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := h.next(); got != 5 {
		t.Errorf("write after a deletion has %d nodes, want 5", got)
	}
}

// TestWriterRestoresItsList: the writer watches its ConfigMap, and writes the list back
// when it is edited or deleted, without a Node changing; its own writes' events cost no
// request (no write loop).
func TestWriterRestoresItsList(t *testing.T) {
	want := header + "\na 10.0.0.1\n"
	for _, tc := range []struct {
		name string
		// change changes the ConfigMap as someone else would.
		change func(ctx context.Context, cms typedcorev1.ConfigMapInterface) error
		// wantRequests are the change's requests, then the writer's up to its write
		// back.
		wantRequests string
	}{{
		name: "edited by hand",
		change: func(ctx context.Context, cms typedcorev1.ConfigMapInterface) error {
			cm, err := cms.Get(ctx, DefaultName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cm.Data[DataKey] = header + "\n"
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			return err
		},
		wantRequests: "get,update" + ",get,update",
	}, {
		name: "deleted",
		change: func(ctx context.Context, cms typedcorev1.ConfigMapInterface) error {
			return cms.Delete(ctx, DefaultName, metav1.DeleteOptions{})
		},
		wantRequests: "delete" + ",get,create",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := startWriter(t, 50*time.Millisecond, node("a", "10.0.0.1"))
			h.next()
			cms := h.client.CoreV1().ConfigMaps(testNamespace)
			before := len(h.requests())
			if err := tc.change(ctx, cms); err != nil {
				t.Fatal(err)
			}
			if got := h.next(); got != 1 {
				t.Errorf("the write back has %d nodes, want 1", got)
			}
			if got := h.published(); got != want {
				t.Errorf("published:\n%s\nwant:\n%s", got, want)
			}
			// The next write is a new Node's, with nothing between: the write back's own
			// event wrote nothing.
			if _, err := h.client.CoreV1().Nodes().Create(ctx, node("b", "10.0.0.2"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := h.next(); got != 2 {
				t.Errorf("the write after a new Node has %d nodes, want 2", got)
			}
			// The change's, the write back's, the test's get (published), one update.
			got := h.requests()[before:]
			if want := tc.wantRequests + ",get,update"; strings.Join(got, ",") != want {
				t.Errorf("requests after the change: %v, want %s (the test's get between)", got, want)
			}
		})
	}
}

// TestRunFailsWhenNodesCannotBeListed: a writer whose Node list is refused returns,
// within SyncTimeout, an error that says what failed, and is unhealthy meanwhile.
func TestRunFailsWhenNodesCannotBeListed(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "", errors.New("no right"))
	})
	w := &Writer{Client: client, Namespace: testNamespace, SyncTimeout: time.Second}
	start := time.Now()
	w.setLeading(true)
	err := w.Run(context.Background())
	took := time.Since(start)
	if err := w.healthyAt(time.Now()); err != nil {
		t.Errorf("Healthy just after the first failure = %v, want nil (failing for less than SyncTimeout)", err)
	}
	if err == nil || !strings.Contains(err.Error(), "not done within 1s") || !strings.Contains(err.Error(), "Nodes: ") ||
		!apierrors.IsForbidden(errors.Unwrap(err)) && !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("Run = %v, want the sync bound's error naming the Nodes' list refused", err)
	}
	if took > 10*time.Second {
		t.Errorf("Run returned after %v, want about its 1 s bound", took)
	}
	if err := w.healthyAt(time.Now().Add(2 * time.Second)); err == nil || !strings.Contains(err.Error(), "publishing has failed") {
		t.Errorf("Healthy past SyncTimeout = %v, want the failure", err)
	}
	w.setLeading(false)
	if err := w.Healthy(); err != nil {
		t.Errorf("Healthy standing by = %v, want nil", err)
	}
}

// TestRunElectedReleasesTheLeaseWhenTheWriterStops: the leader's writer fails its first
// sync; RunElected releases the Lease and returns the error.
func TestRunElectedReleasesTheLeaseWhenTheWriterStops(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "", errors.New("no right"))
	})
	rec := &recorder{}
	w := &Writer{Client: client, Namespace: testNamespace, SyncTimeout: time.Second, Recorder: rec}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := RunElected(ctx, w, Election{Identity: "w-0", LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second,
		RetryPeriod: 100 * time.Millisecond})
	if ctx.Err() != nil {
		t.Fatal("RunElected did not return within 30 s")
	}
	if err == nil || !strings.Contains(err.Error(), "stopped while leading") || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("RunElected = %v, want the writer's error", err)
	}
	lease, err := client.CoordinationV1().Leases(testNamespace).Get(ctx, DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the Lease is held by %q after the writer stopped, want released", *h)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := strings.Join(rec.events, ","); got != "leader,failed,standby" {
		t.Errorf("recorded %s, want leader,failed,standby", got)
	}
}

// TestHealthy: a leading writer is unhealthy only once it has been unable to do its
// work for longer than SyncTimeout, and never for a list too large to write.
func TestHealthy(t *testing.T) {
	t0 := time.Now()
	const bound = time.Minute
	forbidden := apierrors.NewForbidden(corev1.Resource("nodes"), "", errors.New("no right"))
	tests := []struct {
		name string
		// setup drives a leading writer (it started leading at t0).
		setup func(w *Writer)
		at    time.Duration // since t0
		want  string        // "" for healthy, else a part of the error
	}{
		{name: "standing by", setup: func(w *Writer) { w.setLeading(false) }, at: time.Hour},
		{name: "leading, published", setup: func(w *Writer) { w.published(3, nil) }, at: time.Hour},
		{name: "leading, nothing published within the bound", at: 30 * time.Second},
		{name: "leading, nothing published past the bound", at: 2 * time.Minute, want: "nothing published yet"},
		{name: "publish failing for less than the bound", setup: func(w *Writer) {
			w.published(3, nil)
			w.state.err, w.state.failing = errors.New("etcd is down"), t0.Add(10*time.Second)
		}, at: 50 * time.Second},
		{name: "publish failing past the bound", setup: func(w *Writer) {
			w.published(3, nil)
			w.state.err, w.state.failing = errors.New("etcd is down"), t0.Add(10*time.Second)
		}, at: 80 * time.Second, want: "etcd is down"},
		{name: "a list too large to write", setup: func(w *Writer) {
			w.published(3, nil)
			w.state.err, w.state.failing = fmt.Errorf("publishing: %w", ErrTooLarge), t0
		}, at: time.Hour},
		{name: "a watch failing, each retry within the gap, past the bound", setup: func(w *Writer) {
			w.published(3, nil)
			for at := 0 * time.Second; at <= 90*time.Second; at += 30 * time.Second {
				w.watchFailed("Nodes", forbidden, t0.Add(at))
			}
		}, at: 100 * time.Second, want: "watching Nodes has failed"},
		{name: "a watch failing for less than the bound", setup: func(w *Writer) {
			w.published(3, nil)
			w.watchFailed("Nodes", forbidden, t0)
			w.watchFailed("Nodes", forbidden, t0.Add(30*time.Second))
		}, at: 40 * time.Second},
		{name: "a watch recovered: no error for longer than the gap", setup: func(w *Writer) {
			w.published(3, nil)
			for at := 0 * time.Second; at <= 90*time.Second; at += 30 * time.Second {
				w.watchFailed("Nodes", forbidden, t0.Add(at))
			}
		}, at: 90*time.Second + watchErrorGap + time.Second},
		{name: "a watch's failures of the last term", setup: func(w *Writer) {
			for at := -3 * time.Minute; at <= 0; at += 30 * time.Second {
				w.watchFailed("Nodes", forbidden, t0.Add(at))
			}
			w.setLeading(false)
			w.setLeading(true)
			w.state.since = t0
			w.published(3, nil)
		}, at: 30 * time.Second},
		{name: "a list too large for an hour, then another failure just now", setup: func(w *Writer) {
			w.published(3, nil)
			w.state.err, w.state.failing = fmt.Errorf("publishing: %w", ErrTooLarge), t0.Add(-time.Hour)
			w.published(3, forbidden) // its failure run begins now (t0)
		}, at: 10 * time.Second},
		{name: "isolated watch errors further apart than the gap", setup: func(w *Writer) {
			w.published(3, nil)
			for at := 0 * time.Second; at <= 10*time.Minute; at += 2 * time.Minute {
				w.watchFailed("ConfigMap", errors.New("too old resource version"), t0.Add(at))
			}
		}, at: 10*time.Minute + time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := &Writer{SyncTimeout: bound}
			w.setLeading(true)
			w.state.since = t0
			if tc.setup != nil {
				tc.setup(w)
			}
			err := w.healthyAt(t0.Add(tc.at))
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Healthy = %v, want %q", err, tc.want)
			}
		})
	}
}

// recorder is a Recorder that lists what it heard.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) SetLeader(l bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, map[bool]string{true: "leader", false: "standby"}[l])
}

func (r *recorder) Published(nodes int, _ time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("published %d", nodes))
}

func (r *recorder) BudgetWait(wait time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("budget wait %v", wait))
}

func (r *recorder) PublishFailed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, "failed")
}

func TestPublishRefusesAListOverTheLimit(t *testing.T) {
	client := fake.NewClientset()
	p := &publisher{w: &Writer{Client: client, Namespace: testNamespace, Name: DefaultName}}
	var nodes []Node
	for i := range 5000 {
		nodes = append(nodes, Node{Name: fmt.Sprintf("%0253d", i), Addrs: addrs("10.0.0.1", "fd00::1")})
	}
	err := p.publish(context.Background(), nodes)
	if err == nil || !strings.Contains(err.Error(), "the list published before stays") {
		t.Fatalf("publish = %v, want the size error", err)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("%d requests for a list over the limit, want none", n)
	}
}
