package migrate

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// failingWrites makes the cluster's ConfigMap requests fail while down is set, and counts
// them.
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
	// Every request counts; while the API server is away, a write's first request (a
	// read, or an update of the object the last write returned) is also its last.
	c.client.PrependReactor("*", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
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

// TestPublisherWritesWithOneRequest: a node's status write is one update of the object
// its last write returned, as kube-proxy-sized API cost per node wants (it was a read and
// an update); the ConfigMap is read again only when that object is out of date (someone
// else wrote it: Conflict, as the API server answers) or gone.
func TestPublisherWritesWithOneRequest(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	var requests []string
	version := 0
	client.PrependReactor("*", "configmaps", func(action k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		requests = append(requests, action.GetVerb())
		mu.Unlock()
		if action.GetVerb() != "update" && action.GetVerb() != "create" {
			return false, nil, nil
		}
		// The API server's resourceVersions and optimistic concurrency, which the fake
		// tracker lacks.
		cm := action.(k8stesting.CreateAction).GetObject().(*corev1.ConfigMap)
		if action.GetVerb() == "update" {
			stored, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("configmaps"), cm.Namespace, cm.Name)
			if err != nil {
				return true, nil, err
			}
			if rv := stored.(*corev1.ConfigMap).ResourceVersion; rv != cm.ResourceVersion {
				return true, nil, apierrors.NewConflict(corev1.Resource("configmaps"), cm.Name, errors.New("the object has been modified"))
			}
		}
		mu.Lock()
		version++
		cm.ResourceVersion = strconv.Itoa(version)
		mu.Unlock()
		return false, nil, nil
	})
	pub := &Publisher{Client: client, Namespace: statusNS, Node: "node-1"}
	cms := client.CoreV1().ConfigMaps(statusNS)
	ctx := context.Background()
	for _, step := range []struct {
		name   string
		before func(t *testing.T)
		want   []string
	}{
		{name: "first write", want: []string{"get", "create"}},
		{name: "next write", want: []string{"update"}},
		{name: "another one", want: []string{"update"}},
		{name: "after someone else wrote it", before: func(t *testing.T) {
			cm, err := cms.Get(ctx, ConfigMapName("node-1"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cm.Annotations = map[string]string{"edited": "by hand"}
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, want: []string{"update", "get", "update"}},
		{name: "after it was deleted", before: func(t *testing.T) {
			if err := cms.Delete(ctx, ConfigMapName("node-1"), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, want: []string{"update", "get", "create"}},
		{name: "then again", want: []string{"update"}},
	} {
		if step.before != nil {
			step.before(t)
		}
		mu.Lock()
		requests = nil
		mu.Unlock()
		st := NodeStatus{Node: "node-1", Instances: map[string]InstanceStatus{"team-a": {Shadow: []string{step.name}}}}
		if err := pub.write(ctx, st); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		mu.Lock()
		got := slices.Clone(requests)
		mu.Unlock()
		if !slices.Equal(got, step.want) {
			t.Errorf("%s: requests %v, want %v", step.name, got, step.want)
		}
		statuses, err := ReadStatuses(ctx, client, statusNS)
		if err != nil || len(statuses) != 1 || !slices.Equal(statuses[0].Instances["team-a"].Shadow, []string{step.name}) {
			t.Errorf("%s: the stored status is %+v (%v)", step.name, statuses, err)
		}
	}
}
