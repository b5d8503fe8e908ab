// Package e2e runs the real `shardproxy run` binary against a real kube-apiserver, in a
// node network namespace, and sends real traffic through it. Root only (CI is root).
package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// shared is the environment every scenario uses: starting one takes seconds, and the
// scenarios use distinct namespaces and addresses so they do not disturb each other.
var shared *env.Env

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if os.Geteuid() != 0 || testing.Short() {
		if testutil.CI() {
			fmt.Printf("e2e: %s=1 (CI mode) but not root or -short: the e2e layer cannot run\n", testutil.CIEnv)
			return 1
		}
		fmt.Println("e2e: skipped: needs root (network namespaces, nftables) and no -short; CI runs as root")
		return m.Run()
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	work, err := os.MkdirTemp("", "shardproxy-e2e-")
	if err != nil {
		fmt.Println("e2e:", err)
		return 1
	}
	defer os.RemoveAll(work)
	// Start-up only: make test builds kube-apiserver and kube-proxy before this layer,
	// so minutes are spare; under the layer's go test -timeout (hack/test.sh).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	e, err := env.Start(ctx, env.Options{RepoRoot: root, WorkDir: work, Logf: func(f string, a ...any) {
		fmt.Printf("e2e: "+f+"\n", a...)
	}})
	if err != nil {
		fmt.Println("e2e: starting the environment:", err)
		if e != nil {
			_ = e.Close()
		}
		return 1
	}
	fmt.Printf("e2e: environment up in %v\n", time.Since(start).Round(time.Millisecond))
	shared = e
	code := m.Run()
	if code != 0 {
		fmt.Println("e2e: supervisor log (end):\n" + lastLines(e.SupervisorLog(), 60))
	}
	if err := e.Close(); err != nil {
		fmt.Println("e2e: cleanup:", err)
		return 1
	}
	return code
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// environment returns the shared environment, skipping when there is none (not root,
// or -short).
func environment(t *testing.T) *env.Env {
	t.Helper()
	if shared == nil {
		testutil.Unavailable(t, "e2e: needs root and no -short (CI runs it as root)")
	}
	return shared
}

var tcp80 = []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8080}}

// reach dials until every wanted server answered, failing on errors; it returns the
// source addresses each server saw.
func reach(t *testing.T, e *env.Env, from, proto, addr string, port int, want ...string) map[string]string {
	t.Helper()
	seen := map[string]string{}
	deadline := time.Now().Add(20 * time.Second)
	var lastErr error
	for len(seen) < len(want) && time.Now().Before(deadline) {
		r, err := e.TP.Dial(from, proto, addr, port)
		if err != nil {
			lastErr = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		seen[r.Server] = r.Source
	}
	for _, w := range want {
		if _, ok := seen[w]; !ok {
			t.Fatalf("%s %s -> %s:%d: never reached %s (reached %v, last error %v)", from, proto, addr, port, w, seen, lastErr)
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%s -> %s:%d reached %v, want exactly %v", from, addr, port, seen, want)
	}
	return seen
}

// servers starts identity servers on every pod for the given protocols and port.
func servers(t *testing.T, e *env.Env, port int, protos ...string) {
	t.Helper()
	for _, proto := range protos {
		for ns, name := range map[string]string{e.TP.Pod1: "pod1", e.TP.Pod2: "pod2", e.TP.Remote: "remote"} {
			stop, err := e.TP.Serve(ns, name, proto, "", port, t.Logf)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
		}
	}
}

// fails dials until three consecutive attempts fail the way want says (refused, timed
// out), failing the test if that does not happen within 20s.
func fails(t *testing.T, e *env.Env, from, proto, addr string, port int, what string, want func(error) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	streak := 0
	var last string
	// A drop shows as a timeout, so expect one soon; a refusal arrives at once, but over
	// IPv6 Linux aborts a connect only on the second ICMPv6 error, after the SYN is
	// retransmitted (1s).
	timeout := 700 * time.Millisecond
	if want(syscall.ECONNREFUSED) {
		timeout = 3 * time.Second
	}
	for time.Now().Before(deadline) {
		r, err := e.TP.DialWith(from, proto, addr, port, netns.DialOptions{Timeout: timeout})
		switch {
		case err != nil && want(err):
			streak++
			if streak == 3 {
				return
			}
			continue
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("answered by %s (source %s)", r.Server, r.Source)
		}
		streak = 0
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s %s -> %s:%d: want %s, last attempt: %s", from, proto, addr, port, what, last)
}

func refused(err error) bool  { return netns.IsRefused(err) }
func timedOut(err error) bool { return netns.IsTimeout(err) }
