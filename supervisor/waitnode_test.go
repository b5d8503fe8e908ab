package supervisor

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestWaitForNodeRetriesWithBackoff: reading this Node at start is retried while the API
// server refuses it, spaced by nodeBackoff (growing, with jitter), and the Node is
// returned once it answers.
func TestWaitForNodeRetriesWithBackoff(t *testing.T) {
	client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	var gets atomic.Int32
	var times []time.Time
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		times = append(times, time.Now())
		if gets.Add(1) <= 3 {
			return true, nil, errors.New("the server is currently unable to handle the request")
		}
		return false, nil, nil
	})
	s := &Supervisor{deps: Deps{Client: client}, cfg: &config.Config{NodeName: "node-1"}, logger: klog.Background(), nodeChanged: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if n := s.waitForNode(ctx); n == nil || n.Name != "node-1" {
		t.Fatalf("waitForNode returned %v, want node-1", n)
	}
	if got := gets.Load(); got != 4 {
		t.Fatalf("%d reads, want 4 (3 refused)", got)
	}
	// At least 250 ms, 500 ms, 1 s apart (jitter only adds), and growing.
	var gaps []time.Duration
	for i, least := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second} {
		gaps = append(gaps, times[i+1].Sub(times[i]))
		if gaps[i] < least {
			t.Errorf("retry %d after %v, want at least %v", i+1, gaps[i], least)
		}
	}
	if gaps[0] >= gaps[2] {
		t.Errorf("retries %v apart: want them spaced out more and more", gaps)
	}

	b := nodeBackoff()
	if b.Jitter <= 0 || b.Factor <= 1 || b.Cap > 5*time.Second {
		t.Errorf("nodeBackoff %+v: want growing steps with jitter, capped within the 30 s wait", b)
	}
}
