package instance

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/shardproxy/shardproxy/tables"
)

// buildCase is one Build input and the model it must produce.
type buildCase struct {
	name   string
	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
	// node defaults to thisNode().
	node *NodeInfo

	want            map[tables.Family][]*tables.ServicePort
	wantHealthCheck int32
	wantLocal       LocalEndpoints
	// wantProblems are substrings of the expected Problems, in order.
	wantProblems []string
	// wantUnmatched are the expected Unmatched slice ports, exactly.
	wantUnmatched []string
}

func runBuildCases(t *testing.T, cases []buildCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := thisNode()
			if tc.node != nil {
				node = *tc.node
			}
			got := Build(tc.svc, tc.slices, node)
			if got == nil {
				t.Fatalf("Build returned nil")
			}
			want := &ServiceModel{
				Name:                webName,
				Ports:               tc.want,
				HealthCheckNodePort: tc.wantHealthCheck,
				LocalEndpoints:      tc.wantLocal,
				Problems:            got.Problems,
				Unmatched:           tc.wantUnmatched,
			}
			if diff := cmp.Diff(want, got, modelOptions()); diff != "" {
				t.Errorf("model mismatch (-want +got):\n%s", diff)
			}
			checkProblems(t, got.Problems, tc.wantProblems)
		})
	}
}

func TestBuildNoRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
	}{
		{name: "nil service", svc: nil},
		{name: "headless service", svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIP = corev1.ClusterIPNone
			s.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
		})},
		{name: "headless in clusterIPs only", svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIP = ""
			s.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
		})},
		{name: "ExternalName service", svc: service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ExternalName = "example.com"
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		})},
		{name: "ExternalName service with stale cluster IP", svc: service(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
		})},
		{name: "service without cluster IP", svc: service(func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slice := v4Slice("web-1", ep("10.244.1.2", thisNodeName))
			if got := Build(tc.svc, []*discoveryv1.EndpointSlice{slice}, thisNode()); got != nil {
				t.Errorf("Build = %+v, want nil", got)
			}
		})
	}
}

