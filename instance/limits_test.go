package instance

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/tables"
)

// endpointsOn returns n ready endpoints 10.244.<subnet>.1.. on node-b.
func endpointsOn(subnet string, n int) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, n)
	for i := range out {
		out[i] = ep("10.244."+subnet+"."+strconv.Itoa(i+1), "node-b")
	}
	return out
}

// sliceOf returns an IPv4 EndpointSlice of Service ns/svc with the given ports and
// endpoints.
func sliceOf(svc, name string, ports []discoveryv1.EndpointPort, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := epSlice(name, discoveryv1.AddressTypeIPv4, ports, eps...)
	s.Labels[discoveryv1.LabelServiceName] = svc
	return s
}

func TestElementEstimate(t *testing.T) {
	np := map[tables.Family]int{tables.IPv4: 3, tables.IPv6: 1}
	http := []discoveryv1.EndpointPort{slicePort("http", 8080)}
	twoPorts := []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("https", 8443)}
	addPort := func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP})
	}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		mode   tables.LBMode
		want   int
	}{
		{name: "cluster IP without endpoints", svc: service(), want: 1},
		{
			name: "each endpoint of each port", svc: service(addPort),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, twoPorts, endpointsOn("1", 10)...)},
			want:   1 * (2 + 2*10),
		},
		{
			name: "every slice counts",
			svc:  service(),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...),
				epSlice("web-2", discoveryv1.AddressTypeIPv4, http, endpointsOn("2", 5)...),
			},
			want: 1 * (1 + 15),
		},
		{
			name: "external IPs, load-balancer IPs and NodePort addresses multiply",
			svc: service(ofType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}, {Hostname: "lb.example"}}
			}),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...)},
			// cluster IP + 2 external IPv4 + 1 LB + 3 NodePort addresses; the IPv6
			// external IP has no IPv6 cluster IP to go with.
			want: (1 + 2 + 1 + 3) * (1 + 10),
		},
		{
			name: "no NodePort addresses without a node port",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeNodePort
			}),
			want: 1,
		},
		{
			name: "load-balancer status of a ClusterIP Service is not read",
			svc: service(func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
			}),
			want: 1,
		},
		{
			name: "the larger family",
			svc:  service(dualStack),
			slices: []*discoveryv1.EndpointSlice{
				epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...),
				epSlice("web-2", discoveryv1.AddressTypeIPv6, http, ep("fd00:10:244:1::1", ""), ep("fd00:10:244:1::2", "")),
				epSlice("web-3", discoveryv1.AddressTypeFQDN, http, endpointsOn("3", 50)...),
			},
			want: 1 + 10,
		},
		{name: "headless", svc: service(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), want: 0},
		{
			name: "ExternalName",
			svc: service(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeExternalName
				s.Spec.ExternalIPs = []string{"192.0.2.1"}
			}),
			want: 0,
		},
		{name: "legacy clusterIP field only", svc: service(func(s *corev1.Service) { s.Spec.ClusterIPs = nil }), want: 1},
		{
			name:   "consistentHash: the entries share the cluster IP's table",
			svc:    service(ofType(corev1.ServiceTypeNodePort)),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...)},
			mode:   tables.LBConsistentHash,
			// cluster IP + 3 NodePort addresses, 3 elements each, and one table.
			want: (1+3)*3 + tables.ConsistentTableSlots,
		},
		{
			name: "consistentHash with Local external policy: every entry holds a table",
			svc: service(ofType(corev1.ServiceTypeNodePort), func(s *corev1.Service) {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}),
			slices: []*discoveryv1.EndpointSlice{epSlice("web-1", discoveryv1.AddressTypeIPv4, http, endpointsOn("1", 10)...)},
			mode:   tables.LBConsistentHash,
			want:   (1 + 3) * (1 + tables.ConsistentTableSlots),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := elementEstimate(tc.svc, tc.slices, np, tc.mode); got != tc.want {
				t.Errorf("elementEstimate = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestServiceOverLimitRefused checks a Service bringing more elements than
// MaxServiceElements is refused (not programmed, its model says why, one log line, its
// model not even built) while every other Service of the instance is programmed, in full
// and partial syncs, and that it is programmed again once it fits.
func TestServiceOverLimitRefused(t *testing.T) {
	big := types.NamespacedName{Namespace: "ns", Name: "big"}
	const bigIP = "172.30.0.50"
	bigSvc := func(edits ...func(*corev1.Service)) *corev1.Service {
		svc := namedAt(big.Name, bigIP)
		for _, e := range edits {
			e(svc)
		}
		return svc
	}
	http := []discoveryv1.EndpointPort{slicePort("http", 8080)}
	twoPorts := []discoveryv1.EndpointPort{slicePort("http", 8080), slicePort("other", 9090)}

	p, nft := newTestProxy(t, nil, func(o *Options) { o.MaxServiceElements = 20 })
	var mu sync.Mutex
	var refusals []string
	p.logger = funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(args, "Refused a Service") {
			refusals = append(refusals, args)
		}
	}, funcr.Options{})
	var built []string
	p.tracker.build = func(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo) *ServiceModel {
		mu.Lock()
		built = append(built, svc.Name)
		mu.Unlock()
		return Build(svc, slices, node)
	}
	ctx := context.Background()

	for _, step := range []struct {
		name        string
		do          func()
		full        bool
		wantRefused bool
		// wantLogs is how many refusals the step logs.
		wantLogs int
		// wantIPs are programmed, wantGone not.
		wantIPs, wantGone []string
	}{
		{
			name: "full sync: the Service over the limit is refused, the other programmed",
			do: func() {
				p.UpdateService(service())
				p.UpdateEndpointSlice(v4Slice("web-1", endpointsOn("1", 5)...))
				p.UpdateService(bigSvc())
				// 1 entry × (1 port + 2 ports × 15 endpoints) = 31
				p.UpdateEndpointSlice(sliceOf(big.Name, "big-1", twoPorts, endpointsOn("2", 15)))
			},
			full: true, wantRefused: true, wantLogs: 1,
			wantIPs: []string{clusterIP4, "10.244.1.5 . 8080"}, wantGone: []string{bigIP, "10.244.2."},
		},
		{
			name:        "partial sync: another Service's change is programmed",
			do:          func() { p.UpdateEndpointSlice(v4Slice("web-1", endpointsOn("1", 6)...)) },
			wantRefused: true,
			wantIPs:     []string{clusterIP4, "10.244.1.6 . 8080"}, wantGone: []string{bigIP},
		},
		{
			name: "shrunk under the limit: programmed",
			// 1 × (1 + 1 × 15) = 16
			do:      func() { p.UpdateEndpointSlice(sliceOf(big.Name, "big-1", http, endpointsOn("2", 15))) },
			wantIPs: []string{clusterIP4, bigIP, "10.244.2.15 . 8080"},
		},
		{
			name: "grown over it in a partial sync: its rules are removed",
			do: func() {
				p.UpdateEndpointSlice(sliceOf(big.Name, "big-2", http, endpointsOn("3", 5)))
			},
			wantRefused: true, wantLogs: 1,
			wantIPs: []string{clusterIP4}, wantGone: []string{bigIP, "10.244.2.", "10.244.3."},
		},
		{
			name: "NodePort addresses count",
			do: func() {
				p.DeleteEndpointSlice(sliceOf(big.Name, "big-2", nil, nil))
				p.UpdateService(bigSvc(ofType(corev1.ServiceTypeNodePort)))
				// 16 before; (1 + 1 node address) × 16 = 32 after.
				if err := p.Reconfigure(func(c *tables.Config) { c.NodePortIPs = ips("192.168.0.1", "127.0.0.1") }); err != nil {
					t.Fatal(err)
				}
			},
			full: true, wantRefused: true, wantLogs: 1,
			wantIPs: []string{clusterIP4}, wantGone: []string{bigIP},
		},
	} {
		mu.Lock()
		refusals, built = nil, nil
		mu.Unlock()
		step.do()
		res, err := p.Sync(ctx, false)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if res.Full != step.full {
			t.Errorf("%s: full = %v, want %v", step.name, res.Full, step.full)
		}
		m := p.Applied()[big]
		if m == nil {
			t.Fatalf("%s: no model applied for %s", step.name, big)
		}
		if refused := m.Refused != ""; refused != step.wantRefused {
			t.Errorf("%s: refused = %q, want refused %v", step.name, m.Refused, step.wantRefused)
		}
		if step.wantRefused && (len(m.Ports) != 0 || !strings.Contains(m.Refused, "over the limit of 20 per Service")) {
			t.Errorf("%s: refused model %+v, want no ports and the limit in Refused", step.name, m)
		}
		if w := p.Applied()[webName]; w == nil || w.Refused != "" || len(w.Ports[tables.IPv4]) != 1 {
			t.Errorf("%s: ns/web applied as %+v, want it programmed", step.name, w)
		}
		mu.Lock()
		if len(refusals) != step.wantLogs || step.wantLogs > 0 && !strings.Contains(refusals[0], `"big"`) {
			t.Errorf("%s: refusal logs %q, want %d naming %s", step.name, refusals, step.wantLogs, big)
		}
		if step.wantRefused && strings.Contains(strings.Join(built, " "), big.Name) {
			t.Errorf("%s: the refused Service's model was built", step.name)
		}
		mu.Unlock()
		dump := nft.dump()
		for _, ip := range step.wantIPs {
			if !strings.Contains(dump, ip) {
				t.Errorf("%s: %s not programmed:\n%s", step.name, ip, dump)
			}
		}
		for _, ip := range step.wantGone {
			if strings.Contains(dump, ip) {
				t.Errorf("%s: %s programmed:\n%s", step.name, ip, dump)
			}
		}
	}
}
