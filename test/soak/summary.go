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
	"github.com/shardproxy/shardproxy/test/measure"
)

// checkpointResult is one checkpoint's outcome.
type checkpointResult struct {
	Name string
	// Converged is how long the kernel took to equal the rendered tables once changes
	// and faults had stopped; Mismatch lists the differences that remained.
	Converged time.Duration
	Mismatch  []string
	// RSS (bytes) and Goroutines of the supervisor at the checkpoint.
	RSS        int64
	Goroutines int
}

// convergeTimeout bounds how long a checkpoint waits for the kernel to equal the render:
// a chain flushed or an element removed by hand is repaired by the next full sync.
const convergeTimeout = 2*fullSyncPeriod + 30*time.Second

// checkpoint stops changes and faults, waits for every instance to report synced, and
// compares every instance's tables with render's.
func (s *soak) checkpoint(ctx context.Context, name string) error {
	s.quiesce.Lock()
	defer s.quiesce.Unlock()
	start := time.Now()
	s.logf("checkpoint %s: changes and faults paused", name)
	if err := s.check.waitSynced(ctx, 3*time.Minute); err != nil {
		return fmt.Errorf("checkpoint %s: %w", name, err)
	}
	want, _, err := s.check.expected(ctx)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", name, err)
	}
	res := checkpointResult{Name: name}
	for {
		diffs, err := s.check.compare(ctx, want)
		if err != nil {
			return fmt.Errorf("checkpoint %s: %w", name, err)
		}
		if len(diffs) == 0 {
			break
		}
		if time.Since(start) > convergeTimeout {
			for _, k := range slices.SortedFunc(maps.Keys(diffs), func(a, b tableKey) int { return strings.Compare(a.String(), b.String()) }) {
				res.Mismatch = append(res.Mismatch, "table "+k.String()+": "+strings.Join(diffs[k], "\n    "))
			}
			break
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	res.Converged = time.Since(start)
	res.RSS, res.Goroutines = s.res.now(ctx, s.e)
	s.mu.Lock()
	s.checkpoints = append(s.checkpoints, res)
	s.mu.Unlock()
	if len(res.Mismatch) > 0 {
		s.logf("checkpoint %s: MISMATCH after %v:\n  %s\nsupervisor log (end):\n%s", name, res.Converged.Round(time.Millisecond),
			strings.Join(res.Mismatch, "\n  "), lastLines(s.e.SupervisorLog(), 30))
		return nil
	}
	s.logf("checkpoint %s: kernel = render for %d instances × 2 families (%d Services in the API) in %v; supervisor RSS %s, %d goroutines",
		name, len(s.instances), len(s.churn.services), res.Converged.Round(time.Millisecond), mb(res.RSS), res.Goroutines)
	return nil
}

// resources samples the supervisor's memory and goroutines.
type resources struct {
	mu             sync.Mutex
	peakRSS        int64
	peakGoroutines int
}

// sample reads the supervisor's resources every 2s until the returned function is called.
func (r *resources) sample(ctx context.Context, e *env.Env) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sleep(ctx, 2*time.Second) == nil {
			r.now(ctx, e)
		}
	}()
	return func() { cancel(); <-done }
}

// now reads the supervisor's current RSS and goroutines and updates the peaks; its
// peak RSS counts too (VmHWM), so a spike between samples is not missed.
func (r *resources) now(ctx context.Context, e *env.Env) (rss int64, goroutines int) {
	pid := e.SupervisorPid()
	if pid == 0 {
		return 0, 0
	}
	mem, err := measure.ReadMemory(pid)
	if err != nil {
		return 0, 0
	}
	rss, hwm := mem.RSS, mem.PeakRSS
	if m, err := e.Metrics(ctx); err == nil {
		goroutines = int(m.Value("go_goroutines"))
	}
	r.mu.Lock()
	r.peakRSS = max(r.peakRSS, hwm)
	r.peakGoroutines = max(r.peakGoroutines, goroutines)
	r.mu.Unlock()
	return rss, goroutines
}

// Growth bounds between the first and the last checkpoint with churn (the supervisor
// may have been restarted in between; both are measured at rest).
const (
	rssGrowthFactor      = 1.5
	rssGrowthSlack       = 32 << 20
	goroutineGrowth      = 1.25
	goroutineGrowthSlack = 25
)

// Summary is what a soak did and found.
type Summary struct {
	Seed        uint64
	Duration    time.Duration
	Checkpoints []checkpointResult
	Changes     map[string]int
	Faults      map[string]int
	// NoEffect counts the faults that changed nothing, by kind: not in Faults.
	NoEffect      map[string]int
	FaultErrors   []string
	FaultsPerKind int
	// Kinds are the kinds of fault the soak injected.
	Kinds           []string
	Probes          []probeResult
	ProbesPaused    time.Duration
	PeakRSS         int64
	PeakGoroutines  int
	ResourceProblem string
	FullSyncs       FullSyncs
}