func TestBuildAddresses(t *testing.T) {
	runBuildCases(t, []buildCase{
		{
			name:   "cluster IP service with ready endpoints",
			svc:    service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.1.2", thisNodeName), ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.2.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "service without endpoints has no endpoints",
			svc:  service(),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "dual stack service splits families, local endpoints counted per family",
			svc: service(dualStack, func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "2001:db8::1"}
			}),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-v4", ep("10.244.1.2", thisNodeName)),
				v6Slice("web-v6", ep("fd00:10:244:2::2", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{
				tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.ExternalIPs = ips("192.0.2.1")
					sp.ClusterEndpoints = eps("10.244.1.2:8080")
					sp.LocalEndpoints = eps("10.244.1.2:8080")
					sp.HasEndpoints = true
				})},
				tables.IPv6: {wantPort(tables.IPv6, func(sp *tables.ServicePort) {
					sp.ExternalIPs = ips("2001:db8::1")
					sp.ClusterEndpoints = eps("[fd00:10:244:2::2]:8080")
					sp.HasEndpoints = true
				})},
			},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "IPv6 only service has no IPv4 family",
			svc: service(func(s *corev1.Service) {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = clusterIP6, []string{clusterIP6}
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			}),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-v4", ep("10.244.1.2", thisNodeName)),
				v6Slice("web-v6", ep("fd00:10:244:1::2", thisNodeName)),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv6: {wantPort(tables.IPv6, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("[fd00:10:244:1::2]:8080")
				sp.LocalEndpoints = eps("[fd00:10:244:1::2]:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv6: 1},
		},
		{
			name: "dual stack service without IPv6 endpoints has none in IPv6 only",
			svc:  service(dualStack),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-v4", ep("10.244.2.2", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{
				tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.ClusterEndpoints = eps("10.244.2.2:8080")
					sp.HasEndpoints = true
				})},
				tables.IPv6: {wantPort(tables.IPv6)},
			},
		},
		{
			name: "legacy clusterIP field used when clusterIPs is empty",
			svc: service(func(s *corev1.Service) {
				s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "second cluster IP of one family ignored",
			svc: service(func(s *corev1.Service) {
				s.Spec.ClusterIPs = []string{clusterIP4, "172.30.0.11"}
			}),
			want:         map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
			wantProblems: []string{`spec.clusterIPs[1]: 172.30.0.11 is a second IPv4 cluster IP`},
		},
		{
			name: "malformed cluster IP skipped and the other family kept",
			svc: service(func(s *corev1.Service) {
				s.Spec.ClusterIPs = []string{"172.30.0.300", clusterIP6}
			}),
			want:         map[tables.Family][]*tables.ServicePort{tables.IPv6: {wantPort(tables.IPv6)}},
			wantProblems: []string{`spec.clusterIPs[0]: "172.30.0.300" is not an IP address`},
		},
		{
			name: "external IPs on a ClusterIP service",
			svc: service(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "bogus", "192.0.2.2", "192.0.2.1"}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ExternalIPs = ips("192.0.2.1", "192.0.2.2")
			})}},
			wantProblems: []string{`spec.externalIPs[1]: "bogus" is not an IP address`},
		},
		{
			name: "IPs parsed like kube-proxy: leading zeros and IPv4-mapped addresses",
			svc: service(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.000.002.010", "::ffff:192.0.2.20"}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ExternalIPs = ips("192.0.2.10", "192.0.2.20")
			})}},
		},
		{
			name: "NodePort service gets node ports",
			svc:  service(ofType(corev1.ServiceTypeNodePort)),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
			})}},
		},
		{
			name: "node port ignored on a ClusterIP service",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports[0].NodePort = 30080
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "LoadBalancer service gets node ports, ingress IPs and source ranges per family",
			svc: service(dualStack, ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{" 203.0.113.0/24 ", "2001:db8:1::/48", "198.51.100.7/16"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					ingress("192.0.2.100", ""),
					ingress("2001:db8::100", corev1.LoadBalancerIPModeVIP),
					ingress("192.0.2.101", corev1.LoadBalancerIPModeVIP),
				}
			}),
			want: map[tables.Family][]*tables.ServicePort{
				tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.NodePort = 30080
					sp.LoadBalancerIPs = ips("192.0.2.100", "192.0.2.101")
					sp.SourceRanges = prefixes("203.0.113.0/24", "198.51.0.0/16")
				})},
				tables.IPv6: {wantPort(tables.IPv6, func(sp *tables.ServicePort) {
					sp.NodePort = 30080
					sp.LoadBalancerIPs = ips("2001:db8::100")
					sp.SourceRanges = prefixes("2001:db8:1::/48")
				})},
			},
		},
		{
			name: "LoadBalancer without node ports",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
				s.Spec.Ports[0].NodePort = 0
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ingress("192.0.2.100", "")}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.LoadBalancerIPs = ips("192.0.2.100")
			})}},
		},
		{
			name: "ipMode Proxy LB ingress ignored",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
					ingress("192.0.2.100", corev1.LoadBalancerIPModeProxy),
					ingress("192.0.2.101", ""),
				}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
				sp.LoadBalancerIPs = ips("192.0.2.101")
			})}},
		},
		{
			name: "unknown ipMode LB ingress ignored with a problem",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ingress("192.0.2.100", "Teleport")}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
			})}},
			wantProblems: []string{`status.loadBalancer.ingress[0].ipMode: unknown value "Teleport"`},
		},
		{
			name: "hostname-only LB ingress ignored",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example.com"}}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
			})}},
		},
		{
			name: "malformed LB ingress IP and source range skipped",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/33", "203.0.113.0", "10.0.0.0/8"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ingress("lb", ""), ingress("192.0.2.100", "")}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
				sp.LoadBalancerIPs = ips("192.0.2.100")
				sp.SourceRanges = prefixes("10.0.0.0/8")
			})}},
			wantProblems: []string{
				`status.loadBalancer.ingress[0].ip: "lb" is not an IP address`,
				`spec.loadBalancerSourceRanges[0]: "203.0.113.0/33" is not a CIDR`,
				`spec.loadBalancerSourceRanges[1]: "203.0.113.0" is not a CIDR`,
			},
		},
		{
			name: "LB ingress and source ranges ignored on a NodePort service",
			svc: service(ofType(corev1.ServiceTypeNodePort), func(s *corev1.Service) {
				s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ingress("192.0.2.100", "")}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
			})}},
		},
	})
}

func TestBuildAllClusterIPsMalformed(t *testing.T) {
	svc := service(func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "bogus", []string{"bogus"}
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 32000
	})
	got := Build(svc, nil, thisNode())
	if got == nil {
		t.Fatalf("Build = nil, want a model carrying the problem")
	}
	if len(got.Ports) != 0 || got.HealthCheckNodePort != 0 {
		t.Errorf("Ports = %v, HealthCheckNodePort = %d; want none", got.Ports, got.HealthCheckNodePort)
	}
	checkProblems(t, got.Problems, []string{`spec.clusterIPs[0]: "bogus" is not an IP address`})
}

