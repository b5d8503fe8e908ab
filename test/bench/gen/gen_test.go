package gen

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestGenerateFamilies: the IPv6 share is exact, spread over every kind of Service, and
// each Service's addresses, slice and endpoints are of its family.
func TestGenerateFamilies(t *testing.T) {
	for _, tc := range []struct {
		name    string
		percent int
		wantV6  int
	}{
		{"IPv4 only", 0, 0},
		{"half IPv6", 50, 500},
		{"IPv6 only", 100, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := GenerateFamilies(1000, 3, tc.percent)
			v6 := 0
			kinds := map[corev1.ServiceType]map[bool]bool{}
			for i, svc := range c.Services {
				is6 := c.IsIPv6(i)
				if is6 {
					v6++
				}
				if kinds[svc.Spec.Type] == nil {
					kinds[svc.Spec.Type] = map[bool]bool{}
				}
				kinds[svc.Spec.Type][is6] = true
				checkFamily(t, svc, c.Slices[i], is6)
			}
			if v6 != tc.wantV6 {
				t.Errorf("%d IPv6 Services, want %d", v6, tc.wantV6)
			}
			if tc.percent == 50 {
				for kind, fams := range kinds {
					if !fams[true] || !fams[false] {
						t.Errorf("%s Services only in one family: %v", kind, fams)
					}
				}
			}
		})
	}
}

func checkFamily(t *testing.T, svc *corev1.Service, slice *discoveryv1.EndpointSlice, v6 bool) {
	t.Helper()
	is6 := func(s string) bool { return netip.MustParseAddr(s).Is6() }
	if is6(svc.Spec.ClusterIP) != v6 || (svc.Spec.IPFamilies[0] == corev1.IPv6Protocol) != v6 {
		t.Fatalf("%s: cluster IP %s, families %v, want IPv6 %v", svc.Name, svc.Spec.ClusterIP, svc.Spec.IPFamilies, v6)
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if is6(ing.IP) != v6 {
			t.Errorf("%s: load-balancer IP %s of the other family", svc.Name, ing.IP)
		}
	}
	for _, r := range svc.Spec.LoadBalancerSourceRanges {
		if netip.MustParsePrefix(r).Addr().Is6() != v6 {
			t.Errorf("%s: source range %s of the other family", svc.Name, r)
		}
	}
	if (slice.AddressType == discoveryv1.AddressTypeIPv6) != v6 {
		t.Errorf("%s: slice address type %s", svc.Name, slice.AddressType)
	}
	for _, ep := range slice.Endpoints {
		if is6(ep.Addresses[0]) != v6 {
			t.Errorf("%s: endpoint %s of the other family", svc.Name, ep.Addresses[0])
		}
	}
}

// TestGenerateIPv4Unchanged: the IPv4-only cluster is what it always was, so figures
// stay comparable across runs of the benchmarks.
func TestGenerateIPv4Unchanged(t *testing.T) {
	c := Generate(3, 2)
	if got := c.Services[2].Spec.ClusterIP; got != "10.96.0.12" {
		t.Errorf("Service 2's cluster IP %s, want 10.96.0.12", got)
	}
	if got := c.Slices[1].Endpoints[0].Addresses[0]; got != "100.64.0.3" {
		t.Errorf("Service 1's first endpoint %s, want 100.64.0.3", got)
	}
	if got := c.ReplaceEndpoint(0, 1).Endpoints[1].Addresses[0]; got != "100.64.0.7" {
		t.Errorf("replaced endpoint %s, want 100.64.0.7", got)
	}
}

