package main

// defaultGCPercent is the supervisor's garbage collector target when GOGC is not set.
//
// Its heap is mostly long-lived (the API caches, the instances' models, the syncers'
// memory of every element), and its peak comes during full syncs, when the Go default
// (100: collect when the heap has doubled since the last collection) lets it grow to
// twice that. Measured with bench-compare at 10,000 Services × 10 endpoints: peak RSS
// 332–358 MB at 100, 321 MB at 50, for a first full sync 0.1–0.2 s longer (2.8 s).
// A node daemon's memory limit matters more than that CPU.
const defaultGCPercent = 50

// tuneGC sets defaultGCPercent through setGCPercent unless the operator chose a value
// with GOGC; it reports the percent in force (-1: GOGC's own).
func tuneGC(getenv func(string) string, setGCPercent func(int) int) int {
	if getenv("GOGC") != "" {
		return -1
	}
	setGCPercent(defaultGCPercent)
	return defaultGCPercent
}
