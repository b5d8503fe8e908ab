package supervisor

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
)

// reservedAddresses are the addresses no Service's user addresses may take on this node:
// this node's (its Node object's and its interfaces', hostIPs), the other Nodes'
// (otherNodes, from otherNodeIPs), the cluster's ServiceCIDRs, the pod CIDRs and the
// operator's reservedCIDRs. It is the one computation of them, for the running
// supervisor and for Render alike, so that render refuses what run refuses.
func reservedAddresses(cfg *config.Config, node *corev1.Node, hostIPs []netip.Addr, serviceCIDRs []string, otherNodes []selector.NodeIP) selector.Reserved {
	var ips []netip.Addr
	if node != nil {
		for _, a := range node.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	// Loopback and link-local addresses are refused by kind anyway; leaving them out
	// keeps pod veths coming and going from re-dispatching every address claimant.
	for _, a := range hostIPs {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() {
			ips = append(ips, a)
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return selector.Reserved{NodeIPs: slices.Compact(ips),
		ServiceCIDRs: sortedPrefixes(serviceCIDRs), PodCIDRs: podCIDRs(cfg, node),
		OtherNodeIPs: otherNodes, CIDRs: sortedPrefixes(cfg.ReservedCIDRs)}
}

// otherNodeIPs lists the addresses of the nodes other than the one named self, sorted by
// address; an address two Nodes list is named after the first by name.
func otherNodeIPs(nodes []*corev1.Node, self string) []selector.NodeIP {
	var out []selector.NodeIP
	for _, n := range nodes {
		if n == nil || n.Name == self {
			continue
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				out = append(out, selector.NodeIP{Addr: ip.Unmap(), Node: n.Name})
			}
		}
	}
	return sortNodeIPs(out)
}

// sortNodeIPs sorts by address, then node name, and keeps the first of each address.
func sortNodeIPs(out []selector.NodeIP) []selector.NodeIP {
	slices.SortFunc(out, func(a, b selector.NodeIP) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	return slices.CompactFunc(out, func(a, b selector.NodeIP) bool { return a.Addr == b.Addr })
}

// podCIDRs are the pod ranges this node knows: every instance's detectLocal
// clusterCIDRs and this node's spec.podCIDRs. No user address may take one (a pod's
// traffic would go to the Service instead).
func podCIDRs(cfg *config.Config, node *corev1.Node) []netip.Prefix {
	var all []string
	for _, in := range cfg.Instances {
		all = append(all, in.DetectLocal.ClusterCIDRs...)
	}
	if node != nil {
		all = append(all, node.Spec.PodCIDRs...)
		if node.Spec.PodCIDR != "" {
			all = append(all, node.Spec.PodCIDR)
		}
	}
	return sortedPrefixes(all)
}

// sortedPrefixes parses CIDRs (skipping malformed ones), masked, sorted and without
// repeats, so that an unchanged set compares equal.
func sortedPrefixes(cidrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// apiServerIPs are the addresses of the API server's endpoints: those of the
// EndpointSlices of default/kubernetes among epSlices, sorted. No user address may take
// one (served, it would capture every client's API traffic).
func apiServerIPs(epSlices []*discoveryv1.EndpointSlice) []netip.Addr {
	var out []netip.Addr
	for _, sl := range epSlices {
		if sl == nil || sl.Namespace != metav1.NamespaceDefault || sl.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
			continue
		}
		for _, ep := range sl.Endpoints {
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// nodeIPs is otherNodeIPs of a published list (nodeaddrs.Node).
func nodeIPs(nodes []nodeaddrs.Node, self string) []selector.NodeIP {
	var out []selector.NodeIP
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		for _, a := range n.Addrs {
			out = append(out, selector.NodeIP{Addr: a.Unmap(), Node: n.Name})
		}
	}
	return sortNodeIPs(out)
}
