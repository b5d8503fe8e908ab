package supervisor

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
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
