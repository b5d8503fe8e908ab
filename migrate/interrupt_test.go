package migrate

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestInterruptedBatchGoesBack: an operator's Ctrl-C (the run's context canceled) never
// leaves a batch half done. Interrupted while the nodes confirm a batch, or while it is
// being annotated, the batch goes back where it was, without a shadow; interrupted while
// a confirmed batch is being labeled, that step finishes and no other batch starts. A
// rollback interrupted while it waits for the legacy proxy gives the batch back to the
// instance, whose shadow served it all along. The run's error says it was interrupted.
func TestInterruptedBatchGoesBack(t *testing.T) {
	shop := []string{"shop/a", "shop/b", "shop/c", "shop/d"}
	annotates := func(name string) func(patchRecord) bool {
		return func(p patchRecord) bool {
			return p.name == name && !labelPatch(p) && strings.Contains(p.body, `"shardproxy.io/shadow":"team-a"`)
		}
	}
	labels := func(name string) func(patchRecord) bool {
		return func(p patchRecord) bool { return p.name == name && labelPatch(p) }
	}
	for _, tc := range []struct {
		name     string
		rollback bool
		// unconfirmed are the Services the node never confirms (shadow, or hand-back).
		unconfirmed []string
		// cancelOn is the patch during which the operator interrupts; failIt makes that
		// patch fail as a real client's call does when its context ends.
		cancelOn func(patchRecord) bool
		failIt   bool
		// want is each Service's proxy-name label afterwards ("": none).
		want      map[string]string
		wantMoved int
	}{
		{name: "move interrupted while the nodes confirm a batch puts the batch back",
			unconfirmed: []string{"shop/c", "shop/d"}, cancelOn: annotates("shop/d"),
			want: map[string]string{"shop/a": "team-a", "shop/b": "team-a", "shop/c": "", "shop/d": ""}, wantMoved: 2},
		{name: "move interrupted while annotating a batch puts back what it annotated",
			cancelOn: annotates("shop/d"), failIt: true,
			want: map[string]string{"shop/a": "team-a", "shop/b": "team-a", "shop/c": "", "shop/d": ""}, wantMoved: 2},
		{name: "move interrupted while labeling a confirmed batch finishes it and starts no other",
			cancelOn: labels("shop/a"),
			want:     map[string]string{"shop/a": "team-a", "shop/b": "team-a", "shop/c": "", "shop/d": ""}, wantMoved: 2},
		{name: "rollback interrupted while waiting for the legacy proxy gives the batch back to the instance",
			rollback: true, unconfirmed: []string{"shop/c", "shop/d"}, cancelOn: labels("shop/d"),
			want: map[string]string{"shop/a": "", "shop/b": "", "shop/c": "team-a", "shop/d": "team-a"}, wantMoved: 2},
		{name: "rollback interrupted while stepping back puts back what it annotated",
			rollback: true, cancelOn: annotates("shop/c"), failIt: true,
			want: map[string]string{"shop/a": "", "shop/b": "", "shop/c": "team-a", "shop/d": "team-a"}, wantMoved: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			label := ""
			if tc.rollback {
				label = "team-a"
			}
			c := newCluster(t, svc("shop", "a", label), svc("shop", "b", label), svc("shop", "c", label), svc("shop", "d", label))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			c.client.PrependReactor("patch", "services", func(action k8stesting.Action) (bool, runtime.Object, error) {
				p := action.(k8stesting.PatchAction)
				rec := patchRecord{name: p.GetNamespace() + "/" + p.GetName(), body: string(p.GetPatch())}
				hit := false
				if tc.cancelOn(rec) {
					once.Do(func() { hit = true; cancel() })
				}
				if hit && tc.failIt {
					return true, nil, context.Canceled
				}
				return false, nil, nil
			})
			n := &node{name: "node-1"}
			if tc.rollback {
				n.legacy = func(s string) bool { return !slices.Contains(tc.unconfirmed, s) }
			} else {
				n.confirm = func(s string) bool { return !slices.Contains(tc.unconfirmed, s) }
			}
			startNode(t, c, n)
			testutil.Eventually(t, 5*time.Second, "the node's status", func() bool {
				st, err := ReadStatuses(context.Background(), c.client, statusNS)
				return err == nil && len(st) == 1
			})
			var out bytes.Buffer
			m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, BatchSize: 2, Poll: 5 * time.Millisecond,
				Timeout: time.Minute, LegacyTimeout: time.Minute}
			var rep Report
			var err error
			if tc.rollback {
				rep, err = m.Rollback(ctx, Selection{Namespace: "shop"}, "team-a", "")
			} else {
				rep, err = m.Move(ctx, Selection{Namespace: "shop"}, "team-a")
			}
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted") && !tc.failIt {
				t.Errorf("error %v, want one saying the run was interrupted", err)
			}
			if rep.Moved != tc.wantMoved {
				t.Errorf("moved %d, want %d", rep.Moved, tc.wantMoved)
			}
			for _, name := range shop {
				got, gerr := c.client.CoreV1().Services("shop").Get(context.Background(), strings.TrimPrefix(name, "shop/"), metav1.GetOptions{})
				if gerr != nil {
					t.Fatal(gerr)
				}
				if l := got.Labels[selector.LabelServiceProxyName]; l != tc.want[name] {
					t.Errorf("%s: proxy-name label %q, want %q", name, l, tc.want[name])
				}
				if _, ok := got.Labels[selector.LabelShadow]; ok || got.Annotations[selector.AnnotationShadow] != "" {
					t.Errorf("%s keeps a shadow: labels %v annotations %v", name, got.Labels, got.Annotations)
				}
			}
			t.Logf("%v\n%s", err, out.String())
		})
	}
}

