package supervisor

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSliceAudit: a Service held without a slice for the grace is asked about once, and
// warned about when the API server has slices of it (which the node's scoped watch does
// not see); not one with slices held, a headless or ExternalName one, nor one whose
// slices do not exist; asked again only after the recheck, or after a failed request,
// or once it left and came back bare.
func TestSliceAudit(t *testing.T) {
	svc := func(name string, mutate ...func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
		for _, m := range mutate {
			m(s)
		}
		return s
	}
	unlabeled := svc("db")  // slices exist without the node's labels
	none := svc("empty")    // no slice anywhere
	held := svc("web")      // the node holds its slice
	failing := svc("flaky") // the first request fails
	headless := svc("headless", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone })
	external := svc("ext", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName; s.Spec.ClusterIP = "" })
	all := []*corev1.Service{unlabeled, none, held, failing, headless, external}

	var asked, warned []string
	fail := true
	a := newSliceAudit(func(_ context.Context, ns, name string) (int, error) {
		asked = append(asked, name)
		switch name {
		case "db", "headless", "ext":
			return 2, nil
		case "flaky":
			if fail {
				fail = false
				return 0, errors.New("apiserver unavailable")
			}
			return 1, nil
		}
		return 0, nil
	}, func(s *corev1.Service, n int) { warned = append(warned, s.Name) })
	hasSlices := func(_, name string) bool { return name == "web" }

	t0 := time.Unix(1_000_000, 0)
	for _, step := range []struct {
		at                    time.Duration
		held                  []*corev1.Service
		wantAsked, wantWarned []string
	}{
		{0, all, nil, nil}, // first seen bare: the grace starts
		{sliceAuditGrace / 2, all, nil, nil},
		{sliceAuditGrace, all, []string{"db", "empty", "flaky"}, []string{"db"}},
		{sliceAuditGrace + sliceAuditEvery, all, []string{"flaky"}, []string{"flaky"}},             // the failed one again
		{sliceAuditGrace + 2*sliceAuditEvery, all, nil, nil},                                       // each asked once
		{sliceAuditGrace + sliceAuditRecheck, all, []string{"db", "empty"}, []string{"db"}},        // flaky was asked later
		{sliceAuditGrace + sliceAuditRecheck + sliceAuditEvery, []*corev1.Service{none}, nil, nil}, // db gone
		{sliceAuditGrace + sliceAuditRecheck + 2*sliceAuditEvery, all, nil, nil},                   // back: a new grace
		{2*sliceAuditGrace + sliceAuditRecheck + 2*sliceAuditEvery, all, []string{"db", "flaky"}, []string{"db", "flaky"}},
	} {
		asked, warned = nil, nil
		a.check(context.Background(), t0.Add(step.at), step.held, hasSlices)
		if !slices.Equal(asked, step.wantAsked) || !slices.Equal(warned, step.wantWarned) {
			t.Errorf("at %v: asked %v, warned %v; want %v, %v", step.at, asked, warned, step.wantAsked, step.wantWarned)
		}
	}
}
