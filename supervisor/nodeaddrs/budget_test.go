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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestPublishInterval: the least time between two writes is readers × list bytes over
// the budget; no budget, no interval.
func TestPublishInterval(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name             string
		readers, bytes   int
		budget           int64
		wantMin, wantMax time.Duration
	}{
		// Real entries are ~107 B (a long name, three addresses).
		{name: "100 nodes, 10.7 kB list, 50 MiB/s", readers: 100, bytes: 10_700, budget: 50 * mib,
			wantMin: 20 * time.Millisecond, wantMax: 21 * time.Millisecond},
		{name: "1,000 nodes, 107 kB list, 50 MiB/s", readers: 1000, bytes: 107_000, budget: 50 * mib,
			wantMin: 2040 * time.Millisecond, wantMax: 2041 * time.Millisecond},
		{name: "5,000 nodes, 536 kB list, 50 MiB/s", readers: 5000, bytes: 536_000, budget: 50 * mib,
			wantMin: 51_116 * time.Millisecond, wantMax: 51_117 * time.Millisecond},
		{name: "5,000 nodes, 536 kB list, 10 MiB/s", readers: 5000, bytes: 536_000, budget: 10 * mib,
			wantMin: 255_584 * time.Millisecond, wantMax: 255_585 * time.Millisecond},
		{name: "exact: 1,000 B to 10 readers at 1,000 B/s", readers: 10, bytes: 1000, budget: 1000,
			wantMin: 10 * time.Second, wantMax: 10 * time.Second},
		{name: "no budget", readers: 5000, bytes: 536_000, budget: 0},
		{name: "no readers", readers: 0, bytes: 100, budget: 50 * mib},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PublishInterval(tc.readers, tc.bytes, tc.budget)
			if got < tc.wantMin || got > tc.wantMax {
				t.Errorf("PublishInterval(%d, %d, %d) = %v, want %v to %v", tc.readers, tc.bytes, tc.budget, got, tc.wantMin, tc.wantMax)
			}
		})
	}
}

// write is one list the writer wrote: when (on its clock) and its size.
type write struct {
	at           time.Time
	nodes, bytes int
}

// budgetHarness runs a Writer on a fake clock against a fake clientset.
type budgetHarness struct {
	t      *testing.T
	client *fake.Clientset
	clock  *clocktesting.FakeClock
	writes chan write
	mu     sync.Mutex
	all    []write
}

