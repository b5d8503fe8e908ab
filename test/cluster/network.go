package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// setupNetwork creates the node and outside namespaces joined by a veth (this kernel has
// no dummy links): the node's address on one end, its default gateway on the other, so
// traffic the node routes out (unanswered Service traffic included) dies in a namespace
// that forwards nothing, instead of meeting the host's default route.
func (c *Cluster) setupNetwork(ctx context.Context) error {
	for _, ns := range []string{c.NodeNS, c.ExtNS} {
		if err := run(ctx, "ip", "netns", "add", ns); err != nil {
			return err
		}
	}
	node := []string{"ip", "-n", c.NodeNS}
	ext := []string{"ip", "-n", c.ExtNS}
	cmds := [][]string{
		append(node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", c.ExtNS),
		append(node, "link", "set", "lo", "up"),
		append(node, "addr", "add", NodeIP+"/24", "dev", "eth0"),
		append(node, "link", "set", "eth0", "up"),
		append(ext, "link", "set", "lo", "up"),
		append(ext, "addr", "add", ExtIP+"/24", "dev", "eth0"),
		append(ext, "link", "set", "eth0", "up"),
		append(node, "route", "add", "default", "via", ExtIP),
		// Routes to the node's Services from outside, for NodePorts and external traffic.
		append(ext, "route", "add", ServiceCIDR, "via", NodeIP),
	}
	for _, cmd := range cmds {
		if err := run(ctx, cmd[0], cmd[1:]...); err != nil {
			return err
		}
	}
	// Pods forward through the node; bridged pod-to-pod replies must see the node's
	// conntrack (br_netfilter) for Service NAT to be undone.
	for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"} {
		if err := run(ctx, "ip", "netns", "exec", c.NodeNS, "sysctl", "-qw", sysctl); err != nil {
			return err
		}
	}
	return nil
}

// run runs a command, returning its output with the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// InNode runs a command inside the node's network namespace and returns its output.
func (c *Cluster) InNode(ctx context.Context, name string, args ...string) (string, error) {
	return c.inNS(ctx, c.NodeNS, name, args...)
}

// InExt runs a command inside the outside namespace.
func (c *Cluster) InExt(ctx context.Context, name string, args ...string) (string, error) {
	return c.inNS(ctx, c.ExtNS, name, args...)
}

func (c *Cluster) inNS(ctx context.Context, ns, name string, args ...string) (string, error) {
	full := append([]string{"--net=/run/netns/" + ns, name}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s %s: %w: %s", ns, name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// inNodeStdin runs a command inside the node's namespace with stdin as its input.
func (c *Cluster) inNodeStdin(ctx context.Context, stdin, name string, args ...string) (string, error) {
	full := append([]string{"--net=/run/netns/" + c.NodeNS, name}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("in %s: %s %s: %w", c.NodeNS, name, strings.Join(args, " "), err)
	}
	return string(out), nil
}