func TestBuildPorts(t *testing.T) {
	udp, sctp := corev1.ProtocolUDP, corev1.ProtocolSCTP
	runBuildCases(t, []buildCase{
		{
			name: "UDP and SCTP ports map to their protocols",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
					{Name: "sig", Port: 2905, Protocol: corev1.ProtocolSCTP},
				}
			}),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				{Name: ptr.To("dns"), Port: ptr.To[int32](5353), Protocol: &udp},
				slicePort("dns-tcp", 5354),
				{Name: ptr.To("sig"), Port: ptr.To[int32](2906), Protocol: &sctp},
			}, ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {
				wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.Name.Port, sp.Name.Protocol, sp.Protocol, sp.Port = "dns", tables.UDP, tables.UDP, 53
					sp.ClusterEndpoints = eps("10.244.2.2:5353")
					sp.HasEndpoints = true
				}),
				wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.Name.Port, sp.Port = "dns-tcp", 53
					sp.ClusterEndpoints = eps("10.244.2.2:5354")
					sp.HasEndpoints = true
				}),
				wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.Name.Port, sp.Name.Protocol, sp.Protocol, sp.Port = "sig", tables.SCTP, tables.SCTP, 2905
					sp.ClusterEndpoints = eps("10.244.2.2:2906")
					sp.HasEndpoints = true
				}),
			}},
		},
		{
			name: "empty protocol defaults to TCP",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports[0].Protocol = ""
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "unknown protocol port skipped",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "quic", Port: 443, Protocol: "QUIC"})
			}),
			want:         map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
			wantProblems: []string{`spec.ports[1].protocol: unsupported protocol "QUIC"`},
		},
		{
			name: "out of range ports skipped",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports,
					corev1.ServicePort{Name: "zero", Port: 0, Protocol: corev1.ProtocolTCP},
					corev1.ServicePort{Name: "big", Port: 65536, Protocol: corev1.ProtocolTCP})
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
			wantProblems: []string{
				`spec.ports[1].port: 0 is out of range`,
				`spec.ports[2].port: 65536 is out of range`,
			},
		},
		{
			name: "out of range node port dropped and the port kept",
			svc: service(ofType(corev1.ServiceTypeNodePort), func(s *corev1.Service) {
				s.Spec.Ports[0].NodePort = 70000
			}),
			want:         map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
			wantProblems: []string{`spec.ports[0].nodePort: 70000 is out of range`},
		},
		{
			name: "duplicate ports skipped",
			svc: service(ofType(corev1.ServiceTypeNodePort), func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports,
					corev1.ServicePort{Name: "http", Port: 81, Protocol: corev1.ProtocolTCP},
					corev1.ServicePort{Name: "again", Port: 80, Protocol: corev1.ProtocolTCP},
					corev1.ServicePort{Name: "other", Port: 82, Protocol: corev1.ProtocolTCP, NodePort: 30080},
					corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolUDP, NodePort: 30080})
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {
				wantPort(tables.IPv4, func(sp *tables.ServicePort) { sp.NodePort = 30080 }),
				wantPort(tables.IPv4, func(sp *tables.ServicePort) { sp.Name.Port, sp.Port = "other", 82 }),
				wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.Name.Protocol, sp.Protocol, sp.NodePort = tables.UDP, tables.UDP, 30080
				}),
			}},
			wantProblems: []string{
				`spec.ports[1]: duplicate port name "http" for tcp`,
				`spec.ports[2]: duplicate port 80/tcp`,
				`spec.ports[3].nodePort: duplicate node port 30080/tcp`,
			},
		},
	})
}

