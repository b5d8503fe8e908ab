package nodeaddrs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// DefaultLeaseName is the Lease the writers elect their leader with, in the ConfigMap's
// namespace.
const DefaultLeaseName = "shardproxy-node-addresses"

// Election are the leader election's settings; zero fields take client-go's usual
// values (15 s lease, 10 s renew deadline, 2 s retry).
type Election struct {
	// Identity names this writer in the Lease (its pod's name); required.
	Identity string
	// LeaseName; default DefaultLeaseName.
	LeaseName                                 string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// RunElected runs w while it holds the Lease, in w's namespace, until ctx ends: a
// standby writer waits for the Lease, and a leader that loses it stops writing and
// stands by again. The Lease is released when ctx ends, so that a stopped leader's
// successor takes over at once rather than after LeaseDuration. On becoming leader a
// writer publishes the whole list (Run).
//
// A writer that stops while it leads (Run returns: its first lists not in within
// SyncTimeout, say) releases the Lease, so that a standby takes over, and RunElected
// returns an error: the process exits and its Deployment restarts it. It returns nil
// only when ctx ends.
func RunElected(ctx context.Context, w *Writer, e Election) error {
	if e.Identity == "" {
		return errors.New("running the node address writer: leader election needs an identity")
	}
	if w.Namespace == "" {
		return errNoNamespace
	}
	if e.LeaseName == "" {
		e.LeaseName = DefaultLeaseName
	}
	if e.LeaseDuration <= 0 {
		e.LeaseDuration = 15 * time.Second
	}
	if e.RenewDeadline <= 0 {
		e.RenewDeadline = 10 * time.Second
	}
	if e.RetryPeriod <= 0 {
		e.RetryPeriod = 2 * time.Second
	}
	if w.Logger.GetSink() == nil {
		w.Logger = klog.Background()
	}
	lease := w.Namespace + "/" + e.LeaseName
	logger := w.Logger.WithValues("lease", lease, "identity", e.Identity)
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, w.Namespace, e.LeaseName,
		w.Client.CoreV1(), w.Client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: e.Identity})
	if err != nil {
		return fmt.Errorf("creating the lock of Lease %s: %w", lease, err)
	}
	for {
		// electCtx ends with ctx, or when the writer stops while leading: the elector
		// then stops renewing and releases the Lease (ReleaseOnCancel).
		electCtx, stopElecting := context.WithCancel(ctx)
		// The writer's result; sent once, by the callback Run starts on its own
		// goroutine, when the writer returns.
		result := make(chan error, 1)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: e.LeaseDuration, RenewDeadline: e.RenewDeadline, RetryPeriod: e.RetryPeriod,
			ReleaseOnCancel: true, Name: e.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					logger.Info("Leading: publishing the Nodes' addresses")
					w.setLeading(true)
					err := w.Run(lctx)
					w.setLeading(false)
					if lctx.Err() == nil {
						// Stopped while leading: nothing publishes, so hand the Lease on.
						if err == nil {
							err = errors.New("the writer returned")
						}
						logger.Error(err, "The writer stopped while leading; releasing the Lease")
						err = fmt.Errorf("the node address writer stopped while leading; Lease %s released: %w", lease, err)
						stopElecting()
					}
					result <- err
				},
				OnStoppedLeading: func() {},
				OnNewLeader: func(id string) {
					if id != e.Identity {
						logger.Info("Standing by", "leader", id)
					}
				},
			},
		})
		if err != nil {
			stopElecting()
			return fmt.Errorf("starting the leader election on Lease %s: %w", lease, err)
		}
		le.Run(electCtx)
		stopElecting()
		if ctx.Err() != nil {
			// Stopped: a writer started returns at once (its context is ctx's), and
			// writes nothing more.
			return nil
		}
		// Run returned with ctx alive: it had the Lease (it returns early only when its
		// context ends, which before it leads only ctx's end does) and lost it, or the
		// writer stopped. Wait until the writer has stopped, so that it writes nothing
		// while another leads.
		if err := <-result; err != nil {
			return err
		}
		logger.Info("Lost the Lease; standing by")
	}
}
