package supervisor

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
)

// TestTrimForCache: the informers keep neither managedFields nor kubectl's last-applied
// copy, and every other annotation (the shadow annotation, trigger times) stays.
func TestTrimForCache(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Name:          "web",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		Annotations: map[string]string{
			lastApplied:                           `{"big":"copy"}`,
			selector.AnnotationShadow:             "team-a",
			corev1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z",
		},
	}}
	out, err := trimForCache(svc)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Service)
	if len(got.ManagedFields) != 0 {
		t.Errorf("managedFields kept: %v", got.ManagedFields)
	}
	if _, ok := got.Annotations[lastApplied]; ok {
		t.Error("the last-applied annotation was kept")
	}
	for _, k := range []string{selector.AnnotationShadow, corev1.EndpointsLastChangeTriggerTime} {
		if got.Annotations[k] == "" {
			t.Errorf("annotation %s was dropped", k)
		}
	}
	if _, err := trimForCache("not an object"); err != nil {
		t.Errorf("a non-object: %v", err)
	}
}

// TestTrimEndpointSlice: the Pod references, hostnames and owner references go; what
// the model reads (addresses, conditions, node, zone, hints, ports, the Service label,
// the trigger time) stays.
func TestTrimEndpointSlice(t *testing.T) {
	ready := true
	node, zone, host := "node-1", "zone-a", "web-0"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:            "web-abc",
			Labels:          map[string]string{discoveryv1.LabelServiceName: "web"},
			Annotations:     map[string]string{corev1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "web"}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.0.0.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			Hostname:   &host,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "web-0"},
			NodeName:   &node,
			Zone:       &zone,
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		}},
	}
	want := sl.DeepCopy()
	want.OwnerReferences = nil
	want.Endpoints[0].TargetRef, want.Endpoints[0].Hostname = nil, nil
	out, err := trimForCache(sl)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("trimmed slice (-want +got):\n%s", diff)
	}
}

// TestEndpointValuesShared: EndpointSlices keep their endpoints' values (conditions,
// node, zone; nil stays nil) while pointing to one copy of each
// (BenchmarkEndpointSliceHeap measures what it saves).
func TestEndpointValuesShared(t *testing.T) {
	v := newEndpointValues()
	a, b := testSlice("a"), testSlice("b")
	want := a.DeepCopy()
	for _, sl := range []*discoveryv1.EndpointSlice{a, b} {
		if _, err := v.trimSlice(sl); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, a); diff != "" {
		t.Errorf("values changed (-want +got):\n%s", diff)
	}
	ea, eb := a.Endpoints, b.Endpoints
	if ea[0].NodeName != eb[3].NodeName || ea[0].Zone != eb[1].Zone || ea[0].Conditions.Ready != eb[2].Conditions.Ready ||
		ea[0].Conditions.Serving != eb[5].Conditions.Serving || ea[1].Conditions.Ready != ea[0].Conditions.Terminating {
		t.Error("equal values are not shared between endpoints and slices")
	}
	if cap(ea) != len(ea) {
		t.Errorf("the cache keeps room for %d endpoints, holding %d", cap(ea), len(ea))
	}
}

// testSlice is a 10-endpoint slice over 3 nodes and one zone, the last endpoint without
// a zone or a terminating condition.
func testSlice(name string) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for i := range 10 {
		node, zone := fmt.Sprintf("node-%d", i%3), "zone-a"
		ready, serving, terminating := i%2 == 0, true, false
		ep := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.0.0.%d", i)}, NodeName: &node, Zone: &zone,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
		if i == 9 {
			ep.Zone, ep.Conditions.Terminating = nil, nil
		}
		eps = append(eps, ep)
	}
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Endpoints: eps}
}

// BenchmarkEndpointSliceHeap reports the heap a decoded 10-endpoint slice keeps, per
// endpoint, as decoded and with shared endpoint values.
func BenchmarkEndpointSliceHeap(b *testing.B) {
	raw, err := (&discoveryv1.EndpointSlice{Endpoints: testSlice("x").Endpoints}).Marshal()
	if err != nil {
		b.Fatal(err)
	}
	for _, share := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", share), func(b *testing.B) {
			kept := make([]*discoveryv1.EndpointSlice, b.N)
			v := newEndpointValues()
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := range kept {
				sl := &discoveryv1.EndpointSlice{}
				if err := sl.Unmarshal(raw); err != nil {
					b.Fatal(err)
				}
				if share {
					_, _ = v.trimSlice(sl)
				}
				kept[i] = sl
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(kept)
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N*10), "heap-B/endpoint")
		})
	}
}