func TestBuildEndpointPorts(t *testing.T) {
	twoPorts := func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP},
		}
	}
	metricsPort := func(edits ...func(*tables.ServicePort)) *tables.ServicePort {
		return wantPort(tables.IPv4, append([]func(*tables.ServicePort){func(sp *tables.ServicePort) {
			sp.Name.Port, sp.Port = "metrics", 9090
		}}, edits...)...)
	}
	runBuildCases(t, []buildCase{
		{
			name: "endpoint port matched by service port name",
			svc:  service(twoPorts),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				slicePort("metrics", 9100), slicePort("http", 8080),
			}, ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {
				wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.ClusterEndpoints = eps("10.244.2.2:8080")
					sp.HasEndpoints = true
				}),
				metricsPort(func(sp *tables.ServicePort) {
					sp.ClusterEndpoints = eps("10.244.2.2:9100")
					sp.HasEndpoints = true
				}),
			}},
		},
		{
			name: "slice port of another protocol does not match",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolUDP)},
			}, ep("10.244.2.2", "node-b"))},
			want:          map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
			wantUnmatched: []string{`IPv4 EndpointSlice port "http"/udp`},
		},
		{
			name: "slice port matching no service port is skipped and noted",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				slicePort("http", 8080), slicePort("old-admin", 9000),
			}, ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				sp.HasEndpoints = true
			})}},
			wantUnmatched: []string{`IPv4 EndpointSlice port "old-admin"/tcp`},
		},
		{
			name:   "service port without matching slice port has no endpoints",
			svc:    service(twoPorts),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {
				wantPort(tables.IPv4, func(sp *tables.ServicePort) {
					sp.ClusterEndpoints = eps("10.244.2.2:8080")
					sp.HasEndpoints = true
				}),
				metricsPort(),
			}},
		},
		{
			name: "unnamed service port matches slice port with empty or nil name",
			svc: service(func(s *corev1.Service) {
				s.Spec.Ports[0].Name = ""
			}),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort("", 8080)}, ep("10.244.2.2", "node-b")),
				epSlice("web-2", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}}, ep("10.244.2.3", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.Name.Port = ""
				sp.ClusterEndpoints = eps("10.244.2.2:8080", "10.244.2.3:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "slice port with nil or out of range port skipped",
			svc:  service(twoPorts),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{
				{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP)},
				slicePort("metrics", 0),
				slicePort("metrics", 70000),
				{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.Protocol("QUIC"))},
			}, ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4), metricsPort()}},
			wantProblems: []string{
				`endpointslice web-1: ports[0] ("http") has no port number`,
				`endpointslice web-1: ports[1].port: 0 is out of range`,
				`endpointslice web-1: ports[2].port: 70000 is out of range`,
				`endpointslice web-1: ports[3].protocol: unsupported protocol "QUIC"`,
			},
		},
		{
			name: "one endpoint behind two port numbers of the same name keeps both",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-1", ep("10.244.2.2", "node-b")),
				epSlice("web-2", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort("http", 8081)}, ep("10.244.2.2", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080", "10.244.2.2:8081")
				sp.HasEndpoints = true
			})}},
		},
	})
}

func TestBuildEndpoints(t *testing.T) {
	runBuildCases(t, []buildCase{
		{
			name: "duplicate endpoints across slices collapse",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-1", ep("10.244.2.2", "node-b"), ep("10.244.1.2", thisNodeName)),
				v4Slice("web-2", ep("10.244.2.2", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.2.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "duplicate endpoint keeps the ready copy",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-1", ep("10.244.2.2", "node-b")),
				v4Slice("web-0", ep("10.244.2.2", "node-b", notReady)),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "duplicate endpoint keeps the local copy",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-0", ep("10.244.1.2", "")),
				v4Slice("web-1", ep("10.244.1.2", thisNodeName)),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "endpoints sorted by IP then port",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-b", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort("http", 8081)},
					ep("10.244.2.10", "node-b"), ep("10.244.2.9", "node-b")),
				v4Slice("web-a", ep("10.244.2.10", "node-b"), ep("10.244.2.9", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.9:8080", "10.244.2.9:8081", "10.244.2.10:8080", "10.244.2.10:8081")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "not ready endpoints unused",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-1", ep("10.244.1.2", thisNodeName, notReady), ep("10.244.2.2", "node-b", notReady)),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "serving terminating endpoints used when none ready",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, terminating(true)),
				ep("10.244.2.2", "node-b", terminating(true)),
				ep("10.244.2.3", "node-b", terminating(false)),
				ep("10.244.2.4", "node-b", notReady),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.2.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "serving terminating endpoints unused while one is ready",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, terminating(true)),
				ep("10.244.2.2", "node-b"),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				// Local endpoints fall back on their own: no local one is ready.
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "local ready endpoints preferred to local terminating ones",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, terminating(true)),
				ep("10.244.1.3", thisNodeName),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.3:8080")
				sp.LocalEndpoints = eps("10.244.1.3:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "terminating endpoints that stopped serving are never used",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, terminating(false)),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "unset serving condition counts as serving",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.2.2", "node-b", func(e *discoveryv1.Endpoint) {
					e.Conditions.Ready = ptr.To(false)
					e.Conditions.Terminating = ptr.To(true)
				}),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "slices of the other family and FQDN slices ignored",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v6Slice("web-v6", ep("fd00:10:244:2::2", "node-b")),
				epSlice("web-fqdn", discoveryv1.AddressTypeFQDN, []discoveryv1.EndpointPort{slicePort("http", 8080)}, ep("db.example.com", "node-b")),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "malformed endpoint addresses skipped",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				v4Slice("web-1",
					ep("10.244.2.300", "node-b"),
					ep("fd00:10:244:2::2", "node-b"),
					discoveryv1.Endpoint{},
					ep("10.244.2.2", "node-b"),
				),
			},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				sp.HasEndpoints = true
			})}},
			wantProblems: []string{
				`endpointslice web-1: endpoints[0].addresses[0]: "10.244.2.300" is not an IP address`,
				`endpointslice web-1: endpoints[1].addresses[0]: fd00:10:244:2::2 is not an IPv4 address`,
				`endpointslice web-1: endpoints[2] has no address`,
			},
		},
		{
			name: "only the first address of an endpoint is used",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b", func(e *discoveryv1.Endpoint) {
				e.Addresses = append(e.Addresses, "10.244.2.3")
			}))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name:   "no endpoint is local on a node without a name",
			svc:    service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.1.2", ""))},
			node:   &NodeInfo{},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
		},
	})
}

