// Package gen generates a realistic, deterministic mix of Services and EndpointSlices for
// benchmarks: ClusterIP, NodePort and LoadBalancer Services (some with source ranges),
// some UDP, some with ClientIP affinity, some with Local traffic policies, each with a
// fixed number of endpoints spread over a cluster's nodes. It depends on the Kubernetes
// API types only, so every benchmark (the bench program, instance's testing.B) can use it.
package gen

import (
	"fmt"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The address plan. None of it overlaps the test/netns topology (10.244.0.0/16 pods,
// 172.30.0.0/24 cluster network, 192.168.100.0/24 client link), so a generated cluster can
// be loaded into a topology's node beside Services that point at its real pods.
var (
	// ClusterIPBase starts the cluster IPs (10.96.0.0/12, the kubeadm default range).
	ClusterIPBase = netip.MustParseAddr("10.96.0.10")
	// EndpointBase starts the pod addresses (100.64.0.0/10: 4M addresses, so every
	// endpoint of 30,000 Services × 10 is a distinct pod).
	EndpointBase = netip.MustParseAddr("100.64.0.1")
	// PodCIDR covers every generated pod address (for ClusterCIDR local detection).
	PodCIDR = netip.MustParsePrefix("100.64.0.0/10")
	// LoadBalancerBase starts the load-balancer IPs (198.18.0.0/15).
	LoadBalancerBase = netip.MustParseAddr("198.18.0.1")
	// LoadBalancerRange covers every generated IPv4 load-balancer IP.
	LoadBalancerRange = netip.MustParsePrefix("198.18.0.0/15")
	// SourceRanges are the loadBalancerSourceRanges of the Services that have them.
	SourceRanges = []string{"192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/25"}

	// The IPv6 plan, for the IPv6 Services of a cluster generated with an IPv6 share:
	// none of it overlaps the test/netns topology's fd00:10:244::/56 pods or its links.
	ClusterIPBase6    = netip.MustParseAddr("fd00:10:96::a")
	EndpointBase6     = netip.MustParseAddr("fd00:100:64::1")
	PodCIDR6          = netip.MustParsePrefix("fd00:100:64::/64")
	LoadBalancerBase6 = netip.MustParseAddr("fd00:198:18::1")
	// LoadBalancerRange6 covers every generated IPv6 load-balancer IP.
	LoadBalancerRange6 = netip.MustParsePrefix("fd00:198:18::/64")
	// ServiceCIDRs cover the cluster IPs of 100,000 Services (and more) in either family,
	// IPv4 first, for an apiserver that must accept them (each as large as it allows:
	// 2^20 addresses).
	ServiceCIDRs  = []string{"10.96.0.0/12", "fd00:10:96::/108"}
	SourceRanges6 = []string{"2001:db8::/48", "2001:db8:1::/48"}
)

const (
	// Namespace holds every generated object.
	Namespace = "bench"
	// NodeName is the node the proxy runs on; endpoints on it are local.
	NodeName = "node-0"
	// Nodes is the number of nodes endpoints are spread over: endpoint k of Service i runs
	// on node (i+k) mod Nodes, so with 10 endpoints about half the Services have one on
	// NodeName.
	Nodes = 20
	// FirstNodePort is the first NodePort handed out. NodePorts are allocated in order
	// and may go past the default 30000-32767 range (as a cluster with a widened
	// --service-node-port-range does) so every scale gets its share of NodePort Services;
	// past 65535 they go on from WrapNodePort (45,536 distinct ports in all: 100,000
	// Services need about 37,000).
	FirstNodePort = 30000
	WrapNodePort  = 20000
	// NodePortRange covers every NodePort handed out, for an apiserver allocating them.
	NodePortRange = "20000-65535"
)

// PodCIDRs are the generated pods' ranges, IPv4 then IPv6.
func PodCIDRs() []netip.Prefix { return []netip.Prefix{PodCIDR, PodCIDR6} }

// Mix fixes which kind of Service index i is; it is a pure function of i, so any subset
// of a generated cluster can be regenerated exactly.
type Mix struct {
	Type corev1.ServiceType
	// UDP: a DNS-like Service with a single UDP port (53).
	UDP bool
	// TwoPorts: http (80) and https (443), both TCP.
	TwoPorts bool
	// SourceRanges: a LoadBalancer with loadBalancerSourceRanges.
	SourceRanges bool
	// Affinity: ClientIP session affinity.
	Affinity bool
	// ExternalLocal: externalTrafficPolicy Local (NodePort and LoadBalancer only).
	ExternalLocal bool
	// InternalLocal: internalTrafficPolicy Local.
	InternalLocal bool
}

// MixOf returns the kind of Service i: of every 100, 70 ClusterIP, 20 NodePort, 10
// LoadBalancer (half of them with source ranges); 5 UDP; 10 with two ports; 2 with
// ClientIP affinity; a third of the NodePort and LoadBalancer Services with
// externalTrafficPolicy Local; 2 ClusterIP Services with internalTrafficPolicy Local.
func MixOf(i int) Mix {
	r := i % 100
	m := Mix{Type: corev1.ServiceTypeClusterIP}
	switch {
	case r >= 90:
		m.Type = corev1.ServiceTypeLoadBalancer
		m.SourceRanges = r%2 == 0
	case r >= 70:
		m.Type = corev1.ServiceTypeNodePort
	}
	m.UDP = r%20 == 3
	m.TwoPorts = !m.UDP && r%10 == 5
	m.Affinity = r == 11 || r == 77
	m.ExternalLocal = m.Type != corev1.ServiceTypeClusterIP && r%3 == 0
	m.InternalLocal = r == 21 || r == 41
	return m
}

// Cluster is a generated set of Services with their EndpointSlices (one slice each).
type Cluster struct {
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	// Endpoints is the number of endpoints per Service.
	Endpoints int
	// IPv6Percent of the Services are IPv6 (single-stack, with an IPv6 slice).
	IPv6Percent int

	nextNodePort int
	nextPod      netip.Addr
	nextPod6     netip.Addr
	version      int
}

// Generate returns n IPv4 Services with m endpoints each.
func Generate(n, m int) *Cluster { return GenerateFamilies(n, m, 0) }

// GenerateFamilies returns n Services with m endpoints each, ipv6Percent of them IPv6.
func GenerateFamilies(n, m, ipv6Percent int) *Cluster {
	c := &Cluster{Endpoints: m, IPv6Percent: ipv6Percent, nextNodePort: FirstNodePort, nextPod: EndpointBase, nextPod6: EndpointBase6}
	for i := range n {
		svc, slice := c.New(i)
		c.Services = append(c.Services, svc)
		c.Slices = append(c.Slices, slice)
	}
	return c
}

// NodePorts lists the NodePorts svc holds: its ports' and its health check's.
func NodePorts(svc *corev1.Service) []int32 {
	var out []int32
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			out = append(out, p.NodePort)
		}
	}
	if svc.Spec.HealthCheckNodePort != 0 {
		out = append(out, svc.Spec.HealthCheckNodePort)
	}
	return out
}

