package bench

import (
	"runtime/metrics"
	"syscall"
	"time"
)

// rusageTimes are a process's CPU times so far.
type rusageTimes struct{ user, sys time.Duration }

// gcCycles is runtime/metrics' count of finished garbage collections.
const gcCycles = "/gc/cycles/total:gc-cycles"

// processCPU returns the process's CPU times (all threads, getrusage) and the number of
// garbage collections finished so far; both are cheap enough to read around one sync.
func processCPU() (rusageTimes, uint64) {
	var ru syscall.Rusage
	var t rusageTimes
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		t = rusageTimes{user: time.Duration(ru.Utime.Nano()), sys: time.Duration(ru.Stime.Nano())}
	}
	s := []metrics.Sample{{Name: gcCycles}}
	metrics.Read(s)
	var gcs uint64
	if s[0].Value.Kind() == metrics.KindUint64 {
		gcs = s[0].Value.Uint64()
	}
	return t, gcs
}
