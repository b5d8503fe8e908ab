package controlplane

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is one child (etcd or kube-apiserver) whose output goes to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	// exited is closed once the child has exited; waitErr is then its exit status.
	exited  chan struct{}
	waitErr error
}

// startProcess starts bin with args, its stdout and stderr appended to logPath.
//
// The child gets SIGKILL if this process dies first, so a crashed or killed test leaves no
// etcd or kube-apiserver behind. Linux sends that signal when the thread that forked the
// child exits, not the process (golang/go#27505), and Go may end a thread whenever a
// goroutine that locked it returns (as netns code does), so the child is started from a
// goroutine that keeps its own thread locked until the child is gone. The child gets its
// own process group so that a terminal's Ctrl-C reaches only us, and we stop it in order.
func startProcess(name, logPath, netns, bin string, args []string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the %s log: %w", name, err)
	}
	if netns != "" {
		args = append([]string{"netns", "exec", netns, bin}, args...)
		bin = "ip"
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	p := &process{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}

	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return p, nil
}

// childEnv is our environment without etcd's ETCD_* variables, which etcd reads as flags
// and which would clash with the ones we pass.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

// running reports whether the child has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// killWait bounds the wait for a child to exit after SIGKILL.
const killWait = time.Minute

// stop asks the child to exit with SIGTERM and kills it if it is still there after grace.
// A child that already exited is fine: stop only reports failing to end it.
func (p *process) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
	}
	if err := p.cmd.Process.Kill(); err != nil && p.running() {
		return fmt.Errorf("killing %s (pid %d): %w", p.name, p.cmd.Process.Pid, err)
	}
	// A killed process exits once it leaves the kernel (a task in uninterruptible sleep,
	// the unmapping of a large address space); on a loaded CI host containerd was seen to
	// take over 10 s, so wait long for it.
	select {
	case <-p.exited:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("%s (pid %d) did not exit within %v of SIGKILL", p.name, p.cmd.Process.Pid, killWait)
	}
}

// logTail returns the last lines of the child's log, for error messages.
func (p *process) logTail(lines int) string {
	return tail(p.logPath, lines)
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	data = bytes.TrimRight(data, "\n")
	all := bytes.Split(data, []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n")))
}