// ServiceName is the name of Service i.
func ServiceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// ClusterIP is the cluster IP of Service i, were it IPv4.
func ClusterIP(i int) netip.Addr { return addrAdd(ClusterIPBase, i) }

// IsIPv6 says whether Service i is IPv6. The IPv6 ones are spread over every kind of
// the mix: 37 is prime to 100, so 37·i mod 100 visits every residue MixOf looks at.
// Service 0, the one the per-packet measurement reaches, stays IPv4 below 100%.
func (c *Cluster) IsIPv6(i int) bool { return (37*i)%100 >= 100-c.IPv6Percent }

// clusterIP is Service i's cluster IP in its family.
func (c *Cluster) clusterIP(i int) netip.Addr {
	if c.IsIPv6(i) {
		return addrAdd(ClusterIPBase6, i)
	}
	return ClusterIP(i)
}

// takeNodePort hands out the next NodePort.
func (c *Cluster) takeNodePort() int32 {
	p := c.nextNodePort
	c.nextNodePort++
	if c.nextNodePort > 65535 {
		c.nextNodePort = WrapNodePort
	}
	return int32(p)
}

// New returns Service i and its EndpointSlice with fresh pod addresses and NodePorts;
// it does not add them to the Cluster (Generate does).
func (c *Cluster) New(i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	mix := MixOf(i)
	name := ServiceName(i)
	v6 := c.IsIPv6(i)
	family, addressType, lbBase, ranges := corev1.IPv4Protocol, discoveryv1.AddressTypeIPv4, LoadBalancerBase, SourceRanges
	if v6 {
		family, addressType, lbBase, ranges = corev1.IPv6Protocol, discoveryv1.AddressTypeIPv6, LoadBalancerBase6, SourceRanges6
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, ResourceVersion: c.nextVersion()},
		Spec: corev1.ServiceSpec{
			Type:       mix.Type,
			ClusterIP:  c.clusterIP(i).String(),
			ClusterIPs: []string{c.clusterIP(i).String()},
			IPFamilies: []corev1.IPFamily{family},
		},
	}
	type port struct {
		name  string
		proto corev1.Protocol
		port  int32
	}
	ports := []port{{"http", corev1.ProtocolTCP, 80}}
	switch {
	case mix.UDP:
		ports = []port{{"dns", corev1.ProtocolUDP, 53}}
	case mix.TwoPorts:
		ports = append(ports, port{"https", corev1.ProtocolTCP, 443})
	}
	for _, p := range ports {
		sp := corev1.ServicePort{Name: p.name, Protocol: p.proto, Port: p.port, TargetPort: intstr.FromInt32(8000 + p.port)}
		if mix.Type != corev1.ServiceTypeClusterIP {
			sp.NodePort = c.takeNodePort()
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	if mix.Type != corev1.ServiceTypeClusterIP {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if mix.ExternalLocal {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
	}
	if mix.Type == corev1.ServiceTypeLoadBalancer {
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addrAdd(lbBase, i).String()}}
		if mix.ExternalLocal {
			svc.Spec.HealthCheckNodePort = c.takeNodePort()
		}
		if mix.SourceRanges {
			svc.Spec.LoadBalancerSourceRanges = ranges
		}
	}
	if mix.InternalLocal {
		svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}
	if mix.Affinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](10800)}}
	}

	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       Namespace,
			Name:            name + "-abcde",
			Labels:          map[string]string{discoveryv1.LabelServiceName: name},
			ResourceVersion: c.nextVersion(),
		},
		AddressType: addressType,
	}
	for _, p := range ports {
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.name), Protocol: ptr.To(p.proto), Port: ptr.To(8000 + p.port)})
	}
	for k := range c.Endpoints {
		slice.Endpoints = append(slice.Endpoints, c.endpoint(i+k, v6))
	}
	return svc, slice
}

