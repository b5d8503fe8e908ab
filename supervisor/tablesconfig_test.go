package supervisor

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
)

// TestPrimaryNodePortAddresses: nodePortAddresses "primary" serves NodePorts on the
// addresses kube-proxy's "primary" does (GetNodeHostIPs): per family the first
// InternalIP, else the first ExternalIP; never a second address of a family, and none of
// a family the Node has no address of.
func TestPrimaryNodePortAddresses(t *testing.T) {
	type addr struct {
		typ corev1.NodeAddressType
		ip  string
	}
	internal := func(ip string) addr { return addr{corev1.NodeInternalIP, ip} }
	external := func(ip string) addr { return addr{corev1.NodeExternalIP, ip} }
	tests := []struct {
		name   string
		addrs  []addr
		want4  []string
		want6  []string
		noNode bool
	}{
		{name: "one InternalIP", addrs: []addr{internal("10.0.0.5")}, want4: []string{"10.0.0.5"}},
		{name: "two InternalIPs: the first only",
			addrs: []addr{internal("10.0.0.9"), internal("10.0.0.5")}, want4: []string{"10.0.0.9"}},
		{name: "an InternalIP beats an ExternalIP listed before it",
			addrs: []addr{external("203.0.113.7"), internal("10.0.0.5")}, want4: []string{"10.0.0.5"}},
		{name: "ExternalIP only", addrs: []addr{{corev1.NodeHostName, "node-1"}, external("203.0.113.7"), external("203.0.113.8")},
			want4: []string{"203.0.113.7"}},
		{name: "dual stack: the first InternalIP of each family",
			addrs: []addr{internal("fd00::5"), internal("10.0.0.5"), internal("fd00::6"), internal("10.0.0.6")},
			want4: []string{"10.0.0.5"}, want6: []string{"fd00::5"}},
		{name: "dual stack: the other family from the ExternalIPs when no InternalIP has it",
			addrs: []addr{internal("10.0.0.5"), external("203.0.113.7"), external("2001:db8::7")},
			want4: []string{"10.0.0.5"}, want6: []string{"2001:db8::7"}},
		{name: "Hostname and InternalDNS only: none", addrs: []addr{{corev1.NodeHostName, "node-1"}, {corev1.NodeInternalDNS, "node-1.local"}}},
		{name: "none", addrs: nil},
		{name: "Node not read yet: none", noNode: true},
		{name: "a loopback primary serves nothing", addrs: []addr{internal("127.0.0.1"), internal("10.0.0.5")}},
		{name: "an unparsable first address is skipped", addrs: []addr{internal("not-an-ip"), internal("10.0.0.5")},
			want4: []string{"10.0.0.5"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var node *corev1.Node
			if !tc.noNode {
				node = &corev1.Node{}
				for _, a := range tc.addrs {
					node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: a.typ, Address: a.ip})
				}
			}
			listed := false
			tc2 := tableConfigs{cfg: &config.Config{MasqueradeBit: ptr.To(14)}, logger: klog.Background(),
				interfaceAddrs: func() ([]netip.Addr, error) { listed = true; return nil, nil }}
			for _, npa := range [][]string{{config.NodePortAddressesPrimary}, nil} {
				cfg := tc2.forInstance(config.Instance{Name: "a", Slot: ptr.To(0), NodePortAddresses: npa}, node)
				for _, fam := range []struct {
					fam  tables.Family
					want []string
				}{{tables.IPv4, tc.want4}, {tables.IPv6, tc.want6}} {
					var got []string
					for _, a := range tables.ServedNodePortIPs(fam.fam, cfg.NodePortIPs) {
						got = append(got, a.String())
					}
					if !slices.Equal(got, fam.want) {
						t.Errorf("nodePortAddresses %q, IPv%d: NodePorts on %q, want %q", npa, fam.fam, got, fam.want)
					}
				}
			}
			if listed {
				t.Error("primary listed the interfaces' addresses")
			}
		})
	}
}

// TestMatchNodePortCIDRs: CIDR nodePortAddresses match the interface addresses inside
// them, never loopback, and link-local ones only for a link-local CIDR (pod veths' come
// and go with every pod).
func TestMatchNodePortCIDRs(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("fe80::1"),
		netip.MustParseAddr("169.254.1.1"), netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("::1")}
	for _, tc := range []struct {
		name  string
		cidrs []string
		want  []string
	}{
		{name: "every address: no loopback, no link-local", cidrs: []string{"0.0.0.0/0", "::/0"}, want: []string{"10.0.0.5", "fd00::5"}},
		{name: "a link-local CIDR matches link-local addresses", cidrs: []string{"fe80::/64", "169.254.0.0/16"}, want: []string{"fe80::1", "169.254.1.1"}},
		{name: "the CIDRs' order, no repeats", cidrs: []string{"fd00::/64", "10.0.0.0/8", "10.0.0.0/24"}, want: []string{"fd00::5", "10.0.0.5"}},
		{name: "nothing inside", cidrs: []string{"192.0.2.0/24"}, want: []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := addrStrings(matchNodePortCIDRs(tc.cidrs, host)); !slices.Equal(got, tc.want) {
				t.Errorf("%q: %q, want %q", tc.cidrs, got, tc.want)
			}
		})
	}
}