func TestBuildTrafficPolicies(t *testing.T) {
	localITP := func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}
	localETP := func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	twoLocal := []*discoveryv1.EndpointSlice{v4Slice("web-1",
		ep("10.244.1.2", thisNodeName), ep("10.244.1.3", thisNodeName), ep("10.244.2.2", "node-b"))}
	twoLocalPort := func(sp *tables.ServicePort) {
		sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.1.3:8080", "10.244.2.2:8080")
		sp.LocalEndpoints = eps("10.244.1.2:8080", "10.244.1.3:8080")
		sp.HasEndpoints = true
	}
	runBuildCases(t, []buildCase{
		{
			name:   "internalTrafficPolicy Local sets InternalLocal",
			svc:    service(localITP),
			slices: twoLocal,
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, twoLocalPort, func(sp *tables.ServicePort) {
				sp.InternalLocal = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 2},
		},
		{
			name:   "internal Local service without local endpoints still has endpoints elsewhere",
			svc:    service(localITP),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1", ep("10.244.2.2", "node-b"))},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.InternalLocal = true
				sp.ClusterEndpoints = eps("10.244.2.2:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "externalTrafficPolicy Local on a LoadBalancer sets ExternalLocal and the health check node port",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), localETP, func(s *corev1.Service) {
				s.Spec.HealthCheckNodePort = 32000
			}),
			slices: twoLocal,
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, twoLocalPort, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
				sp.ExternalLocal = true
			})}},
			wantHealthCheck: 32000,
			wantLocal:       LocalEndpoints{IPv4: 2},
		},
		{
			name:   "externalTrafficPolicy Local on a NodePort service has no health check node port",
			svc:    service(ofType(corev1.ServiceTypeNodePort), localETP, func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 32000 }),
			slices: twoLocal,
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, twoLocalPort, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
				sp.ExternalLocal = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 2},
		},
		{
			name: "externalTrafficPolicy Local applies to external IPs of a ClusterIP service",
			svc: service(localETP, func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ExternalIPs = ips("192.0.2.1")
				sp.ExternalLocal = true
			})}},
		},
		{
			name: "externalTrafficPolicy Local ignored on a ClusterIP service without external IPs",
			svc:  service(localETP),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4)}},
		},
		{
			name: "externalTrafficPolicy Cluster on a LoadBalancer has no health check node port",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
				s.Spec.HealthCheckNodePort = 32000
			}),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
			})}},
		},
		{
			name: "missing health check node port reported",
			svc:  service(ofType(corev1.ServiceTypeLoadBalancer), localETP),
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.NodePort = 30080
				sp.ExternalLocal = true
			})}},
			wantProblems: []string{`spec.healthCheckNodePort: 0 is out of range`},
		},
		{
			name: "local endpoints counted once per address across ports, in each family",
			svc: service(dualStack, func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP})
			}),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-v4", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("metrics", 9100)},
					ep("10.244.1.2", thisNodeName), ep("10.244.1.3", thisNodeName, terminating(true)), ep("10.244.2.2", "node-b")),
				epSlice("web-v6", discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("metrics", 9100)},
					ep("fd00:10:244:1::2", thisNodeName)),
			},
			want: map[tables.Family][]*tables.ServicePort{
				tables.IPv4: {
					wantPort(tables.IPv4, func(sp *tables.ServicePort) {
						sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.2.2:8080")
						sp.LocalEndpoints = eps("10.244.1.2:8080")
						sp.HasEndpoints = true
					}),
					wantPort(tables.IPv4, func(sp *tables.ServicePort) {
						sp.Name.Port, sp.Port = "metrics", 9090
						sp.ClusterEndpoints = eps("10.244.1.2:9100", "10.244.2.2:9100")
						sp.LocalEndpoints = eps("10.244.1.2:9100")
						sp.HasEndpoints = true
					}),
				},
				tables.IPv6: {
					wantPort(tables.IPv6, func(sp *tables.ServicePort) {
						sp.ClusterEndpoints = eps("[fd00:10:244:1::2]:8080")
						sp.LocalEndpoints = eps("[fd00:10:244:1::2]:8080")
						sp.HasEndpoints = true
					}),
					wantPort(tables.IPv6, func(sp *tables.ServicePort) {
						sp.Name.Port, sp.Port = "metrics", 9090
						sp.ClusterEndpoints = eps("[fd00:10:244:1::2]:9100")
						sp.LocalEndpoints = eps("[fd00:10:244:1::2]:9100")
						sp.HasEndpoints = true
					}),
				},
			},
			wantLocal: LocalEndpoints{IPv4: 1, IPv6: 1},
		},
	})
}

