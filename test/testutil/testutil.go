// Package testutil holds the helpers the tests of several packages share: polling for a
// condition, a clock moved by hand, the skip of real-kernel tests, network namespaces
// and a file copy, the live heap. It is an ordinary package, imported by _test files (and by the test
// topology in test/netns), never by the binary.
package testutil

import (
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond until it holds, failing t if it still does not after timeout.
// It polls every timeout/500, kept between 5ms and 100ms: fast enough for in-memory
// fixtures, cheap enough when each poll starts a process.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	interval := min(max(timeout/500, 5*time.Millisecond), 100*time.Millisecond)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(interval)
	}
	t.Fatalf("timed out after %v waiting for %s", timeout, what)
}

// Clock is a clock the test moves by hand; it satisfies any interface with a
// Now() time.Time method. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until moved.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Step moves the clock forward by d.
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// CIEnv is the environment variable that puts the tests in CI mode: .ci/run sets it to 1.
// In CI mode a test whose environment lacks something (root, a tool, etcd, a kernel
// module) fails with what is missing instead of skipping, so a broken machine cannot
// turn into a green line.
const CIEnv = "SHARDPROXY_CI"

// CI reports whether the tests run in CI mode (CIEnv set to 1).
func CI() bool {
	return os.Getenv(CIEnv) == "1"
}

// Unavailable ends a test whose environment lacks something it needs: it skips with the
// reason, or fails with it in CI mode.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("%s=1 (CI mode) and this test cannot run here: "+format, append([]any{CIEnv}, args...)...)
	}
	t.Skipf(format, args...)
}

// RequireKernel ends a real-kernel test where it cannot run: not root (network
// namespaces, nftables and conntrack need it; CI runs as root), -short, or one of tools
// not installed (make deps installs them). It skips, or fails in CI mode.
func RequireKernel(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "real-kernel test: needs root (CI runs as root)")
	}
	if testing.Short() {
		Unavailable(t, "real-kernel test: skipped with -short")
	}
	RequireTools(t, tools...)
}

// RequireTools ends a test that runs tools when one of them is not installed (make deps
// installs them): it skips, or fails in CI mode.
func RequireTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			Unavailable(t, "real-kernel test: %s is not installed (make deps installs it)", tool)
		}
	}
}

// CopyFile copies the file from to a new file to with permissions perm, failing t on
// any error.
func CopyFile(t testing.TB, from, to string, perm os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatalf("copying %s: %v", from, err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		t.Fatalf("copying %s: %v", from, err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatalf("copying %s to %s: %v", from, to, err)
	}
	if err := dst.Close(); err != nil {
		t.Fatalf("copying %s to %s: %v", from, to, err)
	}
}

// EmulatedEnv is the environment variable hack/kernels.sh's VM sets (to 1): the tests run
// on a kernel under software emulation, some 20 to 30 times slower than on the host.
const EmulatedEnv = "SHARDPROXY_EMULATED"

// Steps returns n, the length of a random walk whose every step runs nft, or a quarter
// of it (at least 1) under emulation (EmulatedEnv), where the full walk would take the
// guest's whole time budget. The host's real-kernel layer always walks all n.
func Steps(n int) int {
	if os.Getenv(EmulatedEnv) == "1" {
		return max(n/4, 1)
	}
	return n
}
