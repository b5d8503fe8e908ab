package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// WaitQuiet waits, at most max, until the CPUs were at least 85% idle over one second,
// and says how long it waited and whether they were. The kernel tears a deleted network
// namespace (or table) down in the background, minutes of CPU for 100,000s of elements;
// a measurement that overlaps it reads up to several times slower.
func WaitQuiet(ctx context.Context, max time.Duration) (time.Duration, bool) {
	start := time.Now()
	prevIdle, prevTotal, err := cpuTimes()
	for err == nil && time.Since(start) < max {
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-time.After(time.Second):
		}
		idle, total, e := cpuTimes()
		if e != nil {
			break
		}
		if total > prevTotal && float64(idle-prevIdle)/float64(total-prevTotal) >= 0.85 {
			return time.Since(start), true
		}
		prevIdle, prevTotal = idle, total
	}
	return time.Since(start), false
}

// cpuTimes returns the idle (idle + iowait) and total jiffies of all CPUs (/proc/stat).
func cpuTimes() (idle, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total, nil
}
