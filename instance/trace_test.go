package instance

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/tracer"
)

// TestTraceFromAPIObjects follows packets through the rules a Proxy programs from
// Services and EndpointSlices: the model's decisions (readiness, terminating fallback,
// topology, named target ports, dual stack, malformed input) checked where they matter,
// at the packet, over the fake nftables.
func TestTraceFromAPIObjects(t *testing.T) {
	pod := netip.MustParseAddr("10.244.1.50") // a pod on this node
	pod6 := netip.MustParseAddr("fd00:10:244:1::50")
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		pkt    tracer.Packet
		want   []string
	}{{
		name:   "a named target port resolves through the slice's port",
		svc:    service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want:   []string{"accept dnat 10.244.2.2:8080"},
	}, {
		name: "an endpoint in two slices is one endpoint",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{
			v4Slice("web-1", ep("10.244.2.2", "node-b"), ep("10.244.3.2", "node-c")),
			v4Slice("web-2", ep("10.244.2.2", "node-b")),
		},
		pkt:  tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want: []string{"accept dnat 10.244.2.2:8080", "accept dnat 10.244.3.2:8080"},
	}, {
		name:   "ready endpoints win over serving terminating ones",
		svc:    service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"), ep("10.244.3.2", "node-c", terminating(true)))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want:   []string{"accept dnat 10.244.2.2:8080"},
	}, {
		name: "without ready endpoints, serving terminating ones are used",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
			ep("10.244.2.2", "node-b", terminating(true)), ep("10.244.3.2", "node-c", terminating(false)), ep("10.244.3.3", "node-c", notReady))},
		pkt:  tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want: []string{"accept dnat 10.244.2.2:8080"},
	}, {
		name:   "no serving endpoint at all: rejected",
		svc:    service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b", terminating(false)), ep("10.244.3.3", "node-c", notReady))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want:   []string{"reject"},
	}, {
		name: "zone hints keep traffic in this node's zone",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
			ep("10.244.2.2", "node-b", forZones(thisZone)), ep("10.244.3.2", "node-c", forZones("zone-b")))},
		pkt:  tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want: []string{"accept dnat 10.244.2.2:8080"},
	}, {
		name: "incomplete hints: every endpoint",
		svc:  service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
			ep("10.244.2.2", "node-b", forZones(thisZone)), ep("10.244.3.2", "node-c"))},
		pkt:  tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want: []string{"accept dnat 10.244.2.2:8080", "accept dnat 10.244.3.2:8080"},
	}, {
		name: "internalTrafficPolicy Local: only this node's endpoints",
		svc: service(func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		}),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
			ep("10.244.1.2", thisNodeName), ep("10.244.2.2", "node-b"))},
		pkt:  tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want: []string{"accept dnat 10.244.1.2:8080"},
	}, {
		name: "dual stack: an IPv6 packet reaches the IPv6 endpoint",
		svc:  service(dualStack),
		slices: []*discoveryv1.EndpointSlice{
			v4Slice("web-4", ep("10.244.2.2", "node-b")), v6Slice("web-6", ep("fd00:10:244:2::2", "node-b"))},
		pkt:  tracer.Packet{Origin: tracer.FromPod, Src: pod6, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP6), Port: 80},
		want: []string{"accept dnat [fd00:10:244:2::2]:8080"},
	}, {
		name:   "an IPv4-only Service gets nothing in IPv6",
		svc:    service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-4", ep("10.244.2.2", "node-b")), v6Slice("web-6", ep("fd00:10:244:2::2", "node-b"))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod6, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP6), Port: 80},
		want:   []string{"accept"},
	}, {
		// Cluster policy: external traffic is masqueraded, pods' too, as upstream.
		name: "a malformed external IP is skipped, the valid one served",
		svc: service(func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"not-an-ip", "192.168.200.10"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		}),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr("192.168.200.10"), Port: 80},
		want:   []string{"accept dnat 10.244.2.2:8080 masq"},
	}, {
		name:   "a malformed endpoint address is skipped, the valid one used",
		svc:    service(),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.999.2", "node-b"), ep("10.244.3.2", "node-c"))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want:   []string{"accept dnat 10.244.3.2:8080"},
	}, {
		name: "a load balancer IP in Proxy mode is not served",
		svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ingress("192.168.201.10", corev1.LoadBalancerIPModeProxy)}
		}),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr("192.168.201.10"), Port: 80},
		want:   []string{"accept"},
	}, {
		name: "a headless Service gets no rules",
		svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
		}),
		slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"))},
		pkt:    tracer.Packet{Origin: tracer.FromPod, Src: pod, Proto: "tcp", Dst: netip.MustParseAddr(clusterIP4), Port: 80},
		want:   []string{"accept"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fakes := map[tables.Family]*knftables.Fake{
				tables.IPv4: knftables.NewFake(knftables.IPv4Family, "shardproxy-test"),
				tables.IPv6: knftables.NewFake(knftables.IPv6Family, "shardproxy-test"),
			}
			p, err := New(Options{
				Name:     "test",
				Tables:   tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14},
				Families: []tables.Family{tables.IPv4, tables.IPv6},
				NFT: func(fam tables.Family, _ string) (knftables.Interface, error) {
					return fakes[fam], nil
				},
				Node: thisNode(),
			})
			if err != nil {
				t.Fatal(err)
			}
			p.UpdateService(tc.svc)
			for _, s := range tc.slices {
				p.UpdateEndpointSlice(s)
			}
			if _, err := p.Sync(context.Background(), false); err != nil {
				t.Fatal(err)
			}
			tr, err := tracer.New(tracer.Env{LocalIPs: []netip.Addr{netip.MustParseAddr("192.168.100.1")}},
				fakes[tables.IPv4], fakes[tables.IPv6])
			if err != nil {
				t.Fatal(err)
			}
			outs, err := tr.Trace(tc.pkt)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range outs {
				got = append(got, o.String())
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("packet %+v\n got: %q\nwant: %q", tc.pkt, got, tc.want)
			}
		})
	}
}
