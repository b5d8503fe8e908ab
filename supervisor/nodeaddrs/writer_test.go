package nodeaddrs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
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
		h.mu.Lock()
		defer h.mu.Unlock()
		h.verbs = append(h.verbs, a.GetVerb())
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

// TestWriterRewritesAHandEditedList: an update that conflicts (someone else wrote the
// ConfigMap) reads it again and writes the list.
func TestWriterRewritesAHandEditedList(t *testing.T) {
	ctx := context.Background()
	h := startWriter(t, 50*time.Millisecond, node("a", "10.0.0.1"))
	h.next()
	cms := h.client.CoreV1().ConfigMaps(testNamespace)
	cm, err := cms.Get(ctx, DefaultName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[DataKey] = header + "\n"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The writer does not watch its ConfigMap: the next Node change brings it back.
	if _, err := h.client.CoreV1().Nodes().Create(ctx, node("b", "10.0.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.next()
	if got, want := h.published(), header+"\na 10.0.0.1\nb 10.0.0.2\n"; got != want {
		t.Errorf("published:\n%s\nwant:\n%s", got, want)
	}
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
