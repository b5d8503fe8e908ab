package legacy

import "strings"

// The iptables tables kube-proxy writes.
const (
	tableNAT    = "nat"
	tableFilter = "filter"
	tableMangle = "mangle"
)

// ownedChains are the fixed-name chains kube-proxy (iptables and IPVS modes) creates, per
// table. Cleanup removes exactly these, the per-Service chains of ownedPrefixes, and the
// rules jumping to them.
var ownedChains = map[string][]string{
	tableNAT: {
		"KUBE-SERVICES",      // both modes: the dispatch from PREROUTING and OUTPUT
		"KUBE-NODEPORTS",     // iptables mode: NodePort dispatch
		"KUBE-POSTROUTING",   // both modes: masquerade of marked packets
		"KUBE-MARK-MASQ",     // both modes: sets the masquerade mark
		"KUBE-PROXY-CANARY",  // both modes: detects a flushed table
		"KUBE-NODE-PORT",     // IPVS mode: NodePort matching through ipsets
		"KUBE-LOAD-BALANCER", // IPVS mode: load-balancer IPs
	},
	tableFilter: {
		"KUBE-SERVICES",               // iptables mode: rejects for Services without endpoints
		"KUBE-EXTERNAL-SERVICES",      // iptables mode: the same for external traffic
		"KUBE-FORWARD",                // both modes: accepts marked and established forwarding
		"KUBE-NODEPORTS",              // iptables mode: health-check node ports
		"KUBE-PROXY-FIREWALL",         // both modes: loadBalancerSourceRanges
		"KUBE-PROXY-CANARY",           // both modes: detects a flushed table
		"KUBE-NODE-PORT",              // IPVS mode: health-check node ports
		"KUBE-SOURCE-RANGES-FIREWALL", // IPVS mode: loadBalancerSourceRanges drops
		"KUBE-IPVS-FILTER",            // IPVS mode: drops traffic to unknown ports of kube-ipvs0 addresses
		"KUBE-IPVS-OUT-FILTER",        // IPVS mode: the same for node traffic
	},
	tableMangle: {
		"KUBE-PROXY-CANARY", // both modes: detects a flushed table
	},
}

// ownedPrefixes start the names of kube-proxy's per-Service chains in the nat table.
var ownedPrefixes = map[string][]string{
	tableNAT: {
		"KUBE-SVC-", // a Service port's Cluster-policy endpoint choice
		"KUBE-SVL-", // a Service port's Local-policy endpoint choice
		"KUBE-SEP-", // one endpoint's DNAT
		"KUBE-EXT-", // a Service port's external traffic
		"KUBE-FW-",  // a Service port's loadBalancerSourceRanges
		"KUBE-XLB-", // kube-proxy before v1.24: external traffic of Local-policy Services
	},
}

// Owned reports whether chain in table (nat, filter, mangle) is kube-proxy's, that is,
// whether Cleanup removes it. Kubelet's KUBE-FIREWALL, KUBE-KUBELET-CANARY and
// KUBE-MARK-DROP, and other components' KUBE-* chains, are not.
func Owned(table, chain string) bool {
	for _, c := range ownedChains[table] {
		if c == chain {
			return true
		}
	}
	for _, p := range ownedPrefixes[table] {
		if strings.HasPrefix(chain, p) && len(chain) > len(p) {
			return true
		}
	}
	return false
}
