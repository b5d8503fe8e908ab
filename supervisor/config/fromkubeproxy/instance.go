package fromkubeproxy

import (
	"fmt"
	"net/netip"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// everyAddress is nodePortAddresses for "every node address", kube-proxy's iptables and
// ipvs default.
var everyAddress = []string{"0.0.0.0/0", "::/0"}

// instance builds the one instance: the default one, or beside kube-proxy the one that
// serves the proxy name "shardproxy".
func (c *converter) instance() (*mapNode, error) {
	m := newMap()
	if c.opts.Alongside {
		m.set("name", "migration", "")
		m.set("proxyNames", []string{"shardproxy"}, commentLines("Label a Service service.kubernetes.io/service-proxy-name: shardproxy (or use",
			"`shardproxy migrate move --to shardproxy`) to move it from kube-proxy to this instance."))
		m.set("slot", 0, "")
	} else {
		m.set("name", "default", "")
		m.set("default", true, commentLines("Serves every Service without service.kubernetes.io/service-proxy-name, as kube-proxy did."))
		m.set("slot", 0, "")
	}
	c.nodePortAddresses(m)
	if err := c.detectLocal(m); err != nil {
		return nil, err
	}
	_, all, sync, minSync := c.proxierSettings()
	if all {
		m.set("masqueradeAll", true, commentLines(fmt.Sprintf("From %s.masqueradeAll.", c.section())))
	}
	min := defaultMinSync
	if minSync.Duration != 0 {
		min = minSync.Duration
	}
	syncP := defaultSyncPeriod
	if sync.Duration != 0 {
		syncP = sync.Duration
	}
	if mode, ok := ipvsSchedulers[c.kp.IPVS.Scheduler]; ok && c.mode == "ipvs" {
		m.set("loadBalancing", newMap().set("mode", mode, ""), commentLines(
			fmt.Sprintf("From ipvs.scheduler %q: the mode that picks endpoints as it did.", orDefault(c.kp.IPVS.Scheduler, "rr"))))
	}
	m.set("minSyncPeriod", min.String(), commentLines(fmt.Sprintf("From %s.minSyncPeriod and .syncPeriod (unset: kube-proxy's 1s and 30s).", c.syncSection())))
	m.set("syncPeriod", syncP.String(), "")
	m.set("tenant", c.tenant(), commentLines(
		"kube-proxy serves every external IP and load-balancer IP a Service names; so does this.",
		"Narrow both to the ranges your Services may use (CVE-2020-8554: a user who can write",
		"spec.externalIPs can otherwise take any address's traffic)."))
	return m, nil
}

// syncSection names the section the sync periods come from.
func (c *converter) syncSection() string {
	if c.mode == "ipvs" {
		return "ipvs"
	}
	return c.section()
}

func (c *converter) tenant() *mapNode {
	t := newMap()
	if c.opts.Alongside {
		ns := c.opts.Namespaces
		if len(ns) == 0 {
			ns = []string{"default"}
		}
		t.set("namespaces", ns, commentLines("Only Services of these namespaces are served once labeled: list every namespace you migrate."))
	}
	t.set("externalIPCIDRs", everyAddress, "")
	t.set("loadBalancerCIDRs", everyAddress, "")
	return t
}

// nodePortAddresses carries where NodePorts are served: an empty list is "primary" in
// kube-proxy's nftables mode and every node address in its iptables and ipvs modes.
func (c *converter) nodePortAddresses(m *mapNode) {
	list := c.kp.NodePortAddresses
	if c.mode == "iptables" {
		if lnp := c.kp.IPTables.LocalhostNodePorts; lnp == nil || *lnp {
			c.note("iptables.localhostNodePorts", true, "shardproxy never serves NodePorts on 127.0.0.1 (as kube-proxy's nftables mode)")
		}
	}
	var loopback []string
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().IsLoopback() {
			loopback = append(loopback, s)
		}
	}
	if len(loopback) > 0 {
		c.note("nodePortAddresses", strings.Join(loopback, ","), "loopback addresses never serve NodePorts in shardproxy")
	}
	switch {
	case len(list) == 0 && c.mode == "nftables", len(list) == 1 && list[0] == config.NodePortAddressesPrimary:
		m.set("nodePortAddresses", []string{config.NodePortAddressesPrimary}, commentLines("The Node's primary IP of each family (its first InternalIP, else its first ExternalIP), as kube-proxy's."))
	case len(list) == 0:
		m.set("nodePortAddresses", everyAddress, commentLines(fmt.Sprintf("Every node address, as kube-proxy's %s mode with nodePortAddresses unset.", c.mode)))
	default:
		m.set("nodePortAddresses", list, commentLines("From nodePortAddresses."))
	}
}

// detectLocal carries how local traffic is told apart.
func (c *converter) detectLocal(m *mapNode) error {
	kp := c.kp
	mode := orDefault(string(kp.DetectLocalMode), defaultDetectLocal)
	d := newMap()
	switch mode {
	case "ClusterCIDR":
		if kp.ClusterCIDR == "" {
			c.note("detectLocalMode", mode, "without clusterCIDR kube-proxy detects no local traffic; neither does this configuration")
			return nil
		}
		d.set("mode", mode, "").set("clusterCIDRs", strings.Split(kp.ClusterCIDR, ","), "")
	case "NodeCIDR":
		d.set("mode", mode, "")
	case "BridgeInterface":
		d.set("mode", mode, "").set("bridgeInterface", kp.DetectLocal.BridgeInterface, "")
	case "InterfaceNamePrefix":
		d.set("mode", mode, "").set("interfaceNamePrefix", kp.DetectLocal.InterfaceNamePrefix, "")
	default:
		return fmt.Errorf("detectLocalMode %q is not one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix", mode)
	}
	if mode != "ClusterCIDR" && kp.ClusterCIDR != "" {
		c.note("clusterCIDR", kp.ClusterCIDR, fmt.Sprintf("used only by detectLocalMode ClusterCIDR, by kube-proxy too; this is %s", mode))
	}
	m.set("detectLocal", d, commentLines("From detectLocalMode, detectLocal and clusterCIDR."))
	return nil
}

// mapNode builds a YAML mapping in order, with comments.
type mapNode struct{ n *yaml.Node }

func newMap() *mapNode { return &mapNode{n: &yaml.Node{Kind: yaml.MappingNode}} }

// set appends key: v with a head comment (already "# "-prefixed, or empty); lists of
// scalars are written in flow style.
func (m *mapNode) set(key string, v any, comment string) *mapNode {
	k := &yaml.Node{Kind: yaml.ScalarNode, Value: key, HeadComment: comment}
	var val *yaml.Node
	switch x := v.(type) {
	case *mapNode:
		val = x.n
	case *yaml.Node:
		val = x
	default:
		val = &yaml.Node{}
		if err := val.Encode(x); err != nil {
			// Only plain values reach here, which always encode.
			val = &yaml.Node{Kind: yaml.ScalarNode, Value: fmt.Sprint(x)}
		}
		if val.Kind == yaml.SequenceNode {
			val.Style = yaml.FlowStyle
		}
	}
	m.n.Content = append(m.n.Content, k, val)
	return m
}

func seq(items ...*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.SequenceNode, Content: items}
}

// commentLines makes a YAML comment of lines ("" when there are none).
func commentLines(lines ...string) string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		if l == "" {
			out = append(out, "#")
			continue
		}
		out = append(out, "# "+l)
	}
	return strings.Join(out, "\n")
}
