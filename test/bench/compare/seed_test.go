package compare

import (
	"math/big"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"

	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// TestSeedObjects: what seedEtcd writes decodes, under the apiserver's keys, into the
// generated objects with what the apiserver would have defaulted, IPAddresses naming
// their Service, and a NodePort bitmap holding exactly the generated NodePorts.
func TestSeedObjects(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	pb := protobuf.NewSerializer(scheme, scheme)
	decode := func(kv keyValue) runtime.Object {
		t.Helper()
		obj, _, err := pb.Decode(kv.value, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", kv.key, err)
		}
		return obj
	}
	c := gen.GenerateFamilies(100, 3, 50)
	s := newEtcdSeeder(nil)
	for _, i := range []int{0, 93, 97} { // IPv4 ClusterIP, IPv4 LoadBalancer, IPv6 LoadBalancer
		objs, err := s.serviceObjects(c, i)
		if err != nil || len(objs) != 2 {
			t.Fatalf("Service %d: %d objects, %v", i, len(objs), err)
		}
		svc, ok := decode(objs[0]).(*corev1.Service)
		if !ok || objs[0].key != "/registry/services/specs/bench/"+c.Services[i].Name || svc.UID == "" ||
			svc.Spec.ClusterIP != c.Services[i].Spec.ClusterIP || *svc.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack ||
			svc.Spec.SessionAffinity == "" || svc.Spec.InternalTrafficPolicy == nil ||
			len(svc.Status.LoadBalancer.Ingress) != len(c.Services[i].Status.LoadBalancer.Ingress) {
			t.Errorf("Service %d: %s: %+v", i, objs[0].key, svc)
		}
		slice, ok := decode(objs[1]).(*discoveryv1.EndpointSlice)
		if !ok || objs[1].key != "/registry/endpointslices/bench/"+c.Slices[i].Name || len(slice.Endpoints) != 3 {
			t.Errorf("Service %d: %s: %+v", i, objs[1].key, slice)
		}
		for _, ep := range slice.Endpoints {
			if *ep.NodeName == gen.NodeName {
				t.Errorf("Service %d: an endpoint left on %s, not moved to %s", i, gen.NodeName, env.NodeName)
			}
		}
		addr, err := s.addressObjects(c, i)
		if err != nil {
			t.Fatal(err)
		}
		ip, ok := decode(addr[0]).(*networkingv1.IPAddress)
		if !ok || ip.Name != svc.Spec.ClusterIP || !strings.HasSuffix(addr[0].key, "/ipaddresses/"+ip.Name) ||
			ip.Spec.ParentRef.Resource != "services" || ip.Spec.ParentRef.Name != svc.Name ||
			ip.Labels[networkingv1.LabelIPAddressFamily] != string(svc.Spec.IPFamilies[0]) {
			t.Errorf("Service %d: %s: %+v", i, addr[0].key, ip)
		}
	}

	kv, err := s.nodePortAllocation(c)
	if err != nil {
		t.Fatal(err)
	}
	ra, ok := decode(kv).(*corev1.RangeAllocation)
	if !ok || kv.key != "/registry/ranges/servicenodeports" || ra.Range != gen.NodePortRange {
		t.Fatalf("%s: %+v", kv.key, ra)
	}
	bits := new(big.Int).SetBytes(ra.Data)
	want := 0
	for _, svc := range c.Services {
		for _, p := range gen.NodePorts(svc) {
			want++
			if bits.Bit(int(p)-20000) != 1 {
				t.Errorf("NodePort %d of %s not in the allocation", p, svc.Name)
			}
		}
	}
	set := 0
	for i := range bits.BitLen() {
		set += int(bits.Bit(i))
	}
	if want == 0 || set != want {
		t.Errorf("%d ports in the allocation, want %d", set, want)
	}
}
