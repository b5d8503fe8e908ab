package supervisor

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
)

// tableConfigs maps the supervisor's configuration to its instances' tables.Config: the
// one place that mapping is written, used by the running supervisor and by Render.
type tableConfigs struct {
	cfg *config.Config
	// interfaceAddrs lists the node's addresses, for CIDR nodePortAddresses.
	interfaceAddrs func() ([]netip.Addr, error)
	logger         klog.Logger
}

// forInstance is the configuration of spec's tables on this node (node may be nil: not
// read yet). Family is left for the caller to set.
func (t tableConfigs) forInstance(spec config.Instance, node *corev1.Node) tables.Config {
	cfg := tables.Config{
		TablePrefix:   t.cfg.TablePrefix,
		Instance:      spec.Name,
		Supervisor:    t.cfg.SupervisorIdentity(),
		Slot:          *spec.Slot,
		MasqueradeBit: *t.cfg.MasqueradeBit,
		MasqueradeAll: spec.MasqueradeAll,
	}
	t.applyNode(spec, node, t.interfaceAddrs, &cfg)
	return cfg
}

// loadBalancing is an instance's load-balancing settings, for its Services' models (the
// running instance's and Render's alike).
func loadBalancing(spec config.Instance) instance.LoadBalancing {
	mode, allowed := spec.LoadBalancing.Modes()
	return instance.LoadBalancing{Mode: mode, Allowed: allowed}
}

// applyNode fills the node-dependent table settings of an instance: from node, and for
// CIDR nodePortAddresses from the node's interface addresses, which addrs lists. When
// addrs fails, cfg keeps the NodePort addresses it had (none for a new instance): a
// failed listing must not take a running instance's NodePorts away.
func (t tableConfigs) applyNode(spec config.Instance, node *corev1.Node, addrs func() ([]netip.Addr, error), cfg *tables.Config) {
	nodeIPs := nodeAddresses(node)
	cfg.NodeIPs = nodeIPs
	if !usesInterfaceAddrs(spec) {
		cfg.NodePortIPs = primaryNodeIPs(node)
	} else if listed, err := addrs(); err != nil {
		t.logger.Error(err, "Listing node addresses for nodePortAddresses; keeping the ones in use", "instance", spec.Name)
	} else {
		cfg.NodePortIPs = matchNodePortCIDRs(spec.NodePortAddresses, listed)
	}
	cfg.Local = tables.LocalTraffic{Mode: tables.LocalMode(spec.DetectLocal.Mode)}
	switch cfg.Local.Mode {
	case tables.LocalClusterCIDR:
		cfg.Local.CIDRs = parsePrefixes(spec.DetectLocal.ClusterCIDRs)
	case tables.LocalNodeCIDR:
		if node != nil {
			cfg.Local.CIDRs = parsePrefixes(node.Spec.PodCIDRs)
		}
	case tables.LocalBridgeInterface:
		cfg.Local.Interface = spec.DetectLocal.BridgeInterface
	case tables.LocalInterfaceNamePrefix:
		cfg.Local.Interface = spec.DetectLocal.InterfaceNamePrefix
	}
}

// usesInterfaceAddrs reports whether spec's NodePort addresses come from the node's
// interface addresses (CIDR nodePortAddresses) rather than from its Node object.
func usesInterfaceAddrs(spec config.Instance) bool {
	return len(spec.NodePortAddresses) > 0 && !slices.Contains(spec.NodePortAddresses, config.NodePortAddressesPrimary)
}

// matchNodePortCIDRs are the addresses of addrs inside the CIDRs cidrs, in the order of
// the CIDRs, without repeats, never loopback. A link-local address (fe80::/10,
// 169.254.0.0/16) is matched only by a CIDR inside the link-local range itself, not by a
// wider one such as ::/0: every pod's host-side veth holds one that comes and goes with
// the pod, and serving NodePorts on them would reconfigure (fully sync) the instance at
// every pod start and stop.
func matchNodePortCIDRs(cidrs []string, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue
		}
		p = p.Masked()
		for _, a := range addrs {
			if !p.Contains(a) || a.IsLoopback() || slices.Contains(out, a) {
				continue
			}
			if a.IsLinkLocalUnicast() && !isLinkLocalPrefix(p) {
				continue
			}
			out = append(out, a)
		}
	}
	return out
}

// The link-local unicast ranges.
var (
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6 = netip.MustParsePrefix("fe80::/10")
)

// isLinkLocalPrefix reports whether every address of p is link-local unicast.
func isLinkLocalPrefix(p netip.Prefix) bool {
	ll := linkLocal6
	if p.Addr().Is4() {
		ll = linkLocal4
	}
	return p.Bits() >= ll.Bits() && ll.Contains(p.Addr())
}

// primaryNodeIPs are the addresses nodePortAddresses "primary" serves NodePorts on: the
// node's primary address of each family, as kube-proxy resolves "primary" (its
// NodeManager's node IPs, from GetNodeHostIPs in k8s.io/component-helpers node/util):
// the first InternalIP, else the first ExternalIP, and then the first address of the
// other family, again InternalIPs before ExternalIPs. So a Node with several InternalIPs
// serves NodePorts on the first of each family only, and a Node with ExternalIPs only
// (some bare-metal and cloud setups) serves them on its ExternalIP. A family with no
// address serves none (kube-proxy then accepts NodePorts on every local address of that
// family, which it warns about at start; we stay closed).
func primaryNodeIPs(node *corev1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var all []netip.Addr
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != typ {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				all = append(all, ip.Unmap())
			}
		}
	}
	if len(all) == 0 {
		return nil
	}
	out := []netip.Addr{all[0]}
	for _, ip := range all[1:] {
		if ip.Is4() != all[0].Is4() {
			return append(out, ip)
		}
	}
	return out
}

// nodeAddresses are the node's InternalIPs, sorted.
func nodeAddresses(node *corev1.Node) []netip.Addr {
	if node == nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func parsePrefixes(in []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range in {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}
