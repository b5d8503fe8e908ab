package main

// defaultGCPercent is the supervisor's garbage collector target when GOGC is not set.
//
// Its heap is mostly long-lived (the API caches, the instances' models, the syncers'
// memory of every element), and its peak comes during full syncs, when the Go default
// (100: collect when the heap has doubled since the last collection) lets it grow to
// twice that. 50 trades a little CPU per full sync for a lower peak (README.md,
// "Performance", has the measured figures); a node daemon's memory limit matters more
// than that CPU.
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
