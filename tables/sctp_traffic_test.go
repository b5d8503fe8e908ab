package tables

import (
	"net/netip"
	"testing"

	"github.com/shardproxy/shardproxy/test/netns"
)

// TestSCTPThroughRealKernel sends real SCTP associations through the generated rules, in
// the topology of TestTrafficThroughRealKernel: a cluster IP from a pod and a NodePort
// from outside the cluster, each with a local and a remote endpoint, in both families.
// It needs a kernel with SCTP: this host's has none, so the host's CI layer leaves it out
// by name (hack/layers.sh) and hack/kernels.sh runs it on Debian's kernels, where a
// missing sctp module fails it (CI mode) rather than skipping it.
func TestSCTPThroughRealKernel(t *testing.T) {
	requireRoot(t)
	netns.RequireSCTP(t)
	for _, fam := range []Family{IPv4, IPv6} {
		t.Run(fam.String(), func(t *testing.T) {
			tp := netns.New(t)
			n := &trafficNode{tp: tp, fam: fam}
			// The endpoints serve SCTP only: a reply proves the association was
			// DNATed to an SCTP endpoint, by SCTP rules.
			tp.StartServer(tp.Pod1, "pod1", "sctp", 3868)
			tp.StartServer(tp.Remote, "remote", "sctp", 3868)
			pod1 := Endpoint{IP: n.a(netns.Pod1IPv4, netns.Pod1IPv6), Port: 3868}
			remote := Endpoint{IP: n.a(netns.RemoteIPv4, netns.RemoteIPv6), Port: 3868}
			clusterIP := n.a("172.31.0.40", "fd00:31::40")
			// A TCP port of the same Service and number beside it: SCTP must reach
			// only the SCTP port's endpoints, and the TCP rules must not take SCTP.
			sctp := &ServicePort{
				Name:     ServicePortName{Namespace: "ns", Name: "diameter", Port: "sctp"},
				Protocol: SCTP, Port: 3868, NodePort: 30868, ClusterIP: clusterIP,
				ClusterEndpoints: []Endpoint{pod1, remote}, LocalEndpoints: []Endpoint{pod1}, HasEndpoints: true,
			}
			tcp := &ServicePort{
				Name:     ServicePortName{Namespace: "ns", Name: "diameter", Port: "tcp"},
				Protocol: TCP, Port: 3868, NodePort: 30868, ClusterIP: clusterIP,
				ClusterEndpoints: []Endpoint{{IP: pod1.IP, Port: 3869}}, HasEndpoints: true,
			}
			n.load(t, "team-a", 0, services(sctp, tcp))

			pod2 := n.a(netns.Pod2IPv4, netns.Pod2IPv6).String()
			nodeIP := n.a(netns.NodeIPv4, netns.NodeIPv6)
			// Masquerading picks the address of the interface the packet leaves on.
			masqToPod1 := n.a(netns.PodGatewayIPv4, netns.PodGatewayIPv6).String()
			masqToRemote := n.a(netns.NodeClusterIPv4, netns.NodeClusterIPv6).String()
			for _, tc := range []struct {
				name string
				from string
				dst  netip.Addr
				port int
				want map[string]string // server → the source it must see
			}{
				{"cluster IP from a pod reaches both endpoints with the pod's IP", tp.Pod2, clusterIP, 3868,
					map[string]string{"pod1": pod2, "remote": pod2}},
				{"NodePort from outside reaches both endpoints, masqueraded", tp.Client, nodeIP, 30868,
					map[string]string{"pod1": masqToPod1, "remote": masqToRemote}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					reach(t, tp, tc.from, "sctp", tc.dst, tc.port, tc.want)
				})
			}
		})
	}
}