// endpoint returns a ready endpoint with a fresh pod address of the family on node n
// mod Nodes.
func (c *Cluster) endpoint(n int, v6 bool) discoveryv1.Endpoint {
	next := &c.nextPod
	if v6 {
		next = &c.nextPod6
	}
	ip := *next
	*next = next.Next()
	return discoveryv1.Endpoint{
		Addresses:  []string{ip.String()},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		NodeName:   ptr.To("node-" + strconv.Itoa(n%Nodes)),
	}
}

// ReplaceEndpoint returns a copy of slice i (as a new object with a new resource
// version, the way an informer delivers an update) in which endpoint k is replaced by
// a new pod on the same node, and stores it in the Cluster.
func (c *Cluster) ReplaceEndpoint(i, k int) *discoveryv1.EndpointSlice {
	old := c.Slices[i]
	slice := old.DeepCopy()
	slice.ResourceVersion = c.nextVersion()
	k %= len(slice.Endpoints)
	node := slice.Endpoints[k].NodeName
	slice.Endpoints[k] = c.endpoint(0, slice.AddressType == discoveryv1.AddressTypeIPv6)
	slice.Endpoints[k].NodeName = node
	c.Slices[i] = slice
	return slice
}

func (c *Cluster) nextVersion() string {
	c.version++
	return strconv.Itoa(c.version)
}

// addrAdd returns base + n (n < 2^32; an IPv6 base's last 32 bits must not overflow).
func addrAdd(base netip.Addr, n int) netip.Addr {
	if base.Is6() {
		b := base.As16()
		v := uint32(b[12])<<24 | uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
		v += uint32(n)
		b[12], b[13], b[14], b[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		return netip.AddrFrom16(b)
	}
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// LabelServiceProxyName is the label that hands a Service (and, copied by the
// EndpointSlice controller, its slices) to the proxy of that name.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// The proxy names LabelServed gives: the served share's, which the benchmarked node runs
// an instance for, and the rest's, which no proxy on that node serves.
const (
	ServedProxyName = "bench-served"
	OtherProxyName  = "bench-other"
)

// Served reports whether Service i is in a servedPercent share. The share rotates
// through the 100 kinds of MixOf from one block of 100 Services to the next, so the
// served Services hold every kind in its cluster-wide proportion (exactly, when n is a
// multiple of 10,000).
func Served(i, servedPercent int) bool { return (i%100+i/100)%100 < servedPercent }

// LabelServed labels every Service and its slice for a proxy: ServedProxyName for the
// servedPercent share (Served), OtherProxyName for the others. It returns the indices of
// the served Services, in order.
func (c *Cluster) LabelServed(servedPercent int) []int {
	var served []int
	for i := range c.Services {
		name := OtherProxyName
		if Served(i, servedPercent) {
			name = ServedProxyName
			served = append(served, i)
		}
		for _, meta := range []*metav1.ObjectMeta{&c.Services[i].ObjectMeta, &c.Slices[i].ObjectMeta} {
			if meta.Labels == nil {
				meta.Labels = map[string]string{}
			}
			meta.Labels[LabelServiceProxyName] = name
		}
	}
	return served
}
