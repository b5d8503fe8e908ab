package supervisor

import "sync"

// DefaultGCPercent is the supervisor's garbage collector target when GOGC is not set.
//
// Its heap is mostly long-lived (the API caches, the instances' models, the syncers'
// memory of every element), and its peak comes during full syncs, when the Go default
// (100: collect when the heap has grown by its live size since the last collection) lets
// it grow to twice that, and the runtime keeps about that much resident. 25 lets it grow
// by a quarter: a full sync's collections cost more CPU, but a node daemon's peak memory
// matters more than that CPU, and between full syncs the supervisor allocates little.
// docs/performance.md has the measured figures (bench-compare at 10,000 Services ×
// 10 endpoints, one run: peak RSS 338 MB at 50, 307 MB at 25).
const DefaultGCPercent = 25

// FullSyncGCPercent is the target while any instance runs a full sync (gcTarget): the
// peak comes at the end of one, with the models, the ledger and the transaction built
// beside the caches, and most of what it allocates before is garbage.
// docs/performance.md, fourth round: the largest part of 447.5 -> 337.6 MB of peak RSS at
// 30,000 Services × 5, for a first full sync 0.7 s longer (7.4 -> 8.1 s).
const FullSyncGCPercent = 10

// TuneGC sets DefaultGCPercent through setGCPercent unless the operator chose a value
// with GOGC; it reports the percent in force (-1: GOGC's own).
func TuneGC(getenv func(string) string, setGCPercent func(int) int) int {
	if getenv("GOGC") != "" {
		return -1
	}
	setGCPercent(DefaultGCPercent)
	return DefaultGCPercent
}

// gcTarget lowers the collector's target to FullSyncGCPercent while at least one full
// sync runs, and sets it back to DefaultGCPercent when the last one ends.
type gcTarget struct {
	set     func(int) int
	mu      sync.Mutex
	running int
}

// NewGCTarget returns the full syncs' hook (instance.Options.FullSync) for the percent
// TuneGC put in force: nil when the operator chose GOGC, which stays as it is.
func NewGCTarget(percent int, setGCPercent func(int) int) func() func() {
	if percent < 0 {
		return nil
	}
	return (&gcTarget{set: setGCPercent}).fullSync
}

// fullSync records a full sync starting and returns the function recording its end.
func (g *gcTarget) fullSync() (done func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running++; g.running == 1 {
		g.set(FullSyncGCPercent)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.running--; g.running == 0 {
				g.set(DefaultGCPercent)
			}
		})
	}
}
