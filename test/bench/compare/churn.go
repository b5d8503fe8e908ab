package compare

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/shardproxy/shardproxy/test/measure"
)

// ChurnResult is what one proxy spent under a steady stream of endpoint changes
// (issue 13 item 4): the CPU its process used, per minute of churn, and how the changes
// were programmed meanwhile.
type ChurnResult struct {
	// Changes is the number of EndpointSlice updates made; Seconds how long they took.
	Changes int     `json:"changes"`
	Seconds float64 `json:"seconds"`
	// CPUSecondsPerMinute is the user + system CPU time of the process and its children
	// (kube-proxy's nft) over the churn, per minute of churn.
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
	// Every sync observes every family (syncs counts one); the changes are programmed in
	// their Services' families.
	var prog Histogram
	for _, fam := range m.families() {
		h := after.Histogram(metricProgramming, d.in(fam)).Sub(before.Histogram(metricProgramming, d.in(fam)))
		prog.Count, prog.Sum = prog.Count+h.Count, prog.Sum+h.Sum
	}
	res.ProgrammingMeanSeconds = prog.Mean()
	m.r.logf("%s: churn: %d changes in %.1fs, %.2f CPU s/min, %d syncs, programming mean %.0fms",
		d.name, res.Changes, res.Seconds, res.CPUSecondsPerMinute, res.Syncs, res.ProgrammingMeanSeconds*1e3)
	return res, nil
}

// cpuSeconds reads the CPU time (user + system) of a process and its children: its
// own threads', its reaped children's (cutime, cstime) and its live children's. The
// children count because kube-proxy does its nftables work in `nft` child processes,
// where the kernel's cost of a transaction lands; a child live at one reading and
// reaped by the next moves from the live sum to cutime/cstime whole, so the
// difference of two readings is what was spent between them.
func cpuSeconds(pid int) (float64, error) {
	if pid == 0 {
		return 0, fmt.Errorf("process not running")
	}
	st, err := measure.ReadStat(pid)
	if err != nil {
		return 0, err
	}
	total := st.CPU + st.ChildrenCPU
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cs, err := measure.ReadStat(child); err == nil && cs.PPid == pid { // an error: it exited meanwhile
			total += cs.CPU
		}
	}
	return total.Seconds(), nil
}