func TestBuildTopology(t *testing.T) {
	preferClose := func(s *corev1.Service) {
		s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
	}
	annotate := func(key, value string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[key] = value
		}
	}
	// zoned has one endpoint on this node, one elsewhere in zone-a, one in zone-b,
	// each hinted for its own zone.
	zoned := []*discoveryv1.EndpointSlice{v4Slice("web-1",
		ep("10.244.1.2", thisNodeName, forZones(thisZone)),
		ep("10.244.2.2", "node-b", forZones(thisZone)),
		ep("10.244.3.2", "node-c", forZones("zone-b")),
	)}
	sameZone := map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
		sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.2.2:8080")
		sp.LocalEndpoints = eps("10.244.1.2:8080")
		sp.HasEndpoints = true
	})}}
	everywhere := map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
		sp.ClusterEndpoints = eps("10.244.1.2:8080", "10.244.2.2:8080", "10.244.3.2:8080")
		sp.LocalEndpoints = eps("10.244.1.2:8080")
		sp.HasEndpoints = true
	})}}
	runBuildCases(t, []buildCase{
		{
			name:      "zone hints filter cluster endpoints with trafficDistribution PreferClose",
			svc:       service(preferClose),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "zone hints filter cluster endpoints with trafficDistribution PreferSameZone",
			svc: service(func(s *corev1.Service) {
				s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameZone)
			}),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name:      "zone hints filter cluster endpoints with the topology-mode Auto annotation",
			svc:       service(annotate(corev1.AnnotationTopologyMode, "Auto")),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name:      "zone hints filter cluster endpoints with the deprecated topology-aware-hints annotation",
			svc:       service(annotate(corev1.DeprecatedAnnotationTopologyAwareHints, "auto")),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			// As upstream, the proxy leaves it to the EndpointSlice controller to read the
			// Service's wishes: hints it finds are honoured, whatever the Service says.
			name: "hints honoured when the deprecated annotation says disabled",
			svc: service(annotate(corev1.DeprecatedAnnotationTopologyAwareHints, "disabled"),
				annotate(corev1.AnnotationTopologyMode, "Auto")),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name:      "hints honoured when the service does not ask for topology",
			svc:       service(),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name:      "hints honoured when topology-mode says Disabled",
			svc:       service(annotate(corev1.AnnotationTopologyMode, "Disabled")),
			slices:    zoned,
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "hints ignored when a ready endpoint lacks one",
			svc:  service(preferClose),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, forZones(thisZone)),
				ep("10.244.2.2", "node-b", forZones(thisZone)),
				ep("10.244.3.2", "node-c"),
			)},
			want:      everywhere,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "hints of endpoints that are not ready do not matter",
			svc:  service(preferClose),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, forZones(thisZone)),
				ep("10.244.2.2", "node-b", forZones(thisZone)),
				ep("10.244.3.2", "node-c", forZones("zone-b")),
				ep("10.244.3.3", "node-c", notReady),
			)},
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "hints ignored when none is for this zone",
			svc:  service(preferClose),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.3.2", "node-c", forZones("zone-b")),
				ep("10.244.3.3", "node-c", forZones("zone-c")),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.3.2:8080", "10.244.3.3:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name:      "zone hints ignored on a node without a zone label",
			svc:       service(preferClose),
			slices:    zoned,
			node:      &NodeInfo{Name: thisNodeName},
			want:      everywhere,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "node hints take priority over zone hints",
			svc: service(func(s *corev1.Service) {
				s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferSameNode)
			}),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, forZones(thisZone), forNodes(thisNodeName)),
				ep("10.244.2.2", "node-b", forZones(thisZone), forNodes("node-b")),
				ep("10.244.3.2", "node-c", forZones("zone-b"), forNodes("node-c")),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "node hints honoured when the service does not ask for topology",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, forNodes(thisNodeName)),
				ep("10.244.2.2", "node-b", forNodes("node-b")),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.1.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "zone hints used when no node hint is for this node",
			svc:  service(preferClose),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.2.2", "node-b", forZones(thisZone), forNodes("node-b")),
				ep("10.244.2.3", "node-b", forZones(thisZone), forNodes("node-b")),
				ep("10.244.3.2", "node-c", forZones("zone-b"), forNodes("node-c")),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080", "10.244.2.3:8080")
				sp.HasEndpoints = true
			})}},
		},
		{
			name: "node hints ignored when a ready endpoint lacks one",
			svc:  service(preferClose),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, forZones(thisZone), forNodes(thisNodeName)),
				ep("10.244.2.2", "node-b", forZones(thisZone)),
				ep("10.244.3.2", "node-c", forZones("zone-b"), forNodes("node-c")),
			)},
			want:      sameZone,
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "topology does not filter local endpoints",
			svc: service(preferClose, func(s *corev1.Service) {
				s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
			}),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.1.2", thisNodeName, forZones("zone-b")),
				ep("10.244.3.2", "node-c", forZones(thisZone)),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.InternalLocal = true
				sp.ClusterEndpoints = eps("10.244.3.2:8080")
				sp.LocalEndpoints = eps("10.244.1.2:8080")
				sp.HasEndpoints = true
			})}},
			wantLocal: LocalEndpoints{IPv4: 1},
		},
		{
			name: "terminating fallback ignores topology",
			svc:  service(preferClose),
			slices: []*discoveryv1.EndpointSlice{v4Slice("web-1",
				ep("10.244.2.2", "node-b", terminating(true), forZones(thisZone)),
				ep("10.244.3.2", "node-c", terminating(true), forZones("zone-b")),
			)},
			want: map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = eps("10.244.2.2:8080", "10.244.3.2:8080")
				sp.HasEndpoints = true
			})}},
		},
	})
}

