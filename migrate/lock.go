package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// LeaseName is the Lease, in the status namespace, that a `migrate move` or `rollback`
// holds while it runs: two runs interleaving their batches would each wait for shadows
// the other removes, and a rollback could hand back a Service a move is labeling.
const LeaseName = "shardproxy-migrate"

// DefaultLeaseDuration is how long a run's Lease stays held after its last renewal. A run
// that dies without releasing it (kill -9, a lost laptop) blocks the next one this long.
const DefaultLeaseDuration = 30 * time.Second

// Lock is the Lease that keeps two migrate runs from interleaving. Whether a held Lease
// has expired is judged, like a node status, on the API server's clock: by when the
// server last stored a change of it (its managedFields time, which every renewal moves),
// never by the renewTime a holder's clock wrote.
type Lock struct {
	Client kubernetes.Interface
	// Namespace holds the Lease: the status namespace.
	Namespace string
	// Holder names this run to the one that finds the Lease taken (who, where, what).
	Holder string
	// Duration: default DefaultLeaseDuration. The holder renews every third of it.
	Duration time.Duration
	// Clock is the API server's clock; default LocalClock(time.Now) (a fake clientset).
	Clock ServerClock
}

// HeldError is the answer to a run that finds the Lease held by another.
type HeldError struct {
	Namespace string
	// Holder is the other run's Holder.
	Holder string
	// Acquired is when it took the Lease, by its clock (zero if unknown).
	Acquired time.Time
	// Renewed is how long ago the API server stored its last renewal.
	Renewed time.Duration
	// Duration is the Lease's duration.
	Duration time.Duration
}

func (e *HeldError) Error() string {
	since := ""
	if !e.Acquired.IsZero() {
		since = " since " + e.Acquired.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("another migrate run holds the Lease %s/%s: %s%s (renewed %v ago); wait for it to finish, "+
		"or, if it died, for the Lease to expire %v after its last renewal",
		e.Namespace, LeaseName, e.Holder, since, e.Renewed.Round(time.Second), e.Duration)
}

func (l *Lock) defaults() {
	if l.Duration == 0 {
		l.Duration = DefaultLeaseDuration
	}
	if l.Clock == nil {
		l.Clock = LocalClock(time.Now)
	}
}

// Acquire takes the Lease: it creates it, or takes over one that was released or has
// expired; one another run holds is a *HeldError. The returned context is ctx, canceled
// when the Lease is lost (another run took it after renewals failed for its whole
// duration), with the reason as its cause; release stops renewing and deletes the Lease,
// and must be called.
func (l *Lock) Acquire(ctx context.Context) (context.Context, func(), error) {
	l.defaults()
	lease, err := l.take(ctx)
	if err != nil {
		return nil, nil, err
	}
	held, lose := context.WithCancelCause(ctx)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		l.renew(held, done, lose, lease)
	}()
	release := func() {
		close(done)
		<-stopped
		lose(nil)
		// Deleted with the last version renewed: a Lease another run took over is left alone.
		cur, err := l.Client.CoordinationV1().Leases(l.Namespace).Get(context.WithoutCancel(ctx), LeaseName, metav1.GetOptions{})
		if err != nil || cur.Spec.HolderIdentity == nil || *cur.Spec.HolderIdentity != l.Holder {
			return
		}
		uid, rv := cur.UID, cur.ResourceVersion
		if err := l.Client.CoordinationV1().Leases(l.Namespace).Delete(context.WithoutCancel(ctx), LeaseName,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}}); err != nil {
			klog.FromContext(ctx).Info("Releasing the migrate Lease failed; it expires on its own", "lease", l.Namespace+"/"+LeaseName,
				"duration", l.Duration, "err", err)
		}
	}
	return held, release, nil
}