func (s *soak) summary() *Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := &Summary{
		Seed: s.opts.Seed, Duration: s.opts.Duration, Checkpoints: slices.Clone(s.checkpoints),
		Changes: s.churn.Applied(), Faults: maps.Clone(s.faults), NoEffect: maps.Clone(s.noEffect), FaultErrors: slices.Clone(s.faultErrors),
		FaultsPerKind: s.opts.FaultsPerKind, Kinds: s.kinds(), Probes: s.probes.Results(), ProbesPaused: s.probes.Paused(),
		PeakRSS: s.res.peakRSS, PeakGoroutines: s.res.peakGoroutines, FullSyncs: s.fullSyncs,
	}
	// The "start" checkpoint precedes any churn; growth is judged from the first one after.
	if len(sum.Checkpoints) >= 3 {
		first, last := sum.Checkpoints[1], sum.Checkpoints[len(sum.Checkpoints)-1]
		if float64(last.RSS) > float64(first.RSS)*rssGrowthFactor+rssGrowthSlack {
			sum.ResourceProblem += fmt.Sprintf("RSS grew from %s to %s; ", mb(first.RSS), mb(last.RSS))
		}
		if float64(last.Goroutines) > float64(first.Goroutines)*goroutineGrowth+goroutineGrowthSlack {
			sum.ResourceProblem += fmt.Sprintf("goroutines grew from %d to %d; ", first.Goroutines, last.Goroutines)
		}
	}
	return sum
}

// Problems lists why the soak failed; none means it passed.
func (sum *Summary) Problems() []string {
	var out []string
	for _, c := range sum.Checkpoints {
		if len(c.Mismatch) > 0 {
			out = append(out, "checkpoint "+c.Name+": the kernel differs from render")
		}
	}
	for _, p := range sum.Probes {
		if p.Failed > 0 {
			out = append(out, fmt.Sprintf("steady probe %s: %d failed: %s", p.Name, p.Failed, strings.Join(p.Errors, "; ")))
		}
	}
	for _, kind := range sum.Kinds {
		if sum.Faults[kind] < sum.FaultsPerKind {
			msg := fmt.Sprintf("fault %s injected %d times, want %d", kind, sum.Faults[kind], sum.FaultsPerKind)
			if n := sum.NoEffect[kind]; n > 0 {
				msg += fmt.Sprintf(" (%d more changed nothing)", n)
			}
			out = append(out, msg)
		}
	}
	out = append(out, sum.FullSyncs.Problems()...)
	out = append(out, sum.FaultErrors...)
	if sum.ResourceProblem != "" {
		out = append(out, sum.ResourceProblem)
	}
	return out
}

// String is the summary as `make soak` prints it.
func (sum *Summary) String() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, "SOAK "+format+"\n", args...) }
	p("seed %d (SOAK_SEED=%d replays it), %v of changes and faults", sum.Seed, sum.Seed, sum.Duration)
	passed, slowest := 0, time.Duration(0)
	for _, c := range sum.Checkpoints {
		if len(c.Mismatch) == 0 {
			passed++
		}
		slowest = max(slowest, c.Converged)
	}
	p("checkpoints: %d passed, %d mismatched (kernel = render for every instance and family; slowest convergence %v)",
		passed, len(sum.Checkpoints)-passed, slowest.Round(time.Millisecond))
	p("%s", sum.FullSyncs)
	total := 0
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(sum.Changes)) {
		total += sum.Changes[k]
		kinds = append(kinds, fmt.Sprintf("%s %d", k, sum.Changes[k]))
	}
	p("changes applied: %d (%s)", total, strings.Join(kinds, ", "))
	var faults []string
	for _, k := range sum.Kinds {
		faults = append(faults, fmt.Sprintf("%s %d", k, sum.Faults[k]))
	}
	noEffect := 0
	var noEffectKinds []string
	for _, k := range sum.Kinds {
		if n := sum.NoEffect[k]; n > 0 {
			noEffect += n
			noEffectKinds = append(noEffectKinds, fmt.Sprintf("%s %d", k, n))
		}
	}
	noEffectDetail := ""
	if noEffect > 0 {
		noEffectDetail = ": " + strings.Join(noEffectKinds, ", ")
	}
	p("faults injected: %s (want ≥ %d each; %d failed to inject; %d changed nothing, not counted%s)",
		strings.Join(faults, ", "), sum.FaultsPerKind, len(sum.FaultErrors), noEffect, noEffectDetail)
	ok, failed := 0, 0
	for _, pr := range sum.Probes {
		ok += pr.OK
		failed += pr.Failed
		p("  steady %s: %d connections, %d failed", pr.Name, pr.OK+pr.Failed, pr.Failed)
	}
	p("steady connections: %d, failed: %d (probes paused %v in all while conntrack was full)", ok+failed, failed, sum.ProbesPaused.Round(time.Second))
	rest := "fewer than two checkpoints with churn: no growth measured"
	if n := len(sum.Checkpoints); n >= 3 {
		first, last := sum.Checkpoints[1], sum.Checkpoints[n-1]
		rest = fmt.Sprintf("at rest: first checkpoint %s / %d goroutines, last %s / %d (bound: RSS ≤ %.1f× + %s, goroutines ≤ %.2f× + %d)",
			mb(first.RSS), first.Goroutines, mb(last.RSS), last.Goroutines, rssGrowthFactor, mb(rssGrowthSlack), goroutineGrowth, goroutineGrowthSlack)
	}
	p("supervisor: peak RSS %s, peak goroutines %d; %s", mb(sum.PeakRSS), sum.PeakGoroutines, rest)
	if problems := sum.Problems(); len(problems) > 0 {
		p("FAIL:\n  %s", strings.Join(problems, "\n  "))
	} else {
		p("PASS")
	}
	return b.String()
}

func mb(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/(1<<20)) }

// kinds are the fault kinds this soak injects.
func (s *soak) kinds() []string {
	if len(s.opts.Faults) == 0 {
		return faultKinds
	}
	return slices.DeleteFunc(slices.Clone(faultKinds), func(k string) bool { return !slices.Contains(s.opts.Faults, k) })
}
