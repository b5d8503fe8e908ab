package env

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// startLogged starts argv inside namespace ns in a process group of its own, appending
// its output to logPath, with env added to ours; done is closed when it exits.
func startLogged(ns, logPath string, env []string, what string, argv ...string) (cmd *exec.Cmd, done chan struct{}, err error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	cmd = exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// Pdeathsig: a test binary that dies takes its daemons with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, nil, fmt.Errorf("starting %s: %w", what, err)
	}
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	return cmd, done, nil
}

// stopGroup signals cmd's process group with sig and waits for it to exit, killing it
// after 30s.
func stopGroup(cmd *exec.Cmd, done <-chan struct{}, sig syscall.Signal, what string) error {
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
		return nil
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("%s did not stop within 30s", what)
	}
}

// loggedProcess is one daemon in a namespace that a test starts, stops and starts again;
// every run appends its output to the same log file.
type loggedProcess struct {
	what    string // "the supervisor", "kube-proxy": for errors
	ns      string
	logPath string
	env     []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current run exits
}

// start starts argv; it fails if the process is running.
func (p *loggedProcess) start(argv ...string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.what)
	}
	cmd, done, err := startLogged(p.ns, p.logPath, p.env, p.what, argv...)
	if err != nil {
		return err
	}
	p.cmd, p.done = cmd, done
	return nil
}

// pid is the running process's id (ip netns exec execs in place), or 0.
func (p *loggedProcess) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop signals the process group with sig and waits for it to exit; a stopped process
// is no error.
func (p *loggedProcess) stop(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	return stopGroup(cmd, done, sig, p.what)
}

// log returns the output of every run so far.
func (p *loggedProcess) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// waitHealthy polls url through get until it answers 200, failing early when the
// process is not running or exits.
func (p *loggedProcess) waitHealthy(ctx context.Context, timeout time.Duration, url string,
	get func(context.Context, string) (int, string, error)) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		code, body, err := get(ctx, url)
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = strings.TrimSpace(fmt.Sprintf("%d %s %v", code, body, err))
		p.mu.Lock()
		done := p.done
		running := p.cmd != nil
		p.mu.Unlock()
		if !running {
			return fmt.Errorf("%s is not running", p.what)
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited; log:\n%s", p.what, tail(p.log(), 40))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not healthy within %s (last: %s); log:\n%s", p.what, timeout, last, tail(p.log(), 40))
}
