package tables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Names of the objects in an instance's table. Everything is fixed except the pick
// chains (once per endpoint count), the round-robin and affinity buckets (at most 256
// of each), the affinity sets (per Service port and endpoint), and the chains of the
// few ports whose external endpoints differ from their cluster IP's in round-robin or
// affinity: so the number of chains stays small however many Services there are.
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
	// Modes other than random add their tag: "pick-sh-<n>" (sourceHash, n endpoints),
	// "pick-ch-<slots>" (consistentHash, a table of that many slots), "pick-at-<k>"
	// (roundRobin: index k, which the port's rr chain chose); see pickChainFor.
	pickPrefix        = "pick-"
	pickClusterPrefix = "pick-cluster-"
	// roundRobinPrefix starts the names of the round-robin chains: the shared bucket
	// chains "rr-bucket-<b>" (roundRobinBucketPrefix), which hold one rule per port,
	// and the port's own "rr-<id>-<n>" and "rr-<id>-cluster-<n>" for the entries a
	// bucket cannot serve (those whose endpoints are not the cluster IP's: Local
	// policies, the short circuit; all of a port that lost its cluster IP entry). One
	// counter per Service port needs a rule per port; the rule sends each connection,
	// through round-robin-picks, to the shared pick-at-<k> chain of its index.
	roundRobinPrefix = "rr-"
	// affinityPrefix names the chains and sets of ClientIP-affinity Service ports: the
	// buckets "aff-bucket-<b>" (affinityBucketPrefix) and, for entries whose endpoints
	// are not the cluster IP's, "aff-<id>-int|ext|clu", whose rules choose among the
	// internal, external or cluster endpoints, each rule remembering the client in the
	// set of the endpoint it DNATs to, "aff-<id>-<ep>" (the only per-Service objects).
	// A dynamic map could do this without sets per endpoint, but nft 1.0.6 cannot
	// update IPv6 concatenated maps.
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
	// mapRoundRobinPicks sends a round-robin index k to the pick-at-<k> chain, for the
	// rr chains of the ports (one map for all: see rrChain); mapRoundRobinClusterPicks
	// sends it to pick-cluster-at-<k>.
	mapRoundRobinPicks        = "round-robin-picks"
	mapRoundRobinClusterPicks = "round-robin-cluster-picks"
	// mapClusterIPOf and mapClusterPortOf map a consistentHash, roundRobin or affinity
	// entry other than the cluster IP (external and load-balancer IPs, NodePorts) to its
	// Service port's cluster IP and port, so that all the port's entries share the one
	// table of the cluster IP entry, or its bucket rules: pickViaClusterIPChain (and
	// pick-rr-cip, pick-aff-cip) rewrite the destination through them before the
	// lookup. nft 1.0.6 cannot parse a map lookup inside a concatenation ("... map
	// @ids . jhash ... map @slots"), which would need no rewrite.
	mapClusterIPOf   = "cluster-ip-of"
	mapClusterPortOf = "cluster-port-of"
	// mapConsistentSlots is slot . entry -> endpoint: the 256-slot tables of
	// consistentHash ports. The slot is the raw payload of the client address's last
	// byte XOR the rotation (@nh,120,8 ^ 2k), first in the key so that nft can read its
	// own listing back. Typed with typeof (th dport), so only rules of the transaction
	// that creates it may use it: the rotation chains, which a full sync writes with
	// it, recreating it empty instead of flushing it (Skeleton.RecreatedMaps).
	mapConsistentSlots = "ch-slots"
	// rotationPrefix names the 128 shared chains "ch-rotation-<k>" (skeleton), which
	// DNAT through mapConsistentSlots with the slot (client address's last byte) XOR
	// 2k; pick-ch-256 sends a client to chain k = the hash of its /24 (IPv6: /120)
	// prefix mod 128.
	rotationPrefix = "ch-rotation-"
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

// modeTags are the name tags of the shared pick chains of each mode.
var modeTags = map[LBMode]string{LBRandom: "", LBRoundRobin: "at-", LBSourceHash: "sh-", LBConsistentHash: "ch-"}

// pickChainFor names the shared pick chain of a mode over n choices (endpoints, or
// table slots for consistentHash; for roundRobin, the one index k the chain looks up),
// of the cluster-endpoints maps when cluster is set.
func pickChainFor(m LBMode, cluster bool, n int) string {
	prefix := pickPrefix
	if cluster {
		prefix = pickClusterPrefix
	}
	return fmt.Sprintf("%s%s%d", prefix, modeTags[m.OrRandom()], n)
}

// parsePickChain is the inverse of pickChainFor.
func parsePickChain(name string) (m LBMode, cluster bool, n int, err error) {
	rest, ok := strings.CutPrefix(name, pickPrefix)
	if !ok {
		return "", false, 0, fmt.Errorf("bad pick chain name %q", name)
	}
	rest, cluster = strings.CutPrefix(rest, "cluster-")
	m = LBRandom
	for mode, tag := range modeTags {
		if tag != "" && strings.HasPrefix(rest, tag) {
			m, rest = mode, strings.TrimPrefix(rest, tag)
		}
	}
	n, err = strconv.Atoi(rest)
	if err != nil || n < 0 || (n == 0 && m != LBRoundRobin) {
		return "", false, 0, fmt.Errorf("bad pick chain name %q", name)
	}
	return m, cluster, n, nil
}

