package bench

import (
	"context"
	"testing"
	"time"
)

func TestCPUTimes(t *testing.T) {
	idle, total, err := cpuTimes()
	if err != nil || total == 0 || idle > total {
		t.Errorf("cpuTimes = %d, %d, %v; want idle <= total, total > 0", idle, total, err)
	}
}

func TestWaitQuietIsBounded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if waited, quiet := WaitQuiet(ctx, time.Minute); quiet || waited > 5*time.Second {
		t.Errorf("WaitQuiet with a done context: waited %v, quiet %v; want at once, not quiet", waited, quiet)
	}
}
