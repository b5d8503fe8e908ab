package instance

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/shardproxy/shardproxy/tables"
)

// The test plan: this node is node-a in zone-a; node-b shares the zone, node-c is in
// zone-b. Pod addresses name their node: 10.244.1.x runs on node-a, .2.x on node-b,
// .3.x on node-c.
const (
	thisNodeName = "node-a"
	thisZone     = "zone-a"
	clusterIP4   = "172.30.0.10"
	clusterIP6   = "fd00:30::10"
)

var webName = types.NamespacedName{Namespace: "ns", Name: "web"}

// thisNode is the NodeInfo of the node the tests run "on".
func thisNode() NodeInfo {
	return NodeInfo{Name: thisNodeName, Labels: map[string]string{corev1.LabelTopologyZone: thisZone}}
}

// service returns ClusterIP Service ns/web on 172.30.0.10 with one port "http" 80/TCP
// (targetPort "web"), then applies edits.
func service(edits ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: webName.Namespace, Name: webName.Name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP4,
			ClusterIPs: []string{clusterIP4},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")},
			},
		},
	}
	for _, edit := range edits {
		edit(svc)
	}
	return svc
}

// dualStack gives the Service an IPv4 and an IPv6 cluster IP.
func dualStack(svc *corev1.Service) {
	svc.Spec.ClusterIPs = []string{clusterIP4, clusterIP6}
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
}

// ofType sets the Service type; NodePort and LoadBalancer get node port 30080.
func ofType(t corev1.ServiceType) func(*corev1.Service) {
	return func(svc *corev1.Service) {
		svc.Spec.Type = t
		if t == corev1.ServiceTypeNodePort || t == corev1.ServiceTypeLoadBalancer {
			for i := range svc.Spec.Ports {
				svc.Spec.Ports[i].NodePort = 30080 + int32(i)
			}
		}
	}
}

// ingress is a load balancer ingress with ip and, when mode is non-empty, ipMode.
func ingress(ip string, mode corev1.LoadBalancerIPMode) corev1.LoadBalancerIngress {
	ing := corev1.LoadBalancerIngress{IP: ip}
	if mode != "" {
		ing.IPMode = &mode
	}
	return ing
}

// slicePort is an EndpointSlice TCP port.
func slicePort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: ptr.To(corev1.ProtocolTCP)}
}

// epSlice is an EndpointSlice of ns/web.
func epSlice(name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: webName.Namespace,
			Name:      name,
			Labels:    map[string]string{discoveryv1.LabelServiceName: webName.Name},
		},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
}

// v4Slice is an IPv4 EndpointSlice of ns/web whose port "http" is 8080.
func v4Slice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return epSlice(name, discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{slicePort("http", 8080)}, eps...)
}

// v6Slice is an IPv6 EndpointSlice of ns/web whose port "http" is 8080.
func v6Slice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return epSlice(name, discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{slicePort("http", 8080)}, eps...)
}

// ep is a ready endpoint on node (none when empty), then edits.
func ep(ip, node string, edits ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{ip}}
	if node != "" {
		e.NodeName = ptr.To(node)
	}
	for _, edit := range edits {
		edit(&e)
	}
	return e
}

// notReady marks an endpoint not ready and not serving (a pod starting up).
func notReady(e *discoveryv1.Endpoint) {
	e.Conditions.Ready = ptr.To(false)
	e.Conditions.Serving = ptr.To(false)
}

// terminating marks an endpoint terminating, still serving or not.
func terminating(serving bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions.Ready = ptr.To(false)
		e.Conditions.Serving = ptr.To(serving)
		e.Conditions.Terminating = ptr.To(true)
	}
}

// forZones sets an endpoint's zone hints.
func forZones(zones ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

// forNodes sets an endpoint's node hints.
func forNodes(nodes ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// wantPort is the model of the default Service's port "http" in family f with no
// endpoints, then edits.
func wantPort(f tables.Family, edits ...func(*tables.ServicePort)) *tables.ServicePort {
	ip := clusterIP4
	if f == tables.IPv6 {
		ip = clusterIP6
	}
	sp := &tables.ServicePort{
		Name:      tables.ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: tables.TCP},
		Protocol:  tables.TCP,
		Port:      80,
		ClusterIP: netip.MustParseAddr(ip),
		// Build resolves every port's mode; without settings, random.
		LoadBalancing: tables.LBRandom,
	}
	for _, edit := range edits {
		edit(sp)
	}
	return sp
}

// ips parses addresses.
func ips(list ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range list {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// prefixes parses CIDRs.
func prefixes(list ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range list {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// eps parses "ip:port" endpoints.
func eps(list ...string) []tables.Endpoint {
	var out []tables.Endpoint
	for _, s := range list {
		ap := netip.MustParseAddrPort(s)
		out = append(out, tables.Endpoint{IP: ap.Addr(), Port: ap.Port()})
	}
	return out
}

// modelOptions compare models: netip values by value, nil and empty lists alike.
func modelOptions() cmp.Options {
	return cmp.Options{
		cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
		cmpopts.EquateEmpty(),
	}
}

// checkProblems fails unless problems match want one for one, each holding its substring.
func checkProblems(t *testing.T, problems, want []string) {
	t.Helper()
	ok := len(problems) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(problems[i], want[i])
	}
	if !ok {
		t.Errorf("problems:\n  %s\nwant lines containing:\n  %s", strings.Join(problems, "\n  "), strings.Join(want, "\n  "))
	}
}
