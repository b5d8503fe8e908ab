package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

var metav1GetOptions = metav1.GetOptions{}

// hostAddrs lists the node's interface addresses.
func hostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// NetlinkAddrEvents returns a Deps.AddrEvents that follows the address changes of
// network namespace ns (netns.None(): the caller's) through a netlink subscription to
// the kernel's IPv4 and IPv6 address groups. It returns when ctx ends (nil) or when the
// subscription ends (an error: the kernel dropped messages, ENOBUFS, or the socket
// failed), so that the caller subscribes again and re-reads what it missed.
func NetlinkAddrEvents(ns netns.NsHandle) func(ctx context.Context, changed func()) error {
	return func(ctx context.Context, changed func()) error {
		updates := make(chan netlink.AddrUpdate, 64)
		done := make(chan struct{})
		var mu sync.Mutex
		var lastErr error
		opts := netlink.AddrSubscribeOptions{ErrorCallback: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			lastErr = err
		}}
		if ns.IsOpen() {
			opts.Namespace = &ns
		}
		if err := netlink.AddrSubscribeWithOptions(updates, done, opts); err != nil {
			return fmt.Errorf("subscribing to address changes: %w", err)
		}
		// Closing done closes the socket, which ends the reader, which closes updates;
		// it is drained so that the reader never blocks on a send meanwhile.
		defer func() {
			close(done)
			for range updates {
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return nil
			case _, ok := <-updates:
				if !ok {
					mu.Lock()
					defer mu.Unlock()
					if lastErr == nil {
						return errors.New("address change subscription ended")
					}
					return fmt.Errorf("address change subscription ended: %w", lastErr)
				}
				changed()
			}
		}
	}
}

// writeSysctl writes one sysctl under /proc/sys ("net.netfilter.nf_conntrack_max").
func writeSysctl(name, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s=%s: %w", name, value, err)
	}
	return nil
}

// conntrackMaxLimit caps nf_conntrack_max computed from maxPerCore, as kube-proxy v1.36
// does (getConntrackMax in k8s.io/kubernetes pkg/proxy/conntrack/sysctls.go: "Cap the
// value to 1M to avoid excessive memory usage on high-core machines"; its tests
// TestGetConntrackMax and TestGetConntrackMax_Capped pin it). A 64-CPU node therefore
// gets 1,048,576 with the defaults, not 32768 × 64, from kube-proxy and from us alike.
const conntrackMaxLimit = 1 << 20

const (
	// conntrackHashsizePath is nf_conntrack's hash table size (buckets).
	conntrackHashsizePath = "/sys/module/nf_conntrack/parameters/hashsize"
	// onlineCPUsPath lists the node's online CPUs ("0-3,6").
	onlineCPUsPath = "/sys/devices/system/cpu/online"
)

// conntrackMax is the nf_conntrack_max to set for ct on a node with cpus CPUs, computed
// as kube-proxy v1.36 does: maxPerCore × CPUs, capped at conntrackMaxLimit, else at least
// min. When maxPerCore × CPUs is over the cap the cap wins even over a larger min, as
// upstream's (its check of the cap comes before min's). 0 (maxPerCore unset or 0) leaves
// it alone, whatever min says.
func conntrackMax(ct config.Conntrack, cpus int) int {
	if ct.MaxPerCore == nil || *ct.MaxPerCore <= 0 {
		return 0
	}
	floor := 0
	if ct.Min != nil {
		floor = int(*ct.Min)
	}
	scaled := int(*ct.MaxPerCore) * cpus
	if scaled > conntrackMaxLimit {
		return conntrackMaxLimit
	}
	return max(scaled, floor)
}

// setConntrackSysctls applies the node-wide conntrack settings once, for every instance,
// with upstream kube-proxy's semantics: nf_conntrack_max from maxPerCore and min, and
// then nf_conntrack's hash table raised to a quarter of it; each timeout in whole seconds
// when it is positive. Unlike upstream, failures are logged and the rest still applied:
// in a network namespace some of them are read-only, and the proxy works without them.
func (s *Supervisor) setConntrackSysctls() {
	ct := s.cfg.Conntrack
	set := func(name string, v int64) bool {
		if v <= 0 {
			return false
		}
		if err := s.deps.Sysctl(name, strconv.FormatInt(v, 10)); err != nil {
			s.logger.Info("Could not set conntrack sysctl", "sysctl", name, "err", err)
			return false
		}
		return true
	}
	if maxConns := conntrackMax(ct, s.deps.NumCPU()); maxConns > 0 {
		if set("net.netfilter.nf_conntrack_max", int64(maxConns)) {
			if err := s.deps.ConntrackHashsize(maxConns / 4); err != nil {
				s.logger.Info("Could not raise the conntrack hash table size", "hashsize", maxConns/4, "err", err)
			}
		}
	}
	secs := func(d *config.Duration) int64 {
		if d == nil {
			return 0
		}
		return int64(d.Duration / time.Second)
	}
	set("net.netfilter.nf_conntrack_tcp_timeout_established", secs(ct.TCPEstablishedTimeout))
	set("net.netfilter.nf_conntrack_tcp_timeout_close_wait", secs(ct.TCPCloseWaitTimeout))
	set("net.netfilter.nf_conntrack_udp_timeout", secs(ct.UDPTimeout))
	set("net.netfilter.nf_conntrack_udp_timeout_stream", secs(ct.UDPStreamTimeout))
}

// raiseHashsize sets the conntrack hash table size in path to buckets if it is smaller;
// it never shrinks the table.
func raiseHashsize(path string, buckets int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading conntrack hashsize: %w", err)
	}
	cur, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("reading conntrack hashsize: %w", err)
	}
	if cur >= buckets {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(buckets)), 0o644); err != nil {
		return fmt.Errorf("setting conntrack hashsize %d: %w", buckets, err)
	}
	return nil
}

// numCPU counts the online CPUs listed in path, the machine's rather than this
// process's CPU set (upstream counts them from /sys for the same reason), falling back to
// runtime.NumCPU.
func numCPU(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		first, err1 := strconv.Atoi(lo)
		last := first
		var err2 error
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || last < first {
			return runtime.NumCPU()
		}
		n += last - first + 1
	}
	if n < 1 {
		return runtime.NumCPU()
	}
	return n
}

// serviceCIDRAPIAvailable reports whether the apiserver serves networking.k8s.io/v1
// ServiceCIDRs (older clusters do not: then there is nothing to watch).
func serviceCIDRAPIAvailable(client kubernetes.Interface) bool {
	res, err := client.Discovery().ServerResourcesForGroupVersion("networking.k8s.io/v1")
	if err != nil {
		return false
	}
	for _, r := range res.APIResources {
		if r.Name == "servicecidrs" {
			return true
		}
	}
	return false
}
