package migrate

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// failingWrites makes the cluster's ConfigMap reads fail while down is set, and counts
// the attempts.
type failingWrites struct {
	mu       sync.Mutex
	down     bool
	attempts int
}

func (f *failingWrites) set(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

func (f *failingWrites) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts
}

// TestPublisherBacksOffOnFailures: while the API server refuses the status writes, the
// publisher retries after 0.5 s, 1 s, 2 s ... up to 10 s between attempts, not every
// poll; a successful write starts the backoff over. The clock is a fake, stepped only
// while the publisher waits on it.
func TestPublisherBacksOffOnFailures(t *testing.T) {
	c := newCluster(t)
	f := &failingWrites{down: true}
	c.client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.attempts++
		if f.down {
			return true, nil, errors.New("the API server is away")
		}
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	backoff := PublishBackoff(500 * time.Millisecond)
	backoff.Jitter = 0
	version := 0
	var versionMu sync.Mutex
	pub := &Publisher{Client: c.client, Namespace: statusNS, Node: "node-1", Clock: clk, Backoff: &backoff,
		Source: func() NodeStatus {
			versionMu.Lock()
			defer versionMu.Unlock()
			return NodeStatus{Instances: map[string]InstanceStatus{"team-a": {Shadow: make([]string, version)}}}
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() { defer close(done); pub.Run(ctx) }()

	// nextAttempt steps the fake clock, 100 ms at a time and only while the publisher
	// waits on it, until it attempts another write; it returns the fake time that took.
	nextAttempt := func() time.Duration {
		t.Helper()
		start, before := clk.Now(), f.count()
		for {
			testutil.Eventually(t, 5*time.Second, "the publisher to wait", clk.HasWaiters)
			if f.count() != before {
				break
			}
			if clk.Since(start) > time.Minute {
				t.Fatalf("no attempt within a minute (%d so far)", before)
			}
			clk.Step(100 * time.Millisecond)
		}
		return clk.Since(start)
	}
	testutil.Eventually(t, 5*time.Second, "the first attempt", func() bool { return f.count() == 1 })
	var gaps []time.Duration
	for range 7 {
		gaps = append(gaps, nextAttempt())
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	if !slices.Equal(gaps, want) {
		t.Errorf("gaps between failed attempts: %v, want %v", gaps, want)
	}

	// The API server is back: the next attempt succeeds, and nothing is written again
	// while nothing changes.
	f.set(false)
	nextAttempt()
	settled := f.count()
	for range 20 {
		testutil.Eventually(t, 5*time.Second, "the publisher to wait", clk.HasWaiters)
		clk.Step(100 * time.Millisecond)
	}
	testutil.Eventually(t, 5*time.Second, "the publisher to wait", clk.HasWaiters)
	if got := f.count(); got != settled {
		t.Errorf("%d writes of an unchanged status", got-settled)
	}

	// Down again: the backoff starts over from its first step.
	f.set(true)
	versionMu.Lock()
	version++
	versionMu.Unlock()
	nextAttempt()
	if gap := nextAttempt(); gap != 500*time.Millisecond {
		t.Errorf("after a success the first retry came after %v, want 500ms", gap)
	}
}