// TestSharedValuesOfObjects: Services and EndpointSlices keep every value trimming does
// not drop, while the values they repeat (namespace, type, policies, families, port
// names, protocols and numbers) point to one copy.
func TestSharedValuesOfObjects(t *testing.T) {
	newService := func(name string) *corev1.Service {
		policy, itp := corev1.IPFamilyPolicySingleStack, corev1.ServiceInternalTrafficPolicyCluster
		mode, app := corev1.LoadBalancerIPModeVIP, "http"
		ip := "10.96.0." + name
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: string([]byte("team-a")), Name: name},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceType([]byte("LoadBalancer")), ClusterIP: ip, ClusterIPs: []string{string([]byte(ip))},
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &policy, InternalTrafficPolicy: &itp,
				SessionAffinity: "None", ExternalTrafficPolicy: "Cluster",
				Ports: []corev1.ServicePort{{Name: string([]byte("http")), Protocol: "TCP", Port: 80, AppProtocol: &app}},
			},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.1", IPMode: &mode}}}},
		}
	}
	newSlice := func(name string) *discoveryv1.EndpointSlice {
		pn, proto, port := string([]byte("http")), corev1.ProtocolTCP, int32(8080)
		sl := testSlice(name)
		sl.Namespace = string([]byte("team-a"))
		sl.AddressType = discoveryv1.AddressType([]byte("IPv4"))
		sl.Ports = []discoveryv1.EndpointPort{{Name: &pn, Protocol: &proto, Port: &port}}
		return sl
	}
	v := newEndpointValues()
	var svcs []*corev1.Service
	var sls []*discoveryv1.EndpointSlice
	for _, name := range []string{"1", "2"} {
		svc, sl := newService(name), newSlice(name)
		wantSvc, wantSl := svc.DeepCopy(), sl.DeepCopy()
		if _, err := v.trimService(svc); err != nil {
			t.Fatal(err)
		}
		if _, err := v.trimSlice(sl); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantSvc, svc); diff != "" {
			t.Errorf("Service values changed (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(wantSl, sl); diff != "" {
			t.Errorf("EndpointSlice values changed (-want +got):\n%s", diff)
		}
		svcs, sls = append(svcs, svc), append(sls, sl)
	}
	a, b := svcs[0], svcs[1]
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	for what, shared := range map[string]bool{
		"namespace":             same(a.Namespace, b.Namespace) && same(a.Namespace, sls[1].Namespace),
		"type":                  same(string(a.Spec.Type), string(b.Spec.Type)),
		"ipFamilies":            &a.Spec.IPFamilies[0] == &b.Spec.IPFamilies[0],
		"ipFamilyPolicy":        a.Spec.IPFamilyPolicy == b.Spec.IPFamilyPolicy,
		"internalTrafficPolicy": a.Spec.InternalTrafficPolicy == b.Spec.InternalTrafficPolicy,
		"clusterIP":             same(a.Spec.ClusterIP, a.Spec.ClusterIPs[0]),
		"port name":             same(a.Spec.Ports[0].Name, b.Spec.Ports[0].Name),
		"appProtocol":           a.Spec.Ports[0].AppProtocol == b.Spec.Ports[0].AppProtocol,
		"ipMode":                a.Status.LoadBalancer.Ingress[0].IPMode == b.Status.LoadBalancer.Ingress[0].IPMode,
		"addressType":           same(string(sls[0].AddressType), string(sls[1].AddressType)),
		"slice port name":       sls[0].Ports[0].Name == sls[1].Ports[0].Name,
		"slice port protocol":   sls[0].Ports[0].Protocol == sls[1].Ports[0].Protocol,
		"slice port number":     sls[0].Ports[0].Port == sls[1].Ports[0].Port,
	} {
		if !shared {
			t.Errorf("%s is not shared", what)
		}
	}
}
