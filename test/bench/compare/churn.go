package compare

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ChurnResult is what one proxy spent under a steady stream of endpoint changes
// (issue 13 item 4): the CPU its process used, per minute of churn, and how the changes
// were programmed meanwhile.
type ChurnResult struct {
	// Changes is the number of EndpointSlice updates made; Seconds how long they took.
	Changes int     `json:"changes"`
	Seconds float64 `json:"seconds"`
	// CPUSecondsPerMinute is the process's user + system CPU time over the churn, per
	// minute of churn.
	CPUSecondsPerMinute float64 `json:"cpuSecondsPerMinute"`
	// Syncs is the number of syncs (full + partial) the proxy ran meanwhile.
	Syncs int `json:"syncs"`
	// ProgrammingMeanSeconds is the mean network programming latency of the changes.
	ProgrammingMeanSeconds float64 `json:"networkProgrammingMeanSeconds"`
}

// churn changes one endpoint of a different Service every 1/ChurnRate seconds for
// ChurnDuration, as a steady rollout somewhere in the cluster would, and reads d's CPU
// time from /proc before and after. The updates are sent one at a time on a ticker: if
// the apiserver falls behind, fewer changes are made and Changes says so.
func (m *measurer) churn(ctx context.Context, d *daemon) (ChurnResult, error) {
	var res ChurnResult
	rate, duration := m.r.o.ChurnRate, m.r.o.ChurnDuration
	before, err := m.scrape(ctx, d)
	if err != nil {
		return res, err
	}
	cpu0, err := cpuSeconds(d.pid())
	if err != nil {
		return res, err
	}
	start := time.Now()
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for time.Since(start) < duration {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
		if err := m.changeEndpoint(ctx, m.nextService()); err != nil {
			return res, err
		}
		res.Changes++
	}
	cpu1, err := cpuSeconds(d.pid())
	if err != nil {
		return res, err
	}
	elapsed := time.Since(start)
	after, err := m.scrape(ctx, d)
	if err != nil {
		return res, err
	}
	res.Seconds = elapsed.Seconds()
	res.CPUSecondsPerMinute = (cpu1 - cpu0) / elapsed.Minutes()
	syncs := after.Histogram(metricPartialSync, d.series).Sub(before.Histogram(metricPartialSync, d.series)).Count +
		after.Histogram(metricFullSync, d.series).Sub(before.Histogram(metricFullSync, d.series)).Count
	res.Syncs = int(syncs)
	res.ProgrammingMeanSeconds = after.Histogram(metricProgramming, d.series).Sub(before.Histogram(metricProgramming, d.series)).Mean()
	m.r.logf("%s: churn: %d changes in %.1fs, %.2f CPU s/min, %d syncs, programming mean %.0fms",
		d.name, res.Changes, res.Seconds, res.CPUSecondsPerMinute, res.Syncs, res.ProgrammingMeanSeconds*1e3)
	return res, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// cpuSeconds reads a process's user + system CPU time (its threads included).
func cpuSeconds(pid int) (float64, error) {
	if pid == 0 {
		return 0, fmt.Errorf("process not running")
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(data))
}

// parseStatCPU returns utime + stime of a /proc/<pid>/stat line, in seconds. The
// command name (field 2) may hold spaces and parentheses, so fields are counted after
// its last ')'.
func parseStatCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat has %d fields after the command, want at least 13", len(f))
	}
	var ticks float64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat CPU field %q: %w", s, err)
		}
		ticks += float64(v)
	}
	return ticks / clockTicks, nil
}
