package soak

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// The supervisor's series the full-sync watch reads (metrics/metrics.go): a full sync
// observes the full-sync histogram once per family, a failed sync counts a failure per
// family; both carry the instance as proxy_instance.
const (
	fullSyncMetric    = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	syncFailureMetric = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	instanceLabel     = "proxy_instance"
	// fullSyncSampling is how often the watch reads /metrics: the precision of the
	// gaps it measures.
	fullSyncSampling = time.Second
)

// syncCounts are one instance's counters at one reading of /metrics.
type syncCounts struct {
	// Full counts full syncs (summed over families), Failed failed syncs.
	Full, Failed float64
}

// syncCountsOf reads every instance's counters from the supervisor's metrics; an
// instance without a full-sync series (not started yet) is left out.
func syncCountsOf(m env.Metrics, instances []string) map[string]syncCounts {
	out := map[string]syncCounts{}
	for _, inst := range instances {
		if !hasSeries(m, fullSyncMetric, inst) {
			continue
		}
		out[inst] = syncCounts{
			Full:   m.Value(fullSyncMetric, instanceLabel, inst),
			Failed: m.Value(syncFailureMetric, instanceLabel, inst),
		}
	}
	return out
}

func hasSeries(m env.Metrics, name, inst string) bool {
	fam, ok := m[name]
	if !ok {
		return false
	}
	for _, met := range fam.GetMetric() {
		for _, lp := range met.GetLabel() {
			if lp.GetName() == instanceLabel && lp.GetValue() == inst {
				return true
			}
		}
	}
	return false
}

// fullSyncGap is a time over the limit in which an instance completed no full sync.
type fullSyncGap struct {
	Instance string
	From, To time.Time
	// Ended says what ended it: "a full sync", "a failed sync", "kill -9 of the
	// supervisor", "the end of the soak".
	Ended string
}

func (g fullSyncGap) String() string {
	return fmt.Sprintf("instance %s completed no full sync for %v (%s to %s, ended by %s)",
		g.Instance, g.To.Sub(g.From).Round(time.Second), g.From.Format("15:04:05"), g.To.Format("15:04:05"), g.Ended)
}

// fullSyncWatch follows every instance's full syncs through the supervisor's metrics
// and records each time one came later than limit (2 × fullSyncPeriod) after the last:
// a periodic full sync is due fullSyncPeriod after the last full sync, and an instance
// that syncs at all (every syncPeriod at least) makes it then. The clock restarts at
// every full sync and at every failed sync (the retry, within 30 s of backoff, is full
// itself); it starts at a process's first full sync, not at its start (the first sync
// waits for the informers, which WaitHealthy bounds). A kill of the supervisor ends
// every instance's clock at the kill: a full sync held until the kill never completed,
// and a stall the kill cut short is measured up to it.
type fullSyncWatch struct {
	limit     time.Duration
	instances []string

	mu sync.Mutex
	// gen changes at every kill and start of the supervisor: a reading of /metrics
	// begun before one is dropped.
	gen     int
	running bool
	inst    map[string]*fullSyncClock
	gaps    []fullSyncGap
	longest map[string]time.Duration
	seen    map[string]int
	logf    func(format string, args ...any)
}

// fullSyncClock is one instance's state in the current process.
type fullSyncClock struct {
	counts syncCounts
	known  bool // counts were read in this process
	// since is when the clock started (zero: not yet in this process); warned says the
	// current gap was already logged as over the limit.
	since  time.Time
	warned bool
}

func newFullSyncWatch(limit time.Duration, instances []string, logf func(string, ...any)) *fullSyncWatch {
	w := &fullSyncWatch{limit: limit, instances: instances, longest: map[string]time.Duration{}, seen: map[string]int{}, logf: logf}
	w.reset()
	return w
}

func (w *fullSyncWatch) reset() {
	w.inst = map[string]*fullSyncClock{}
	for _, name := range w.instances {
		w.inst[name] = &fullSyncClock{}
	}
}

// generation is what a reading of /metrics passes back to observe.
func (w *fullSyncWatch) generation() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

// started says a supervisor process is starting: its counters begin at zero.
func (w *fullSyncWatch) started() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	w.running = true
	w.reset()
}

// stopped says the supervisor was killed at: every clock ends there.
func (w *fullSyncWatch) stopped(at time.Time, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	w.running = false
	for _, name := range w.instances {
		w.end(name, at, why)
	}
	w.reset()
}