func TestBuildSessionAffinity(t *testing.T) {
	clientIP := func(timeout *int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			if timeout != nil {
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{
					ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: timeout},
				}
			}
		}
	}
	withTimeout := func(d time.Duration) map[tables.Family][]*tables.ServicePort {
		return map[tables.Family][]*tables.ServicePort{tables.IPv4: {wantPort(tables.IPv4, func(sp *tables.ServicePort) {
			sp.AffinityTimeout = d
		})}}
	}
	runBuildCases(t, []buildCase{
		{
			name: "ClientIP affinity uses timeoutSeconds",
			svc:  service(clientIP(ptr.To[int32](60))),
			want: withTimeout(time.Minute),
		},
		{
			name: "ClientIP affinity defaults to three hours",
			svc:  service(clientIP(nil)),
			want: withTimeout(3 * time.Hour),
		},
		{
			name: "longest ClientIP affinity timeout accepted",
			svc:  service(clientIP(ptr.To[int32](86400))),
			want: withTimeout(24 * time.Hour),
		},
		{
			name:         "zero ClientIP affinity timeout uses the default",
			svc:          service(clientIP(ptr.To[int32](0))),
			want:         withTimeout(3 * time.Hour),
			wantProblems: []string{`timeoutSeconds: 0 is out of range`},
		},
		{
			name:         "too long ClientIP affinity timeout uses the default",
			svc:          service(clientIP(ptr.To[int32](86401))),
			want:         withTimeout(3 * time.Hour),
			wantProblems: []string{`timeoutSeconds: 86401 is out of range`},
		},
		{
			name: "affinity None has no timeout",
			svc: service(func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
			}),
			want: withTimeout(0),
		},
		{
			name: "unknown affinity reported and ignored",
			svc: service(func(s *corev1.Service) {
				s.Spec.SessionAffinity = "Cookie"
			}),
			want:         withTimeout(0),
			wantProblems: []string{`spec.sessionAffinity: unknown value "Cookie"`},
		},
	})
}

