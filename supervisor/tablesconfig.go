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
	t.applyNode(spec, node, &cfg)
	return cfg
}

// loadBalancing is an instance's load-balancing settings, for its Services' models (the
// running instance's and Render's alike).
func loadBalancing(spec config.Instance) instance.LoadBalancing {
	mode, allowed := spec.LoadBalancing.Modes()
	return instance.LoadBalancing{Mode: mode, Allowed: allowed}
}

// applyNode fills the node-dependent table settings of an instance.
func (t tableConfigs) applyNode(spec config.Instance, node *corev1.Node, cfg *tables.Config) {
	nodeIPs := nodeAddresses(node)
	cfg.NodeIPs = nodeIPs
	cfg.NodePortIPs = nil
	if len(spec.NodePortAddresses) == 0 || slices.Contains(spec.NodePortAddresses, config.NodePortAddressesPrimary) {
		cfg.NodePortIPs = nodeIPs
	} else {
		addrs, err := t.interfaceAddrs()
		if err != nil {
			t.logger.Error(err, "Listing node addresses for nodePortAddresses", "instance", spec.Name)
		}
		for _, c := range spec.NodePortAddresses {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if p.Contains(a) && !a.IsLoopback() && !slices.Contains(cfg.NodePortIPs, a) {
					cfg.NodePortIPs = append(cfg.NodePortIPs, a)
				}
			}
		}
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