// TestNodePortsAreDistinctAt100k: 100,000 Services get valid NodePorts, none twice.
func TestNodePortsAreDistinctAt100k(t *testing.T) {
	c := GenerateFamilies(100_000, 1, 50)
	seen := map[int32]string{}
	for _, svc := range c.Services {
		for _, p := range NodePorts(svc) {
			if p < WrapNodePort || p > 65535 {
				t.Fatalf("%s: NodePort %d outside %d-65535", svc.Name, p, WrapNodePort)
			}
			if other, dup := seen[p]; dup {
				t.Fatalf("NodePort %d given to %s and %s", p, other, svc.Name)
			}
			seen[p] = svc.Name
		}
	}
	t.Logf("%d NodePorts", len(seen))
}

// TestLabelServed: the served share is exact and holds every kind of Service in its
// cluster-wide proportion; each Service and its slice carry the same proxy name, the
// served share ServedProxyName and the rest OtherProxyName.
func TestLabelServed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		services   int
		percent    int
		wantServed int
	}{
		{"a tenth of 10,000", 10000, 10, 1000},
		{"a tenth of 30,000", 30000, 10, 3000},
		{"a quarter of 1,000", 1000, 25, 250},
		{"none", 200, 0, 0},
		{"all", 200, 100, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Generate(tc.services, 1)
			served := c.LabelServed(tc.percent)
			if len(served) != tc.wantServed {
				t.Fatalf("%d served, want %d", len(served), tc.wantServed)
			}
			isServed := map[int]bool{}
			kinds := map[Mix]int{}
			for _, i := range served {
				isServed[i] = true
				kinds[MixOf(i)]++
			}
			for i, svc := range c.Services {
				want := OtherProxyName
				if isServed[i] {
					want = ServedProxyName
				}
				if got := svc.Labels[LabelServiceProxyName]; got != want {
					t.Errorf("%s: proxy name %q, want %q", svc.Name, got, want)
				}
				if got := c.Slices[i].Labels[LabelServiceProxyName]; got != want {
					t.Errorf("%s: proxy name %q, want %q", c.Slices[i].Name, got, want)
				}
				if c.Slices[i].Labels[discoveryv1.LabelServiceName] != svc.Name {
					t.Errorf("%s: lost its service-name label", c.Slices[i].Name)
				}
			}
			if tc.services%10000 != 0 {
				return
			}
			for i := range 100 { // every kind, served in its proportion of the cluster
				if got, want := kinds[MixOf(i)], countMix(tc.services, MixOf(i))*tc.percent/100; got != want {
					t.Errorf("kind %+v: %d served, want %d", MixOf(i), got, want)
				}
			}
		})
	}
}

// countMix is how many of n Services are of kind m.
func countMix(n int, m Mix) int {
	k := 0
	for i := range n {
		if MixOf(i) == m {
			k++
		}
	}
	return k
}

// TestAddressPlanHolds100k: the addresses of Service 99,999 (the last of issue 13's
// largest scale), in either family, fall inside the ranges an apiserver and an instance
// are given for them.
func TestAddressPlanHolds100k(t *testing.T) {
	inAny := func(addr string, cidrs []string) bool {
		for _, c := range cidrs {
			if netip.MustParsePrefix(c).Contains(netip.MustParseAddr(addr)) {
				return true
			}
		}
		return false
	}
	lb := []string{LoadBalancerRange.String(), LoadBalancerRange6.String()}
	for _, tc := range []struct {
		name    string
		percent int
	}{{"IPv4", 0}, {"IPv6", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			c := GenerateFamilies(0, 1, tc.percent)
			const last = 99_999 // a LoadBalancer Service (MixOf: 99 mod 100)
			svc, _ := c.New(last)
			if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				t.Fatalf("Service %d is %s, want a LoadBalancer", last, svc.Spec.Type)
			}
			if !inAny(svc.Spec.ClusterIP, ServiceCIDRs) {
				t.Errorf("cluster IP %s outside %v", svc.Spec.ClusterIP, ServiceCIDRs)
			}
			if ip := svc.Status.LoadBalancer.Ingress[0].IP; !inAny(ip, lb) {
				t.Errorf("load-balancer IP %s outside %v", ip, lb)
			}
		})
	}
}
