// Package nodeaddrs publishes every Node's addresses in one ConfigMap, so that the
// supervisors that reserve other nodes' addresses (reserveOtherNodeAddresses) watch one
// small object instead of every Node: a Node's status changes at least every five
// minutes (kubelet's heartbeat) and its addresses almost never, so a watch of every Node
// from every node costs the API server events that grow with the square of the nodes,
// while the published list changes, and is sent to each node once, only when an address
// does.
//
// One writer (Writer, run by `shardproxy node-addresses` with leader election) watches
// the Nodes and writes the list; each supervisor with otherNodeAddresses: published
// reads it (Decode) through a watch of that ConfigMap alone.
package nodeaddrs

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// DefaultName is the published ConfigMap's name. It does not start with
// "shardproxy-node-", the node statuses' prefix (migrate.ConfigMapPrefix), which the
// admission policy of deploy/ lets each node's supervisor write for its own node: a Node
// named "addresses" must not be able to write the list.
const DefaultName = "shardproxy-nodeaddresses"

// DataKey is the key of the ConfigMap's data that holds the list.
const DataKey = "nodes"

// header is the list's first line; Decode refuses a list without it (another format).
const header = "# shardproxy node addresses v1: one line per Node, its name then its IP addresses"

// MaxSize bounds the list's text: the API server refuses a ConfigMap whose data exceed
// 1 MiB (keys and values together).
const MaxSize = 1<<20 - len(DataKey)

// Node is one Node's name and IP addresses.
type Node struct {
	Name  string
	Addrs []netip.Addr
}

// MaxAddrsPerNode bounds the addresses published for one Node: a kubelet writes its own
// Node's status.addresses, and the API server sets no limit on them, so without a bound
// one node could grow the list past MaxSize, and the writer would then publish nothing
// for any Node. Kubelets report a few (InternalIP, ExternalIP, per family).
const MaxAddrsPerNode = 8

// FromNode takes a Node's name and the addresses of its status that are IP addresses
// (a hostname address is not one), sorted and without repeats: the first
// MaxAddrsPerNode distinct ones in the status's order (the kubelet lists its primary
// addresses first). dropped counts the IP addresses past them.
func FromNode(n *corev1.Node) (node Node, dropped int) {
	node = Node{Name: n.Name}
	for _, a := range n.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if err != nil || slices.Contains(node.Addrs, ip.Unmap()) {
			continue
		}
		if len(node.Addrs) == MaxAddrsPerNode {
			dropped++
			continue
		}
		node.Addrs = append(node.Addrs, ip.Unmap())
	}
	slices.SortFunc(node.Addrs, netip.Addr.Compare)
	return node, dropped
}

// Encode writes the list: the header, then one line per Node with an address, sorted by
// name, "<name> <addr> <addr>...", the addresses sorted. The same Nodes give the same
// text whatever their order, so the writer compares texts to know whether anything
// changed.
func Encode(nodes []Node) string {
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	var b strings.Builder
	b.WriteString(header)
	b.WriteByte('\n')
	for _, n := range sorted {
		addrs := slices.Clone(n.Addrs)
		slices.SortFunc(addrs, netip.Addr.Compare)
		addrs = slices.Compact(addrs)
		if len(addrs) == 0 || n.Name == "" {
			continue
		}
		b.WriteString(n.Name)
		for _, a := range addrs {
			b.WriteByte(' ')
			b.WriteString(a.String())
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Decode reads a list Encode wrote. Any line it cannot read fails the whole list (the
// caller keeps what it knew), naming the line.
func Decode(text string) ([]Node, error) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), MaxSize)
	var out []Node
	line := 0
	for sc.Scan() {
		line++
		l := sc.Text()
		if line == 1 {
			if l != header {
				return nil, fmt.Errorf("line 1: not a node address list (want the header %q)", header)
			}
			continue
		}
		fields := strings.Fields(l)
		if len(fields) < 2 {
			return nil, fmt.Errorf("line %d: want a node name and at least one address, got %q", line, l)
		}
		n := Node{Name: fields[0]}
		for _, f := range fields[1:] {
			ip, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("line %d: node %s: %w", line, n.Name, err)
			}
			n.Addrs = append(n.Addrs, ip.Unmap())
		}
		out = append(out, n)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if line == 0 {
		return nil, fmt.Errorf("empty: not a node address list (no header)")
	}
	return out, nil
}

// ErrTooLarge is CheckSize's error: a list the API server would refuse to store.
var ErrTooLarge = errors.New("too large to publish")

// CheckSize refuses a list the API server would refuse to store.
func CheckSize(text string) error {
	if len(text) > MaxSize {
		return fmt.Errorf("the node address list is %d bytes, over the %d a ConfigMap holds: %w", len(text), MaxSize, ErrTooLarge)
	}
	return nil
}
