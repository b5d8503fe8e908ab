package env

import (
	"context"
	"fmt"
	"path/filepath"
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
	e      *Env
	binary string
	args   []string
	proc   *loggedProcess
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
	kp := &KubeProxy{e: e, binary: binary, args: args,
		proc: &loggedProcess{what: "kube-proxy", ns: e.TP.Node, logPath: filepath.Join(e.opts.WorkDir, logName+".log")}}
	e.OnClose(func() { _ = kp.Stop(syscall.SIGKILL) })
	return kp
}

// Start starts the process; it fails if it is already running.
func (kp *KubeProxy) Start() error { return kp.proc.start(append([]string{kp.binary}, kp.args...)...) }

// Pid is the process id of the running kube-proxy (ip netns exec execs it in place), or
// 0.
func (kp *KubeProxy) Pid() int { return kp.proc.pid() }

// Stop signals the process group and waits for it to exit.
func (kp *KubeProxy) Stop(sig syscall.Signal) error { return kp.proc.stop(sig) }

// Log returns the process's output so far (every run appends to the same file).
func (kp *KubeProxy) Log() string { return kp.proc.log() }

// LogTail returns the last n lines of Log.
func (kp *KubeProxy) LogTail(n int) string { return tail(kp.Log(), n) }

// WaitHealthy waits until kube-proxy's /healthz on KubeProxyHealthzPort answers 200,
// which it does once it has synced its rules.
func (kp *KubeProxy) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	return kp.proc.waitHealthy(ctx, timeout, fmt.Sprintf("http://127.0.0.1:%d/healthz", KubeProxyHealthzPort), kp.e.HTTPGet)
}
