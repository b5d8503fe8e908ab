package tables

import (
	"fmt"
	"time"
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
	// chainFilterPrerouting records ClientIP affinity after DNAT.
	chainFilterPrerouting = "filter-prerouting"
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
	// chainAffinityUpdate sends new DNATed connections of affinity Services to the
	// affinity chain of their timeout.
	chainAffinityUpdate = "affinity-update"
	// pickPrefix chains ("pick-<n>") DNAT to one of n endpoints of mapEndpoints;
	// pickClusterPrefix chains do the same over mapClusterEndpoints.
	pickPrefix        = "pick-"
	pickClusterPrefix = "pick-cluster-"
	// affinityPrefix chains ("affinity-<seconds>") remember the endpoint a client was sent to.
	affinityPrefix = "affinity-"

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
	// mapEndpoints is entry . index -> endpoint, for mapServiceIPs.
	mapEndpoints = "endpoints"
	// mapClusterEndpoints is entry . index -> endpoint, for mapShortCircuit.
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
	// mapAffinity is client . entry -> endpoint, filled by the packet path (dynamic).
	mapAffinity = "affinity"
	// mapAffinityServices sends entries of affinity Services to their affinity chain.
	mapAffinityServices = "affinity-services"
	// setHairpin holds endpoint . endpoint pairs: a pod sent to itself is masqueraded.
	setHairpin = "hairpin"
)

// affinityMapSize bounds the dynamic affinity map (clients x entries).
const affinityMapSize = 1 << 20

func pickChain(n int) string        { return fmt.Sprintf("%s%d", pickPrefix, n) }
func pickClusterChain(n int) string { return fmt.Sprintf("%s%d", pickClusterPrefix, n) }
func affinityChain(timeout time.Duration) string {
	return fmt.Sprintf("%s%d", affinityPrefix, int64(timeout/time.Second))
}
