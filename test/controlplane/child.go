package controlplane

import "time"

// Child is a process started by StartChild.
type Child struct {
	p *process
}

// StartChild starts bin with args as the control plane starts etcd and kube-apiserver:
// stdout and stderr appended to logPath, its own process group, and SIGKILL when this
// process dies first, so a crashed test leaves nothing running. test/cluster starts the
// node's components with it (through nsenter, which keeps all of that across its exec).
func StartChild(name, logPath, bin string, args ...string) (*Child, error) {
	p, err := startProcess(name, logPath, "", bin, args)
	if err != nil {
		return nil, err
	}
	return &Child{p: p}, nil
}

// Stop sends SIGTERM, then SIGKILL after grace, and waits for the child to exit.
func (c *Child) Stop(grace time.Duration) error { return c.p.stop(grace) }

// Running reports whether the child has not exited yet.
func (c *Child) Running() bool { return c.p.running() }

// Pid is the child's process id.
func (c *Child) Pid() int { return c.p.cmd.Process.Pid }

// LogTail returns the last lines of the child's log.
func (c *Child) LogTail(lines int) string { return c.p.logTail(lines) }

// ExitErr is the child's exit status once it has exited.
func (c *Child) ExitErr() error {
	if c.Running() {
		return nil
	}
	return c.p.waitErr
}