// take creates the Lease or takes over a free one.
func (l *Lock) take(ctx context.Context) (*coordinationv1.Lease, error) {
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	now := metav1.NowMicro()
	secs := int32(l.Duration / time.Second)
	spec := coordinationv1.LeaseSpec{HolderIdentity: &l.Holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: l.Namespace}, Spec: spec}, metav1.CreateOptions{})
	if err == nil {
		return lease, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("taking the Lease %s/%s: %w", l.Namespace, LeaseName, err)
	}
	cur, err := leases.Get(ctx, LeaseName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the Lease %s/%s: %w", l.Namespace, LeaseName, err)
	}
	serverNow, err := l.Clock.ServerNow(ctx)
	if err != nil {
		return nil, err
	}
	if held := heldBy(cur, serverNow); held != nil {
		held.Namespace = l.Namespace
		return nil, held
	}
	cur.Spec = spec
	lease, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil, fmt.Errorf("taking over the expired Lease %s/%s: another run took it at the same moment; try again", l.Namespace, LeaseName)
	}
	if err != nil {
		return nil, fmt.Errorf("taking over the expired Lease %s/%s: %w", l.Namespace, LeaseName, err)
	}
	return lease, nil
}

// heldBy returns who holds lease at serverNow, nil when it is free: no holder, or its
// last renewal stored longer ago than its duration.
func heldBy(lease *coordinationv1.Lease, serverNow time.Time) *HeldError {
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return nil
	}
	d := DefaultLeaseDuration
	if lease.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}
	written := lastWritten(lease.ManagedFields)
	if written.IsZero() {
		// No time from the server: taken as just renewed, so that a Lease is never
		// taken from a live holder.
		written = serverNow
	}
	if serverNow.Sub(written) > d {
		return nil
	}
	h := &HeldError{Holder: *lease.Spec.HolderIdentity, Renewed: max(serverNow.Sub(written), 0), Duration: d}
	if lease.Spec.AcquireTime != nil {
		h.Acquired = lease.Spec.AcquireTime.Time
	}
	return h
}

// lastWritten is when the API server last stored a change of the object, by its clock.
func lastWritten(mfs []metav1.ManagedFieldsEntry) time.Time {
	var latest time.Time
	for _, mf := range mfs {
		if mf.Time != nil && mf.Time.After(latest) {
			latest = mf.Time.Time
		}
	}
	return latest
}

// errLeaseLost is the cause of the held context's end when the Lease was lost.
var errLeaseLost = errors.New("lost the migrate Lease")

// renew renews lease every third of the duration until done is closed. When it cannot
// renew for a whole duration, or finds the Lease another's, it cancels the run (lose):
// another run may take the Lease from then on.
func (l *Lock) renew(ctx context.Context, done <-chan struct{}, lose context.CancelCauseFunc, lease *coordinationv1.Lease) {
	logger := klog.FromContext(ctx)
	leases := l.Client.CoordinationV1().Leases(l.Namespace)
	t := time.NewTicker(l.Duration / 3)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := lease.DeepCopy()
		now := metav1.NowMicro()
		next.Spec.RenewTime = &now
		updated, err := leases.Update(ctx, next, metav1.UpdateOptions{})
		if err == nil {
			lease, renewed = updated, time.Now()
			continue
		}
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			cur, gerr := leases.Get(ctx, LeaseName, metav1.GetOptions{})
			if gerr == nil && cur.Spec.HolderIdentity != nil && *cur.Spec.HolderIdentity == l.Holder {
				lease = cur // our own write raced the read; renew from it next time
				continue
			}
			holder := "nobody (it was deleted)"
			if gerr == nil && cur.Spec.HolderIdentity != nil {
				holder = *cur.Spec.HolderIdentity
			}
			lose(fmt.Errorf("%w %s/%s: now held by %s", errLeaseLost, l.Namespace, LeaseName, holder))
			return
		}
		logger.Info("Renewing the migrate Lease failed; will retry", "lease", l.Namespace+"/"+LeaseName, "err", err)
		if time.Since(renewed) >= l.Duration {
			lose(fmt.Errorf("%w %s/%s: not renewed for %v: %w", errLeaseLost, l.Namespace, LeaseName, l.Duration, err))
			return
		}
	}
}
