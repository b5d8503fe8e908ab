package env

import (
	"fmt"
	"os"
	"os/exec"
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
