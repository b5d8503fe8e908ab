package bench

import (
	"context"
	"sync"
	"time"

	"sigs.k8s.io/knftables"
)

// timedNFT is a knftables.Interface that measures how long the calls that run `nft`
// take, so a sync's time splits into `nft` (parse, netlink, kernel) and our own Go code.
type timedNFT struct {
	knftables.Interface

	mu    sync.Mutex
	busy  time.Duration
	calls int
	last  *knftables.Transaction
}

var _ knftables.Interface = &timedNFT{}

func (t *timedNFT) record(start time.Time, tx *knftables.Transaction) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.busy += time.Since(start)
	t.calls++
	if tx != nil {
		t.last = tx
	}
}

// Run runs the transaction and remembers it (for its size).
func (t *timedNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	defer t.record(time.Now(), tx)
	return t.Interface.Run(ctx, tx)
}

// List lists object names (a full sync lists chains and sets).
func (t *timedNFT) List(ctx context.Context, objectType string) ([]string, error) {
	defer t.record(time.Now(), nil)
	return t.Interface.List(ctx, objectType)
}

// take returns and resets what was measured since the last take.
func (t *timedNFT) take() (busy time.Duration, calls int, last *knftables.Transaction) {
	t.mu.Lock()
	defer t.mu.Unlock()
	busy, calls, last = t.busy, t.calls, t.last
	t.busy, t.calls, t.last = 0, 0, nil
	return busy, calls, last
}
