package env

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Ports of an upstream kube-proxy run next to the supervisor in the node namespace. The
// supervisor already holds kube-proxy's defaults (10256, 10249).
const (
	KubeProxyHealthzPort = 10266
	KubeProxyMetricsPort = 10259
)

// KubeProxy is an upstream kube-proxy process in the node namespace.
type KubeProxy struct {
	e       *Env
	binary  string
	args    []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// KubeProxyArgs are the flags of an upstream kube-proxy in mode ("iptables", "nftables")
// that serves the unlabeled Services of node-1 with the admin kubeconfig, next to the
// supervisor: its own health and metrics ports, and no conntrack sysctl writes (the node
// namespace shares the host's nf_conntrack_max, which a namespace may not set).
func (e *Env) KubeProxyArgs(mode string) []string {
	return []string{
		"--proxy-mode=" + mode,
		"--kubeconfig=" + e.CP.Kubeconfig,
		"--hostname-override=" + NodeName,
		"--cluster-cidr=10.244.0.0/16,fd00:10:244::/48",
		fmt.Sprintf("--healthz-bind-address=0.0.0.0:%d", KubeProxyHealthzPort),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", KubeProxyMetricsPort),
		"--nodeport-addresses=primary", // as shardproxy instances default to
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--iptables-min-sync-period=100ms",
		"--v=2",
	}
}

// NewKubeProxy prepares (but does not start) kube-proxy binary with args in the node
// namespace; its output goes to a log file in WorkDir named after logName. Close stops
// it.
func (e *Env) NewKubeProxy(binary, logName string, args ...string) *KubeProxy {
	kp := &KubeProxy{e: e, binary: binary, args: args, logPath: filepath.Join(e.opts.WorkDir, logName+".log")}
	e.OnClose(func() { _ = kp.Stop(syscall.SIGKILL) })
	return kp
}

// Start starts the process; it fails if it is already running.
func (kp *KubeProxy) Start() error {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.cmd != nil {
		return errors.New("kube-proxy is already running")
	}
	cmd, done, err := startLogged(kp.e.TP.Node, kp.logPath, nil, "kube-proxy", append([]string{kp.binary}, kp.args...)...)
	if err != nil {
		return err
	}
	kp.cmd, kp.done = cmd, done
	return nil
}

// Pid is the process id of the running kube-proxy (ip netns exec execs it in place), or
// 0.
func (kp *KubeProxy) Pid() int {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.cmd == nil {
		return 0
	}
	return kp.cmd.Process.Pid
}

// Stop signals the process group and waits for it to exit.
func (kp *KubeProxy) Stop(sig syscall.Signal) error {
	kp.mu.Lock()
	cmd, done := kp.cmd, kp.done
	kp.cmd = nil
	kp.mu.Unlock()
	if cmd == nil {
		return nil
	}
	return stopGroup(cmd, done, sig, "kube-proxy")
}

// Log returns the process's output so far (every run appends to the same file).
func (kp *KubeProxy) Log() string {
	b, _ := os.ReadFile(kp.logPath)
	return string(b)
}

// LogTail returns the last n lines of Log.
func (kp *KubeProxy) LogTail(n int) string { return tail(kp.Log(), n) }

// WaitHealthy waits until kube-proxy's /healthz on KubeProxyHealthzPort answers 200,
// which it does once it has synced its rules.
func (kp *KubeProxy) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", KubeProxyHealthzPort)
	for time.Now().Before(deadline) {
		code, body, err := kp.e.HTTPGet(ctx, url)
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = strings.TrimSpace(fmt.Sprintf("%d %s %v", code, body, err))
		kp.mu.Lock()
		done := kp.done
		running := kp.cmd != nil
		kp.mu.Unlock()
		if !running {
			return errors.New("kube-proxy is not running")
		}
		select {
		case <-done:
			return fmt.Errorf("kube-proxy exited; log:\n%s", kp.LogTail(40))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-proxy not healthy within %s (last: %s); log:\n%s", timeout, last, kp.LogTail(40))
}