// observe takes a reading of the counters made at `at`, begun in generation gen.
func (w *fullSyncWatch) observe(gen int, at time.Time, counts map[string]syncCounts) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen != w.gen || !w.running {
		return
	}
	for _, name := range w.instances {
		c, ok := counts[name]
		clock := w.inst[name]
		if ok {
			// A counter that went down belongs to an instance the supervisor restarted
			// (its series start again): read as a change, like an increase.
			full, failed := c.Full != clock.counts.Full, c.Failed != clock.counts.Failed
			if !clock.known {
				full, failed = c.Full > 0, c.Failed > 0
			}
			clock.counts, clock.known = c, true
			switch {
			case full:
				w.seen[name]++
				w.end(name, at, "a full sync")
			case failed:
				w.end(name, at, "a failed sync")
			}
			if full || failed {
				clock.since, clock.warned = at, false
				continue
			}
		}
		if !clock.since.IsZero() && at.Sub(clock.since) > w.limit && !clock.warned {
			clock.warned = true
			w.logf("full syncs: instance %s has completed none for %v (limit %v)", name, at.Sub(clock.since).Round(time.Second), w.limit)
		}
	}
}

// end closes the instance's current gap at `at`, ended by why.
func (w *fullSyncWatch) end(name string, at time.Time, why string) {
	clock := w.inst[name]
	if clock.since.IsZero() {
		return
	}
	gap := at.Sub(clock.since)
	w.longest[name] = max(w.longest[name], gap)
	if gap > w.limit {
		g := fullSyncGap{Instance: name, From: clock.since, To: at, Ended: why}
		w.gaps = append(w.gaps, g)
		w.logf("full syncs: %v; limit %v", g, w.limit)
	}
	clock.since = time.Time{}
}

// ages says, for each instance, how long ago its clock started ("-" if not yet).
func (w *fullSyncWatch) ages(at time.Time) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, name := range w.instances {
		age := "-"
		if c := w.inst[name]; !c.since.IsZero() {
			age = at.Sub(c.since).Round(time.Second).String()
		}
		out = append(out, name+" "+age)
	}
	return strings.Join(out, ", ")
}

// finish ends every clock at the end of the soak and returns the watch's findings.
func (w *fullSyncWatch) finish(at time.Time) FullSyncs {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running {
		for _, name := range w.instances {
			w.end(name, at, "the end of the soak")
		}
		w.running = false
		w.gen++
	}
	return FullSyncs{Limit: w.limit, Instances: slices.Clone(w.instances), Longest: maps.Clone(w.longest), Seen: maps.Clone(w.seen), Gaps: slices.Clone(w.gaps)}
}

// watch reads /metrics every fullSyncSampling until the returned function is called.
func (w *fullSyncWatch) watch(ctx context.Context, e *env.Env) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sleep(ctx, fullSyncSampling) == nil {
			gen := w.generation()
			m, err := e.Metrics(ctx)
			if err != nil {
				continue
			}
			w.observe(gen, time.Now(), syncCountsOf(m, w.instances))
		}
	}()
	return func() { cancel(); <-done }
}

// FullSyncs is what the full-sync watch found.
type FullSyncs struct {
	Limit     time.Duration
	Instances []string
	// Longest is each instance's longest time between full syncs (or from its last
	// one to a kill or the end), Seen how many full syncs it completed.
	Longest map[string]time.Duration
	Seen    map[string]int
	// Gaps are the times over Limit.
	Gaps []fullSyncGap
}

// String is the summary's line (after "SOAK "): gaps over the limit, then each
// instance's longest gap and full syncs seen.
func (f FullSyncs) String() string {
	var each []string
	for _, name := range f.Instances {
		each = append(each, fmt.Sprintf("%s %v (%d seen)", name, f.Longest[name].Round(time.Second), f.Seen[name]))
	}
	return fmt.Sprintf("full syncs: %d gaps over %v (2 × fullSyncPeriod); longest gap: %s", len(f.Gaps), f.Limit, strings.Join(each, ", "))
}

// Problems are the gaps over the limit, and an instance with no full sync seen.
func (f FullSyncs) Problems() []string {
	var out []string
	for _, g := range f.Gaps {
		out = append(out, fmt.Sprintf("full sync: %v; limit %v (2 × fullSyncPeriod)", g, f.Limit))
	}
	for _, name := range f.Instances {
		if f.Seen[name] == 0 {
			out = append(out, fmt.Sprintf("full sync: instance %s completed none the soak saw", name))
		}
	}
	return out
}
