package supervisor

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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

// setConntrackSysctls applies the node-wide conntrack settings once, for every instance.
// Failures are logged: in a network namespace some of them are read-only, and the
// proxy works without them.
func (s *Supervisor) setConntrackSysctls() {
	ct := s.cfg.Conntrack
	set := func(name string, v int64) {
		if v <= 0 {
			return
		}
		if err := s.deps.Sysctl(name, strconv.FormatInt(v, 10)); err != nil {
			s.logger.Info("Could not set conntrack sysctl", "sysctl", name, "err", err)
		}
	}
	if ct.MaxPerCore != nil && *ct.MaxPerCore > 0 {
		maxConns := int64(*ct.MaxPerCore) * int64(runtime.NumCPU())
		if ct.Min != nil && int64(*ct.Min) > maxConns {
			maxConns = int64(*ct.Min)
		}
		set("net.netfilter.nf_conntrack_max", maxConns)
	}
	secs := func(d interface{ Seconds() float64 }) int64 { return int64(d.Seconds()) }
	if ct.TCPEstablishedTimeout != nil {
		set("net.netfilter.nf_conntrack_tcp_timeout_established", secs(ct.TCPEstablishedTimeout.Duration))
	}
	if ct.TCPCloseWaitTimeout != nil {
		set("net.netfilter.nf_conntrack_tcp_timeout_close_wait", secs(ct.TCPCloseWaitTimeout.Duration))
	}
	if ct.UDPTimeout != nil {
		set("net.netfilter.nf_conntrack_udp_timeout", secs(ct.UDPTimeout.Duration))
	}
	if ct.UDPStreamTimeout != nil {
		set("net.netfilter.nf_conntrack_udp_timeout_stream", secs(ct.UDPStreamTimeout.Duration))
	}
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
