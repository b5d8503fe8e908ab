package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// extBridge is the outside namespace's bridge: the nodes' LAN.
const extBridge = "lan0"

// setupNetwork creates the outside namespace with the LAN bridge and the nodes'
// namespaces, each joined to the bridge by a veth (this kernel has no dummy links): the
// outside namespace is every node's default gateway, so traffic a node routes out
// (unanswered Service traffic included) dies in a namespace that forwards nothing,
// instead of meeting the host's default route. Addresses go in without duplicate address
// detection, which would leave the IPv6 ones unusable for a second or two.
func (c *Cluster) setupNetwork(ctx context.Context) error {
	for _, ns := range c.st.Namespaces {
		if err := run(ctx, "ip", "netns", "add", ns); err != nil {
			return err
		}
	}
	ext := []string{"ip", "-n", c.ExtNS}
	cmds := [][]string{
		append(ext, "link", "set", "lo", "up"),
		append(ext, "link", "add", extBridge, "type", "bridge"),
		append(ext, "addr", "add", ExtIP+"/24", "dev", extBridge),
		append(ext, "addr", "add", ExtIPv6+"/64", "dev", extBridge, "nodad"),
		append(ext, "link", "set", extBridge, "up"),
	}
	for _, n := range c.Nodes {
		node := []string{"ip", "-n", n.NS}
		port := fmt.Sprintf("n%d", n.index+1)
		cmds = append(cmds,
			append(node, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", c.ExtNS),
			append(node, "link", "set", "lo", "up"),
			append(node, "addr", "add", n.IP+"/24", "dev", "eth0"),
			append(node, "addr", "add", n.IPv6+"/64", "dev", "eth0", "nodad"),
			append(node, "link", "set", "eth0", "up"),
			append(ext, "link", "set", port, "master", extBridge),
			append(ext, "link", "set", port, "up"),
			append(node, "route", "add", "default", "via", ExtIP),
			append(node, "-6", "route", "add", "default", "via", ExtIPv6),
		)
	}
	// The outside reaches the Services through the first node, for NodePorts and
	// external traffic, as a router in front of a cluster would.
	for _, cidr := range ServiceCIDRs {
		cmds = append(cmds, append(ext, "route", "add", cidr, "via", gatewayFor(c.Nodes[0], cidr)))
	}
	for _, cmd := range cmds {
		if err := run(ctx, cmd[0], cmd[1:]...); err != nil {
			return err
		}
	}
	// Pods forward through the node; bridged pod-to-pod replies must see the node's
	// conntrack (br_netfilter) for Service NAT to be undone.
	for _, n := range c.Nodes {
		for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1",
			"net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1"} {
			if err := run(ctx, "ip", "netns", "exec", n.NS, "sysctl", "-qw", sysctl); err != nil {
				return err
			}
		}
	}
	return nil
}

// gatewayFor is the node's address of cidr's family.
func gatewayFor(n *Node, cidr string) string {
	if strings.Contains(cidr, ":") {
		return n.IPv6
	}
	return n.IP
}

// routePodCIDRs routes, on every node, every other node's pod CIDRs (both families) to
// that node's address, once kube-controller-manager has allocated them, as a routing CNI
// does: pods reach pods on other nodes by their own addresses.
func (c *Cluster) routePodCIDRs(ctx context.Context) error {
	for _, n := range c.Nodes {
		for _, other := range c.Nodes {
			if other == n {
				continue
			}
			for _, cidr := range other.PodCIDRs {
				if _, err := n.Run(ctx, "ip", "route", "replace", cidr, "via", gatewayFor(other, cidr)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// waitPodCIDRs waits for the node's Node object to have a pod CIDR of each family
// (kube-controller-manager allocates them once the kubelet has registered it).
func (n *Node) waitPodCIDRs(ctx context.Context) error {
	return poll(ctx, 90*time.Second, n.Name+"'s pod CIDRs", func() (bool, error) {
		if err := n.c.childrenRunning(); err != nil {
			return false, err
		}
		node, err := n.c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || len(node.Spec.PodCIDRs) < len(ClusterCIDRs) {
			return false, nil
		}
		for _, cidr := range node.Spec.PodCIDRs {
			if _, err := netip.ParsePrefix(cidr); err != nil {
				return false, fmt.Errorf("pod CIDR %q: %w", cidr, err)
			}
		}
		n.PodCIDRs = node.Spec.PodCIDRs
		return true, nil
	})
}

// run runs a command, returning its output with the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Run runs a command inside the node's network namespace and returns its output.
func (n *Node) Run(ctx context.Context, name string, args ...string) (string, error) {
	return inNS(ctx, n.NS, "", name, args...)
}

// RunStdin runs a command inside the node's namespace with stdin as its input.
func (n *Node) RunStdin(ctx context.Context, stdin, name string, args ...string) (string, error) {
	return inNS(ctx, n.NS, stdin, name, args...)
}

// InExt runs a command inside the outside namespace.
func (c *Cluster) InExt(ctx context.Context, name string, args ...string) (string, error) {
	return inNS(ctx, c.ExtNS, "", name, args...)
}

func inNS(ctx context.Context, ns, stdin, name string, args ...string) (string, error) {
	full := append([]string{"--net=/run/netns/" + ns, name}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s %s: %w: %s", ns, name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