// TestBatchSizeMustBePositive: a negative batch size is refused, not replaced.
func TestBatchSizeMustBePositive(t *testing.T) {
	c := newCluster(t, svc("shop", "a", ""))
	m := &Mover{Client: c.client, StatusNamespace: statusNS, BatchSize: -1}
	for name, run := range map[string]func() error{
		"move": func() error {
			_, err := m.Move(context.Background(), Selection{Namespace: "shop"}, "team-a")
			return err
		},
		"rollback": func() error {
			_, err := m.Rollback(context.Background(), Selection{Namespace: "shop"}, "team-a", "")
			return err
		},
	} {
		if err := run(); err == nil || !strings.Contains(err.Error(), "batch size -1: must be at least 1") {
			t.Errorf("%s with batch size -1: %v", name, err)
		}
	}
}

// TestLockKeepsRunsApart: a second run finds the Lease held and is told by whom; a Lease
// released, or not renewed for its duration by the API server's clock, is taken over;
// one renewed within its duration is not, whatever its holder's clock wrote.
func TestLockKeepsRunsApart(t *testing.T) {
	for _, tc := range []struct {
		name string
		// ago is how long before the second run the API server stored the first run's
		// last renewal (0: the first run holds it now).
		ago time.Duration
		// released: the first run released the Lease before the second started.
		released bool
		wantErr  string
	}{
		{name: "a held Lease refuses the second run and names the holder",
			wantErr: "another migrate run holds the Lease shardproxy-system/shardproxy-migrate: alice@laptop pid 1: migrate move --to team-a since "},
		{name: "a Lease renewed within its duration is still held", ago: 20 * time.Second,
			wantErr: "(renewed 20s ago)"},
		{name: "a Lease not renewed for its duration is taken over", ago: 31 * time.Second},
		{name: "a released Lease is taken", released: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			first := &Lock{Client: c.client, Namespace: statusNS, Holder: "alice@laptop pid 1: migrate move --to team-a"}
			_, release, err := first.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if tc.released {
				release()
			} else {
				// The first run "dies" here: its renewals stop; the test does not release.
				t.Cleanup(release)
			}
			serverNow := time.Now().Add(tc.ago)
			second := &Lock{Client: c.client, Namespace: statusNS, Holder: "bob@desk pid 2: migrate rollback --from team-a",
				Clock: LocalClock(func() time.Time { return serverNow })}
			ctx, release2, err := second.Acquire(context.Background())
			if tc.wantErr != "" {
				var held *HeldError
				if !errors.As(err, &held) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("second run: %v, want a HeldError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("second run: %v", err)
			}
			defer release2()
			if ctx.Err() != nil {
				t.Errorf("the second run's context ended at once: %v", context.Cause(ctx))
			}
			lease, err := c.client.CoordinationV1().Leases(statusNS).Get(context.Background(), LeaseName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := lease.Spec.HolderIdentity; h == nil || *h != second.Holder {
				t.Errorf("Lease holder %v, want %q", h, second.Holder)
			}
		})
	}
}

// TestLockRelease: releasing deletes the run's own Lease, and leaves one another run has
// taken over.
func TestLockRelease(t *testing.T) {
	c := newCluster(t)
	leases := c.client.CoordinationV1().Leases(statusNS)
	l := &Lock{Client: c.client, Namespace: statusNS, Holder: "me"}
	_, release, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	release()
	if _, err := leases.Get(context.Background(), LeaseName, metav1.GetOptions{}); err == nil {
		t.Errorf("the released Lease is still there")
	}

	_, release, err = l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lease, err := leases.Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := "someone else"
	lease.Spec.HolderIdentity = &other
	if _, err := leases.Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	release()
	got, err := leases.Get(context.Background(), LeaseName, metav1.GetOptions{})
	if err != nil || got.Spec.HolderIdentity == nil || *got.Spec.HolderIdentity != other {
		t.Errorf("release deleted or changed a Lease another run holds: %v %v", got, err)
	}
}
