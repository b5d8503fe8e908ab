package main

// defaultGCPercent is the supervisor's garbage collector target when GOGC is not set.
//
// Its heap is mostly long-lived (the API caches, the instances' models, the syncers'
// memory of every element), and its peak comes during full syncs, when the Go default
// (100: collect when the heap has grown by its live size since the last collection) lets
// it grow to twice that, and the runtime keeps about that much resident. 25 lets it grow
// by a quarter: a full sync's collections cost more CPU, but a node daemon's peak memory
// matters more than that CPU, and between full syncs the supervisor allocates little.
// README.md, "Performance", has the measured figures (bench-compare at 10,000 Services ×
// 10 endpoints, one run: peak RSS 338 MB at 50, 307 MB at 25).
const defaultGCPercent = 25

// tuneGC sets defaultGCPercent through setGCPercent unless the operator chose a value
// with GOGC; it reports the percent in force (-1: GOGC's own).
func tuneGC(getenv func(string) string, setGCPercent func(int) int) int {
	if getenv("GOGC") != "" {
		return -1
	}
	setGCPercent(defaultGCPercent)
	return defaultGCPercent
}