func startBudgetWriter(t *testing.T, debounce time.Duration, budget int64, nodes ...*corev1.Node) *budgetHarness {
	t.Helper()
	h := &budgetHarness{t: t, client: fake.NewClientset(), clock: clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)),
		writes: make(chan write, 1000)}
	for _, n := range nodes {
		if _, err := h.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w := &Writer{Client: h.client, Namespace: testNamespace, Debounce: debounce, MaxEgress: budget, Clock: h.clock,
		Written: func(nodes, bytes int) {
			wr := write{at: h.clock.Now(), nodes: nodes, bytes: bytes}
			h.mu.Lock()
			h.all = append(h.all, wr)
			h.mu.Unlock()
			h.writes <- wr
		}}
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

// until waits (in real time, up to 30 s) for cond.
func (h *budgetHarness) until(what string, cond func() bool) {
	h.t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		h.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waiting waits until the writer waits on a timer of its clock (debounce, budget).
func (h *budgetHarness) waiting() {
	h.t.Helper()
	h.until("the writer to wait on its clock", h.clock.HasWaiters)
}

// next waits for the next write.
func (h *budgetHarness) next() write {
	h.t.Helper()
	select {
	case wr := <-h.writes:
		return wr
	case <-time.After(30 * time.Second):
		h.t.Fatal("no write within 30 s")
		return write{}
	}
}

// noWrite fails if a write has been seen.
func (h *budgetHarness) noWrite(when string) {
	h.t.Helper()
	select {
	case wr := <-h.writes:
		h.t.Fatalf("a write of %d Nodes at %v, %s", wr.nodes, wr.at, when)
	default:
	}
}

func (h *budgetHarness) addNode(name, ip string) {
	h.t.Helper()
	if _, err := h.client.CoreV1().Nodes().Create(context.Background(), node(name, ip), metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestWriterEgressBudget: a change is written after the debounce, and no sooner after
// the write before than the budget's interval for the list it writes.
func TestWriterEgressBudget(t *testing.T) {
	const debounce = time.Second
	// The list after the change: header and three Nodes, read by three.
	text := Encode([]Node{mustNode(t, "a", "10.0.0.1"), mustNode(t, "b", "10.0.0.2"), mustNode(t, "c", "10.0.0.3")})
	const budget = 50 // bytes a second
	interval := PublishInterval(3, len(text), budget)
	if interval < 4*debounce {
		t.Fatalf("the interval %v is too short for this test (want well above the debounce)", interval)
	}
	tests := []struct {
		name   string
		budget int64
		// quiet is the time from the first write to the change.
		quiet time.Duration
		// want is the time from the change to its write.
		want time.Duration
	}{
		{name: "a change after a quiet period is written after the debounce alone", budget: budget,
			quiet: interval + time.Minute, want: debounce},
		{name: "a change after a quiet period as long as the interval, after the debounce alone", budget: budget,
			quiet: interval, want: debounce},
		{name: "a change just after a write waits for the interval", budget: budget,
			quiet: 0, want: interval},
		{name: "a change part-way through the interval waits for the rest", budget: budget,
			quiet: interval / 2, want: interval - interval/2},
		{name: "no budget: a change just after a write is written after the debounce", budget: 0,
			quiet: 0, want: debounce},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startBudgetWriter(t, debounce, tc.budget, node("a", "10.0.0.1"), node("b", "10.0.0.2"))
			first := h.next()
			h.clock.Step(tc.quiet)
			changed := h.clock.Now()
			h.addNode("c", "10.0.0.3")
			h.waiting() // the debounce
			h.clock.Step(tc.want - time.Nanosecond)
			// Just before the write is due: the writer waits on its clock, with nothing
			// written.
			h.until("the writer to wait on its clock, or a write", func() bool { return h.clock.HasWaiters() || len(h.writes) > 0 })
			h.noWrite(fmt.Sprintf("%v after the change, want %v", tc.want-time.Nanosecond, tc.want))
			h.clock.Step(time.Nanosecond)
			wr := h.next()
			if got := wr.at.Sub(changed); got != tc.want || wr.nodes != 3 {
				t.Errorf("wrote %d Nodes %v after the change (%v after the first write), want 3 after %v",
					wr.nodes, got, wr.at.Sub(first.at), tc.want)
			}
		})
	}
}

// TestWriterEgressBudgetUnderChurn: under sustained changes each write follows the one
// before by at least the interval the budget sets for its list, and the last state is
// written in the end.
func TestWriterEgressBudgetUnderChurn(t *testing.T) {
	const (
		debounce = 100 * time.Millisecond
		budget   = 1000 // bytes a second
		changes  = 60
		every    = 250 * time.Millisecond
	)
	var initial []*corev1.Node
	for i := range 5 {
		initial = append(initial, node(fmt.Sprintf("node-%d", i), fmt.Sprintf("10.0.0.%d", i)))
	}
	h := startBudgetWriter(t, debounce, budget, initial...)
	h.next()
	nodes := h.client.CoreV1().Nodes()
	ctx := context.Background()
	published := func() string {
		cm, err := h.client.CoreV1().ConfigMaps(testNamespace).Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[DataKey]
	}
	for i := range changes {
		// A Node joins, or (every third change) the oldest added one leaves.
		var name string
		var gone bool
		if i%3 == 2 {
			name, gone = fmt.Sprintf("new-%d", i-2), true
			if err := nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			name = fmt.Sprintf("new-%d", i)
			h.addNode(name, fmt.Sprintf("10.1.%d.%d", i/250, i%250))
		}
		// The writer waits on its clock (debounce, budget), or has written the change
		// already (it came in as a wait ended).
		h.until("the writer to wait on its clock or write the change", func() bool {
			return h.clock.HasWaiters() || strings.Contains(published(), "\n"+name+" ") != gone
		})
		h.clock.Step(every)
	}
	// The Nodes now: the last state must be written.
	list, err := nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []Node
	for i := range list.Items {
		want = append(want, mustNode(t, list.Items[i].Name, list.Items[i].Status.Addresses[0].Address))
	}
	wantText := Encode(want)
	h.until("the last state written", func() bool {
		if published() == wantText {
			return true
		}
		if h.clock.HasWaiters() {
			h.clock.Step(every)
		}
		return false
	})
	h.mu.Lock()
	all := append([]write(nil), h.all...)
	h.mu.Unlock()
	// At least the first write, one under the churn and the last.
	if len(all) < 3 {
		t.Fatalf("%d writes, want at least 3", len(all))
	}
	// Without a budget the writes would follow the changes, one a debounce apart.
	if len(all) > changes/4 {
		t.Errorf("%d writes for %d changes, want the budget to gather them", len(all), changes)
	}
	for i := 1; i < len(all); i++ {
		gap, min := all[i].at.Sub(all[i-1].at), PublishInterval(all[i].nodes, all[i].bytes, budget)
		if gap < min {
			t.Errorf("write %d (%d Nodes, %d B) followed the one before by %v, want at least %v", i, all[i].nodes, all[i].bytes, gap, min)
		}
	}
	t.Logf("%d changes, one each %v: %d writes over %v", changes, every, len(all), all[len(all)-1].at.Sub(all[0].at))
}

// TestHealthyNotFailingWhileWaitingForTheBudget: a failed publish whose retry waits for
// the egress budget is not failing for the time of that wait.
func TestHealthyNotFailingWhileWaitingForTheBudget(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	const bound = time.Minute
	w := &Writer{SyncTimeout: bound, Clock: clocktesting.NewFakeClock(t0)}
	w.setLeading(true)
	w.state.since = t0
	w.published(3, nil)
	w.state.err, w.state.failing = fmt.Errorf("etcd is down"), t0
	w.budgetWaiting(true, t0.Add(10*time.Second))
	if err := w.healthyAt(t0.Add(2 * bound)); err != nil {
		t.Errorf("Healthy while the retry waits for the budget = %v, want nil", err)
	}
	w.budgetWaiting(false, t0.Add(2*bound))
	// Failing 10 s before the wait and 50 s after it: 60 s, the bound.
	if err := w.healthyAt(t0.Add(2*bound + 50*time.Second)); err != nil {
		t.Errorf("Healthy failing for the bound outside the wait = %v, want nil", err)
	}
	if err := w.healthyAt(t0.Add(2*bound + 51*time.Second)); err == nil {
		t.Error("Healthy failing past the bound outside the wait = nil, want the error")
	}
}

func mustNode(t *testing.T, name, ip string) Node {
	t.Helper()
	n, _ := FromNode(node(name, ip))
	return n
}
