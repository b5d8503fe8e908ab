// Package legacy cleans up after an upstream kube-proxy in iptables or IPVS mode once it
// is gone from the node, for nodes migrated to shardproxy. It is what
// `shardproxy cleanup --legacy iptables|ipvs` runs. It also reads, for a migration's
// rollback, which Services a running kube-proxy has programmed, in iptables or nftables
// mode (ProgrammedServices).
//
// What is removed, exactly (chains.go lists the names):
//
//   - In the nat, filter and mangle tables of iptables and ip6tables (every backend that
//     is installed: iptables-nft and iptables-legacy), the chains kube-proxy creates in
//     either mode: KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING, KUBE-MARK-MASQ,
//     KUBE-EXTERNAL-SERVICES, KUBE-FORWARD, KUBE-PROXY-FIREWALL, KUBE-PROXY-CANARY, the
//     per-Service chains KUBE-SVC-*, KUBE-SVL-*, KUBE-SEP-*, KUBE-EXT-*, KUBE-FW-* (and
//     KUBE-XLB-* of kube-proxy before v1.24), and IPVS mode's KUBE-NODE-PORT,
//     KUBE-LOAD-BALANCER, KUBE-SOURCE-RANGES-FIREWALL, KUBE-IPVS-FILTER and
//     KUBE-IPVS-OUT-FILTER. Both modes' chains go whichever mode is named: once kube-proxy
//     is gone, the other mode's chains (left by an earlier mode switch) are garbage too.
//   - Every rule, in any chain that stays, whose target (-j or -g) is one of those chains:
//     kube-proxy's jumps from PREROUTING, INPUT, FORWARD, OUTPUT and POSTROUTING, and
//     anything else that jumps into them (a jump to a chain that is gone cannot stay).
//     Each removed rule is reported.
//
// What stays: every other rule and chain, including kubelet's KUBE-FIREWALL,
// KUBE-KUBELET-CANARY and KUBE-MARK-DROP (kube-proxy also writes a KUBE-FIREWALL, but it
// is kubelet's, and upstream's own cleanup keeps it too), other components' KUBE-*
// chains (kube-router's KUBE-ROUTER-*, KUBE-NWPLCY-*, KUBE-POD-FW-*), and every nftables
// table that iptables does not own, shardproxy's among them. Each table is changed by one
// iptables-restore --noflush transaction, so a failure leaves it as it was.
//
// With --legacy ipvs, also (ipvs.go):
//
//   - the IPVS virtual services kube-proxy created: those on an address bound to the
//     kube-ipvs0 dummy interface (ClusterIPs, external and load-balancer IPs), and those
//     on another local address whose port is in the NodePort range (NodePorts). Virtual
//     services on other addresses or ports, and firewall-mark services, are someone
//     else's and stay (upstream's cleanup flushes every virtual service instead);
//   - the kube-ipvs0 interface;
//   - the ipsets IPVS mode creates (KUBE-CLUSTER-IP, KUBE-NODE-PORT-TCP, ...), after the
//     iptables rules that referenced them.
//
// Refusal: all of this breaks a kube-proxy that is still running, so Cleanup first looks
// for one (process.go): a process named kube-proxy in this network namespace, or
// something answering kube-proxy's /proxyMode on its metrics address. It refuses,
// naming the pid, unless Options.Force.
package legacy