// roundRobinBucketPrefix names the chains "rr-bucket-<b>" (b < bucketCount) that
// hold the round-robin rules of the Service ports whose cluster IP entry hashes to b
// (bucketOf; affinityBucketPrefix is the same for ClientIP affinity): one rule per
// port, matching the port's cluster IP and port, each with its own counter. Buckets
// instead of a chain per port, because the kernel walks every chain of the table on
// each commit (~18 ns a chain): 10,000 roundRobin ports made every partial sync twice
// as dear as random's. A bucket holds its ports' rules in the order they came; a
// partial sync appends and deletes rules (ledger.countRules, groupEdit) and leaves
// the others, and their counters, alone.
const roundRobinBucketPrefix = roundRobinPrefix + "bucket-"

// bucketCount is the number of bucket chains of each kind: at 10,000 round-robin
// ports, ~40 rules in each, of which a new connection tries half before its own.
const bucketCount = 256

// affinityBucketPrefix names the chains "aff-bucket-<b>", which hold the affinity
// rules of the ClientIP-affinity Service ports whose cluster IP entry hashes to b: per
// port, in order, its rules for remembered clients and for new ones (affinity.rules),
// each matching the port's cluster IP and port first. A chain per port (per class of
// endpoints) was most of the chains of a table at 100,000 Services (~2,200), which
// every commit walks; the port's other entries with the cluster IP's endpoints go
// through "pick-aff-cip-<b>" (pickViaAffinityPrefix), as round robin's do.
const affinityBucketPrefix = affinityPrefix + "bucket-"

// pickViaAffinityPrefix names the chains "pick-aff-cip-<b>": rewrite the destination
// to the cluster IP and port, then go to aff-bucket-<b>.
const pickViaAffinityPrefix = pickPrefix + "aff-cip-"

func affinityBucketChain(b int) string { return affinityBucketPrefix + strconv.Itoa(b) }

func pickViaAffinityChain(b int) string { return pickViaAffinityPrefix + strconv.Itoa(b) }

// pickViaRoundRobinPrefix names the chains "pick-rr-cip-<b>": a port's entries other
// than its cluster IP rewrite the destination to the cluster IP and port (as
// pick-ch-cip does) and go on to bucket b, where the port's one rule, and so its one
// counter, serves them all.
const pickViaRoundRobinPrefix = pickPrefix + "rr-cip-"

func roundRobinBucketChain(b int) string { return roundRobinBucketPrefix + strconv.Itoa(b) }

func pickViaRoundRobinChain(b int) string { return pickViaRoundRobinPrefix + strconv.Itoa(b) }

// parsePickViaBucketChain returns the bucket chain a pick-rr-cip-<b> or
// pick-aff-cip-<b> chain goes on to; ok is false for any other name.
func parsePickViaBucketChain(name string) (next string, ok bool) {
	for prefix, bucket := range map[string]func(int) string{
		pickViaRoundRobinPrefix: roundRobinBucketChain, pickViaAffinityPrefix: affinityBucketChain,
	} {
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			b, err := strconv.Atoi(rest)
			return bucket(b), err == nil && b >= 0 && b < bucketCount
		}
	}
	return "", false
}

// bucketOf is the bucket of the port whose cluster IP entry is en: a hash of the
// entry, so a port keeps its bucket (and its round-robin counter) across changes.
func bucketOf(en entry) int {
	h := fnv.New32a()
	a := en.addr.As16()
	h.Write(a[:])
	h.Write([]byte{byte(en.port >> 8), byte(en.port)})
	h.Write([]byte(en.proto))
	return int(h.Sum32() % bucketCount)
}

// pickViaClusterIPPrefix names the chains "pick-ch-cip-<slots>", which pick through
// the port's cluster IP entry's consistent-hash table of that many slots.
const pickViaClusterIPPrefix = pickPrefix + "ch-cip-"

func pickViaClusterIPChain(slots int) string {
	return pickViaClusterIPPrefix + strconv.Itoa(slots)
}

// parsePickViaClusterIPChain is the inverse of pickViaClusterIPChain; ok is false for
// any other name.
func parsePickViaClusterIPChain(name string) (slots int, ok bool) {
	rest, ok := strings.CutPrefix(name, pickViaClusterIPPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n > 0
}

func endpointsMap(base string, p Protocol) string { return base + "-" + string(p) }

// rotationChain names the rotation chain of rotation k (0..rotations-1).
func rotationChain(k int) string { return rotationPrefix + strconv.Itoa(k) }

// parseRotationChain returns k of rotationChain(k), and whether name is one.
func parseRotationChain(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, rotationPrefix)
	if !ok {
		return 0, false
	}
	k, err := strconv.Atoi(s)
	return k, err == nil && k >= 0
}

// idChars is the length of portID and endpointID: 26 base32 characters, 130 bits of
// sha256. Their inputs are chosen by users (a Service's namespace, name and port; the
// endpoint addresses of a selectorless Service's EndpointSlices), so an ID must be long
// enough that nobody can make one collide with another Service's on purpose, which would
// merge or replace that Service's affinity chains and sets: 2^130 tries for a given
// victim, 2^65 for any pair. The longest name built from them, "aff-<port>-<ep>", has
// 57 characters; the kernel takes chain and set names of up to 255 (NFT_NAME_MAXLEN,
// NFT_SET_MAXNAMELEN 256 with the NUL), and TestAffinityNamesLength checks it.
const idChars = 26

// hashID is the first idChars characters of the lower-case base32 sha256 of s.
func hashID(s string) string {
	sum := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:idChars])
}

// portID is a stable name for a Service port, for its per-Service objects.
func portID(spn ServicePortName, salt any) string {
	return hashID(fmt.Sprintf("%s/%s/%v", spn, spn.Protocol, salt))
}

// endpointID is a stable name for an endpoint inside a Service port.
func endpointID(ep Endpoint) string {
	return hashID(ep.String())
}
