package nodeaddrs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestEncode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes []Node
		want  string
	}{
		{"no nodes is the header alone", nil, header + "\n"},
		{
			"nodes sorted by name, addresses sorted and without repeats",
			[]Node{
				{"node-b", addrs("fd00::2", "10.0.0.2", "10.0.0.2")},
				{"node-a", addrs("192.168.1.1", "10.0.0.1")},
			},
			header + "\nnode-a 10.0.0.1 192.168.1.1\nnode-b 10.0.0.2 fd00::2\n",
		},
		{"a node without addresses is left out", []Node{{"node-a", nil}, {"node-b", addrs("10.0.0.2")}}, header + "\nnode-b 10.0.0.2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Encode(tc.nodes); got != tc.want {
				t.Errorf("Encode:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	nodes := []Node{{"a", addrs("10.0.0.1", "fd00::1")}, {"b", addrs("10.0.0.2")}}
	got, err := Decode(Encode(nodes))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(nodes, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, text, wantErr string
	}{
		{"empty", "", "no header"},
		{"another format", "node-a 10.0.0.1\n", "line 1: not a node address list"},
		{"a name alone", header + "\nnode-a\n", "line 2: want a node name and at least one address"},
		{"a bad address", header + "\nnode-a 10.0.0.1\nnode-b 10.0.0.300\n", "line 3: node node-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Decode(%q) = %v, want an error containing %q", tc.text, err, tc.wantErr)
			}
		})
	}
}

func TestFromNode(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n.example"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
		{Type: corev1.NodeInternalIP, Address: "::ffff:10.0.0.1"},
		{Type: corev1.NodeInternalIP, Address: "10.0.0.1"},
	}}}
	got, dropped := FromNode(n)
	want := Node{"n", addrs("10.0.0.1", "203.0.113.1")}
	if got.Name != want.Name || !slices.Equal(got.Addrs, want.Addrs) || dropped != 0 {
		t.Errorf("FromNode = %v, %d dropped, want %v, 0 (a hostname is no address; a mapped IPv4 is the IPv4)", got, dropped, want)
	}
}

// TestFromNodeBoundsAddresses: a Node listing many addresses (its kubelet writes them)
// publishes its first MaxAddrsPerNode, so that one node cannot grow the list past what
// a ConfigMap holds.
func TestFromNodeBoundsAddresses(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "greedy"}}
	var first []string
	for i := range 1000 {
		a := fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		if i < MaxAddrsPerNode {
			first = append(first, a)
		}
	}
	got, dropped := FromNode(n)
	if want := addrs(first...); !slices.Equal(got.Addrs, want) || dropped != 1000-MaxAddrsPerNode {
		t.Errorf("FromNode kept %v and dropped %d, want the first %d (%v) and %d dropped", got.Addrs, dropped, MaxAddrsPerNode, want, 1000-MaxAddrsPerNode)
	}
	if size := len(Encode([]Node{got})); size > 512 {
		t.Errorf("one Node's line is %d bytes", size)
	}
}

// TestSizeAt5000Nodes: 5,000 Nodes with three addresses each (two IPv4, one IPv6 of the
// longest form) and cloud-length names fit in a ConfigMap (536 kB, half of it); the size check
// refuses the list once it does not.
func TestSizeAt5000Nodes(t *testing.T) {
	var nodes []Node
	for i := range 5000 {
		nodes = append(nodes, Node{
			Name: fmt.Sprintf("ip-10-%d-%d-%d.eu-central-1.compute.internal", i>>16, (i>>8)&255, i&255),
			Addrs: []netip.Addr{
				netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}),
				netip.AddrFrom4([4]byte{203, byte(i >> 16), byte(i >> 8), byte(i)}),
				netip.MustParseAddr(fmt.Sprintf("fd12:3456:789a:bcde:f012:3456:789a:%x", 0x1000+i)),
			},
		})
	}
	text := Encode(nodes)
	if err := CheckSize(text); err != nil {
		t.Fatalf("5,000 nodes × 3 addresses: %v", err)
	}
	t.Logf("5,000 nodes × 3 addresses: %d bytes (%.0f%% of %d)", len(text), 100*float64(len(text))/float64(MaxSize), MaxSize)
	// 253-character names (the longest a Node's may be): about 3,000 such Nodes fit.
	var long []Node
	for i := range 5000 {
		long = append(long, Node{Name: fmt.Sprintf("%0253d", i), Addrs: nodes[i].Addrs})
	}
	if err := CheckSize(Encode(long)); err == nil || !strings.Contains(err.Error(), "over the") {
		t.Errorf("5,000 nodes with 253-character names: CheckSize = %v, want the limit's error", err)
	}
}