// TestBuildIsDeterministic checks the model does not depend on the order of the slices.
func TestBuildIsDeterministic(t *testing.T) {
	svc := service(dualStack)
	list := []*discoveryv1.EndpointSlice{
		v4Slice("web-a", ep("10.244.2.2", "node-b"), ep("bogus", "node-b")),
		v4Slice("web-b", ep("10.244.2.2", "node-b", notReady), ep("10.244.1.2", thisNodeName)),
		nil,
		v6Slice("web-c", ep("fd00:10:244:2::2", "node-b"), ep("10.244.2.3", "node-b")),
	}
	want := Build(svc, list, thisNode())
	reversed := slices.Clone(list)
	slices.Reverse(reversed)
	got := Build(svc, reversed, thisNode())
	if diff := cmp.Diff(want, got, modelOptions()); diff != "" {
		t.Errorf("reversing the slices changed the model (-want +got):\n%s", diff)
	}
	if len(want.Problems) != 2 {
		t.Errorf("problems = %q, want 2", want.Problems)
	}
}

// TestBuildDoesNotModifyInput guards the informer cache: objects from it are shared.
func TestBuildDoesNotModifyInput(t *testing.T) {
	svc := service(dualStack, ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{"192.0.2.1"}
		s.Spec.LoadBalancerSourceRanges = []string{" 10.0.0.0/8 "}
	})
	list := []*discoveryv1.EndpointSlice{
		v4Slice("web-b", ep("10.244.2.2", "node-b")),
		v4Slice("web-a", ep("10.244.1.2", thisNodeName)),
	}
	svcCopy := svc.DeepCopy()
	listCopy := []*discoveryv1.EndpointSlice{list[0].DeepCopy(), list[1].DeepCopy()}
	m := Build(svc, list, thisNode())
	// Mutating the model must not reach back into the objects either.
	m.Ports[tables.IPv4][0].ExternalIPs[0] = ips("203.0.113.1")[0]
	if diff := cmp.Diff(svcCopy, svc); diff != "" {
		t.Errorf("Build modified the Service (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(listCopy, list); diff != "" {
		t.Errorf("Build modified the slices (-before +after):\n%s", diff)
	}
}

func TestParsePrefix(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // empty: rejected
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "\t10.1.2.3/8 ", want: "10.0.0.0/8"},
		{in: "010.001.0.0/16", want: "10.1.0.0/16"},
		{in: "2001:db8::1/32", want: "2001:db8::/32"},
		{in: "::ffff:10.1.0.0/112", want: "10.1.0.0/16"},
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "10.0.0.0/33"},
		{in: "10.0.0.0"},
		{in: ""},
		{in: "fe80::1%eth0/64"},
	} {
		got, ok := parsePrefix(tc.in)
		if tc.want == "" {
			if ok {
				t.Errorf("parsePrefix(%q) = %v, want rejected", tc.in, got)
			}
			continue
		}
		if !ok || got.String() != tc.want {
			t.Errorf("parsePrefix(%q) = %v, %v; want %s", tc.in, got, ok, tc.want)
		}
	}
}

// TestBuildEndpointListsHaveNoSpareRoom: the models keep every Service port's endpoint
// lists for as long as the Service exists, so each is an array of its length (grown by
// append, ten endpoints took room for sixteen).
func TestBuildEndpointListsHaveNoSpareRoom(t *testing.T) {
	for _, n := range []int{1, 3, 10, 17} {
		var list []discoveryv1.Endpoint
		for i := range n {
			node := "node-b"
			if i%2 == 0 {
				node = thisNodeName
			}
			list = append(list, ep(fmt.Sprintf("10.0.0.%d", i+1), node))
		}
		m := Build(service(), []*discoveryv1.EndpointSlice{v4Slice("web-1", list...)}, thisNode())
		for _, sp := range m.Ports[tables.IPv4] {
			for name, eps := range map[string][]tables.Endpoint{"cluster": sp.ClusterEndpoints, "local": sp.LocalEndpoints} {
				if len(eps) == 0 || cap(eps) != len(eps) {
					t.Errorf("%d endpoints: %s endpoints %d with room for %d, want some and no spare room", n, name, len(eps), cap(eps))
				}
			}
		}
	}
}
