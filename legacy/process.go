package legacy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a running legacy kube-proxy.
type Process struct {
	PID int
	// Cmdline is its command line, arguments joined by spaces.
	Cmdline string
}

func (p Process) String() string { return fmt.Sprintf("pid %d (%s)", p.PID, p.Cmdline) }

// isKubeProxyName reports whether a process name (comm, or argv[0]'s base name) is
// kube-proxy's: "kube-proxy", or a versioned copy such as "kube-proxy-v1.36.3" (whose
// comm the kernel cuts to 15 bytes, "kube-proxy-v1.3"). shardproxy itself, and tools
// that merely mention kube-proxy in their arguments (grep kube-proxy), do not match.
func isKubeProxyName(name string) bool {
	return name == "kube-proxy" || strings.HasPrefix(name, "kube-proxy-") || strings.HasPrefix(name, "kube-proxy.")
}

// FindKubeProxy scans procRoot ("/proc") for kube-proxy processes in the same network
// namespace as this process: only those program the rules Cleanup would remove (a
// kube-proxy in a pod's own network namespace, or a test namespace, does not). Run it on
// the host, or in a pod with hostPID: /proc of a pod without it shows no kube-proxy.
func FindKubeProxy(procRoot string) ([]Process, error) {
	// thread-self, not self: a caller may have switched only its own thread into another
	// network namespace (setns), and that is the namespace it cleans up.
	self, err := netnsID(filepath.Join(procRoot, "thread-self"))
	if os.IsNotExist(err) {
		self, err = netnsID(filepath.Join(procRoot, "self"))
	}
	if err != nil {
		return nil, fmt.Errorf("reading this process's network namespace: %w", err)
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var found []Process
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		dir := filepath.Join(procRoot, ent.Name())
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if !isKubeProxyName(strings.TrimSpace(string(comm))) && !isKubeProxyName(filepath.Base(args[0])) {
			continue
		}
		ns, err := netnsID(dir)
		if err != nil {
			if os.IsNotExist(err) {
				continue // exited meanwhile
			}
			// Unknown namespace: assume the worst, it may be programming ours.
			ns = self
		}
		if ns != self {
			continue
		}
		found = append(found, Process{PID: pid, Cmdline: strings.Join(args, " ")})
	}
	sort.Slice(found, func(i, j int) bool { return found[i].PID < found[j].PID })
	return found, nil
}

// netnsID identifies the network namespace of the process at dir (/proc/PID).
func netnsID(dir string) (string, error) {
	st, err := os.Stat(filepath.Join(dir, "ns", "net"))
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", fmt.Errorf("no inode for %s", dir)
	}
	return fmt.Sprintf("%d:%d", sys.Dev, sys.Ino), nil
}

// DefaultKubeProxyMetricsAddress is where kube-proxy serves /metrics and /proxyMode by
// default.
const DefaultKubeProxyMetricsAddress = "127.0.0.1:10249"

// ProbeKubeProxy asks addr (host:port) for kube-proxy's /proxyMode, which only
// kube-proxy serves, and returns the mode it answered ("iptables", "ipvs", ...), or ""
// when nothing there is a kube-proxy. shardproxy's own servers (10256, 10249 by default)
// do not serve /proxyMode, so they never pass for a kube-proxy.
func ProbeKubeProxy(ctx context.Context, addr string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// The connection is opened on the calling goroutine, so a caller whose thread is in
	// another network namespace probes that namespace (http.Client would dial elsewhere).
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return ""
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/proxyMode", nil)
	if err != nil {
		return ""
	}
	req.Close = true
	if err := req.Write(conn); err != nil {
		return ""
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	switch mode := string(bytes.TrimSpace(body)); mode {
	case "iptables", "ipvs", "nftables", "kernelspace":
		return mode
	}
	return ""
}
