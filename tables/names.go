package tables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"
)

// Names of the objects in an instance's table. Everything is fixed except the pick and
// affinity chains, which exist once per endpoint count and per affinity timeout (never
// per Service), so the number of chains stays small however many Services there are.
const (
	// Base chains (see priority.go for their hooks and priorities).

	// chainFirewallPrerouting and chainFirewallOutput send LB traffic with source ranges
	// to firewallCheckChain before any DNAT.
	chainFirewallPrerouting = "firewall-prerouting"
	chainFirewallOutput     = "firewall-output"
	// chainNATPrerouting and chainNATOutput jump to chainServices, where DNAT happens.
	chainNATPrerouting = "nat-prerouting"
	chainNATOutput     = "nat-output"
	// chainFilterInput, chainFilterForward and chainFilterOutput reject or drop traffic to
	// Services without usable endpoints, and to undefined ports of cluster IPs.
	chainFilterInput   = "filter-input"
	chainFilterForward = "filter-forward"
	chainFilterOutput  = "filter-output"
	// chainNATPostrouting masquerades marked and hairpin traffic.
	chainNATPostrouting = "nat-postrouting"

	// Regular chains.

	// chainServices marks traffic for masquerade, applies affinity, and dispatches to
	// the pick chains.
	chainServices = "services"
	// chainFirewallCheck drops LB traffic from sources outside the Service's ranges.
	chainFirewallCheck = "firewall-check"
	// chainReject rejects; a verdict map cannot say "reject" itself.
	chainReject = "reject-chain"
	// pickPrefix chains ("pick-<n>") DNAT to one of n endpoints of the endpoints-<proto>
	// maps; pickClusterPrefix chains do the same over the cluster-endpoints-<proto> maps.
	pickPrefix        = "pick-"
	pickClusterPrefix = "pick-cluster-"
	// affinityPrefix names the chains and sets of ClientIP-affinity Service ports, the
	// only per-Service objects: "aff-<id>-int|ext|clu" choose among the internal,
	// external or cluster endpoints, "aff-<id>-ep-<ep>" DNATs to one endpoint and
	// remembers the client in set "aff-<id>-<ep>". A dynamic map could do this without
	// per-Service chains, but nft 1.0.6 cannot update IPv6 concatenated maps.
	affinityPrefix = "aff-"

	// Sets and maps.

	// setClusterIPs holds every cluster IP, to masquerade off-cluster traffic to them and
	// to reject traffic to their undefined ports.
	setClusterIPs = "cluster-ips"
	// setExternalMasq holds external entries (addr . proto . port of external IPs, LB IPs
	// and NodePorts) of Cluster-policy Services: all their traffic is masqueraded.
	setExternalMasq = "external-masq"
	// setExternalLocal holds the external entries of Local-policy Services: traffic to them
	// from the node itself is masqueraded.
	setExternalLocal = "external-local"
	// mapServiceIPs sends each entry (addr . proto . port) that has endpoints for its
	// policy to the pick chain of its endpoint count.
	mapServiceIPs = "service-ips"
	// mapShortCircuit sends the external entries of Local-policy Services, for traffic from
	// local pods and the node, to the cluster-endpoints pick chains (upstream's short circuit).
	mapShortCircuit = "short-circuit-ips"
	// mapEndpoints ("endpoints-<proto>") is address . port . index -> endpoint, for
	// mapServiceIPs. There is one map per protocol because nft 1.0.6 cannot read back a
	// map typed by "th dport" and then add rules using it.
	mapEndpoints = "endpoints"
	// mapClusterEndpoints ("cluster-endpoints-<proto>") is the same for mapShortCircuit.
	mapClusterEndpoints = "cluster-endpoints"
	// mapNoEndpoints sends entries without endpoints for their policy to the reject
	// chain (no endpoints at all) or to drop (Local policy, no local endpoints).
	mapNoEndpoints = "no-endpoint-services"
	// setFirewallIPs holds LB entries that have loadBalancerSourceRanges.
	setFirewallIPs = "firewall-ips"
	// setFirewallAllow holds entry . source-range pairs that pass the firewall.
	setFirewallAllow = "firewall-allow"
	// setFirewallLocal holds LB entries whose ranges hold a node IP: the node may connect.
	setFirewallLocal = "firewall-allow-local"
	// setHairpin holds endpoint . endpoint pairs: a pod sent to itself is masqueraded.
	setHairpin = "hairpin"
)

// allProtocols returns the transport protocols Services use, in a fixed order.
func allProtocols() []Protocol { return []Protocol{TCP, UDP, SCTP} }

func pickChain(n int) string                      { return fmt.Sprintf("%s%d", pickPrefix, n) }
func pickClusterChain(n int) string               { return fmt.Sprintf("%s%d", pickClusterPrefix, n) }
func endpointsMap(base string, p Protocol) string { return base + "-" + string(p) }

// portID is a short stable name for a Service port, for its per-Service objects.
func portID(spn ServicePortName, salt any) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%s/%v", spn, spn.Protocol, salt)))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:12])
}

// endpointID is a short stable name for an endpoint inside a Service port.
func endpointID(ep Endpoint) string {
	sum := sha256.Sum256([]byte(ep.String()))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:8])
}
