package supervisor

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// podCIDRs are the pod ranges this node knows: every instance's detectLocal
// clusterCIDRs and this node's spec.podCIDRs. No user address may take one (a pod's
// traffic would go to the Service instead).
func (s *Supervisor) podCIDRs(node *corev1.Node) []netip.Prefix {
	var all []string
	for _, in := range s.cfg.Instances {
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
