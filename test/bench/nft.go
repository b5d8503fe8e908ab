package bench

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/shardproxy/shardproxy/tables"
	"sigs.k8s.io/knftables"
)

// timedNFT is a knftables.Interface that measures how long the calls that run `nft`
// take, so a sync's time splits into `nft` (parse, netlink, kernel) and our own Go code.
// Over a tables.ScriptRunner (tables.NewNFT) it is one too, so the instance streams its
// transactions to nft as it does in production, and the bytes streamed are counted.
type timedNFT struct {
	knftables.Interface

	mu       sync.Mutex
	busy     time.Duration
	calls    int
	last     *knftables.Transaction
	streamed int
	// script, when set, gets a copy of every script run (not checked): the bench keeps
	// the first full sync's, to time nft alone on the same input (runner.floor).
	script io.Writer
}

var _ tables.ScriptRunner = &timedNFT{}

// RunScript runs a streamed transaction through the wrapped ScriptRunner, counting its
// bytes; over an nft that cannot stream it fails, as the applier then uses Run.
func (t *timedNFT) RunScript(ctx context.Context, check bool, write func(io.Writer) error) error {
	sr, ok := t.Interface.(tables.ScriptRunner)
	if !ok {
		return errors.New("bench: the wrapped nft cannot run scripts")
	}
	defer t.record(time.Now(), nil)
	var n int
	err := sr.RunScript(ctx, check, func(w io.Writer) error {
		if t.script != nil && !check {
			w = io.MultiWriter(w, t.script)
		}
		return write(countingWriter{w: w, n: &n})
	})
	t.mu.Lock()
	t.streamed += n
	t.mu.Unlock()
	return err
}

// countingWriter counts what passes through it into n.
type countingWriter struct {
	w io.Writer
	n *int
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += n
	return n, err
}

// WriteString passes strings on without the copy io.WriteString makes for a writer
// that lacks it: the applier streams its script as strings, and the daemon, which
// writes them to nft's pipe directly, makes no such garbage.
func (c countingWriter) WriteString(s string) (int, error) {
	n, err := io.WriteString(c.w, s)
	*c.n += n
	return n, err
}

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

// take returns and resets what was measured since the last take: the time in nft, the
// calls, the last transaction run whole (nil if none) and the bytes streamed.
func (t *timedNFT) take() (busy time.Duration, calls int, last *knftables.Transaction, streamed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	busy, calls, last, streamed = t.busy, t.calls, t.last, t.streamed
	t.busy, t.calls, t.last, t.streamed = 0, 0, nil, 0
	return busy, calls, last, streamed
}

// timedApplier is a tables.Applier (the netlink writer of partial syncs) that measures
// how long its transactions take, encoding, the round trip and the kernel's commit,
// so a partial sync splits into the kernel's part and our own Go code.
type timedApplier struct {
	tables.Applier

	mu   sync.Mutex
	busy time.Duration
}

// Apply applies d through the wrapped Applier, timed.
func (t *timedApplier) Apply(ctx context.Context, d *tables.Diff) error {
	start := time.Now()
	err := t.Applier.Apply(ctx, d)
	t.mu.Lock()
	t.busy += time.Since(start)
	t.mu.Unlock()
	return err
}

// take returns the time spent since the last take.
func (t *timedApplier) take() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.busy
	t.busy = 0
	return b
}

// Close closes the wrapped Applier if it holds anything (the netlink socket).
func (t *timedApplier) Close() error {
	if c, ok := t.Applier.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
