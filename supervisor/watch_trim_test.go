package supervisor

import (
	"testing"

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
