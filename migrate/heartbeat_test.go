package migrate

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestPublisherHeartbeatsOnlyWhileMigrating: with Heartbeat NodeStatus.Migrating (the
// supervisor's), an unchanged status is never rewritten in steady state, however long;
// a change is written at once; while Services are in shadow the status is rewritten
// every HeartbeatInterval, and once the shadow is gone the rewrites stop again.
func TestPublisherHeartbeatsOnlyWhileMigrating(t *testing.T) {
	c := newCluster(t)
	var writesMu sync.Mutex
	writes := 0
	count := func(k8stesting.Action) (bool, runtime.Object, error) {
		writesMu.Lock()
		defer writesMu.Unlock()
		writes++
		return false, nil, nil
	}
	c.client.PrependReactor("create", "configmaps", count)
	c.client.PrependReactor("update", "configmaps", count)
	written := func() int {
		writesMu.Lock()
		defer writesMu.Unlock()
		return writes
	}
	var shadowMu sync.Mutex
	var shadow []string
	setShadow := func(s ...string) {
		shadowMu.Lock()
		defer shadowMu.Unlock()
		shadow = s
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	pub := &Publisher{Client: c.client, Namespace: statusNS, Node: "node-1", Clock: clk, Heartbeat: NodeStatus.Migrating,
		Source: func() NodeStatus {
			shadowMu.Lock()
			defer shadowMu.Unlock()
			return NodeStatus{Instances: map[string]InstanceStatus{"team-a": {ProxyNames: []string{"team-a"}, Shadow: shadow}}}
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() { defer close(done); pub.Run(ctx) }()

	// advance steps the fake clock by d, 5 s at a time (each wakes the publisher's
	// 500 ms wait), each once the publisher waits on it (so it has acted on the
	// previous step).
	advance := func(d time.Duration) {
		t.Helper()
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			testutil.Eventually(t, 5*time.Second, "the publisher to wait", clk.HasWaiters)
			clk.Step(5 * time.Second)
		}
		testutil.Eventually(t, 5*time.Second, "the publisher to wait", clk.HasWaiters)
	}
	for _, step := range []struct {
		name      string
		shadow    []string
		for_      time.Duration
		wantTotal int
	}{
		{name: "first status, then steady state for 5 minutes", for_: 5 * time.Minute, wantTotal: 1},
		{name: "a move shadows a Service: written at once, then heartbeats", shadow: []string{"shop/web"}, for_: 95 * time.Second, wantTotal: 1 + 1 + 3},
		{name: "the shadow goes: written at once, then quiet", for_: 5 * time.Minute, wantTotal: 5 + 1},
	} {
		setShadow(step.shadow...)
		advance(step.for_)
		if got := written(); got != step.wantTotal {
			t.Fatalf("%s: %d writes in all, want %d", step.name, got, step.wantTotal)
		}
	}
}

// TestMoveFromSteadyStateWithoutHeartbeats: nodes that publish only on change (no
// migration under way, so no heartbeat) have statuses older than StaleAfter when a move
// starts; their Nodes are Ready, so the move waits for them rather than skipping them,
// and each writes as soon as it programs the shadow, which confirms the batch.
func TestMoveFromSteadyStateWithoutHeartbeats(t *testing.T) {
	c := newCluster(t, svc("shop", "web", ""), svc("shop", "cart", ""))
	for _, name := range []string{"node-1", "node-2"} {
		if _, err := c.client.CoreV1().Nodes().Create(context.Background(), nodeObject(name, corev1.ConditionTrue), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		startNode(t, c, &node{name: name, heartbeat: NodeStatus.Migrating})
	}
	waitStatus(t, c, 2)
	// managedFields times have whole seconds: 2 s is "stale" for sure after 3 s.
	const staleAfter = 2 * time.Second
	time.Sleep(staleAfter + time.Second)
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond,
		Timeout: 5 * time.Second, StaleAfter: staleAfter}
	m.defaults()
	before, serverNow, err := m.readStatuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range before {
		if m.live(st, serverNow) {
			t.Fatalf("%s's status is live before the move: it was rewritten without a change", st.Node)
		}
	}
	rep, err := m.Move(context.Background(), Selection{Namespace: "shop"}, "team-a")
	if err != nil || rep.Moved != 2 {
		t.Fatalf("move: %+v %v\n%s", rep, err, out.String())
	}
	t.Logf("move:\n%s", out.String())
}

// TestMoveWithinOneInstanceFromSteadyState: between two proxy names of one instance, a
// move changes nothing on the node, so its idle supervisor writes no status: its last
// one, stale by then, answers for it, and the move neither blocks on the Ready node nor
// finds "no live node".
func TestMoveWithinOneInstanceFromSteadyState(t *testing.T) {
	c := newCluster(t, svc("shop", "web", "team-a"), svc("shop", "cart", "team-a"))
	specs := []selector.Spec{{Name: "team-a", ProxyNames: []string{"team-a", "team-a-canary"}}}
	for _, name := range []string{"node-1", "node-2"} {
		if _, err := c.client.CoreV1().Nodes().Create(context.Background(), nodeObject(name, corev1.ConditionTrue), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		startNode(t, c, &node{name: name, heartbeat: NodeStatus.Migrating, specs: specs})
	}
	waitStatus(t, c, 2)
	const staleAfter = 2 * time.Second // managedFields times have whole seconds
	time.Sleep(staleAfter + time.Second)
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond,
		Timeout: 5 * time.Second, StaleAfter: staleAfter}
	rep, err := m.Move(context.Background(), Selection{Namespace: "shop"}, "team-a-canary")
	if err != nil || rep.Moved != 2 {
		t.Fatalf("move: %+v %v\n%s", rep, err, out.String())
	}
	if !strings.Contains(out.String(), "on 2 node(s) (node-1, node-2)") {
		t.Errorf("the move does not name the two nodes that answered:\n%s", out.String())
	}
}
