package supervisor

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSliceAudit: a Service held without a slice past the grace (and this node's
// spread) is asked about once per version, and warned about when the API server has
// slices of it (which the node's scoped watch does not see); not one whose slices the
// node holds, a headless or ExternalName one, nor one whose slices do not exist; a
// failed request is tried again; a Service that leaves and comes back bare starts anew.
func TestSliceAudit(t *testing.T) {
	svc := func(name, rv string, mutate ...func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: rv},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
		for _, m := range mutate {
			m(s)
		}
		return s
	}
	unlabeled := svc("db", "1")  // slices exist without the node's labels
	none := svc("empty", "1")    // no slice anywhere
	held := svc("web", "1")      // the node holds its slice
	failing := svc("flaky", "1") // the first request fails
	headless := svc("headless", "1", func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone })
	external := svc("ext", "1", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName; s.Spec.ClusterIP = "" })
	noVersion := svc("unversioned", "") // asked once all the same
	all := []*corev1.Service{unlabeled, none, held, failing, headless, external, noVersion}
	dbChanged := []*corev1.Service{svc("db", "2"), none, held, failing, headless, external, noVersion}

	var asked, warned []string
	fail := true
	a := newSliceAudit("node-1", func(_ context.Context, ns, name string) (int, error) {
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

	past := sliceAuditGrace + sliceAuditSpread // every Service's spread is below it
	t0 := time.Unix(1_000_000, 0)
	for _, step := range []struct {
		at                    time.Duration
		held                  []*corev1.Service
		wantAsked, wantWarned []string
	}{
		{0, all, nil, nil}, // first seen bare: the grace starts
		{sliceAuditGrace / 2, all, nil, nil},
		{past, all, []string{"db", "empty", "flaky", "unversioned"}, []string{"db"}},
		{past + sliceAuditEvery, all, []string{"flaky"}, []string{"flaky"}}, // the failed one again
		{past + 2*sliceAuditEvery, all, nil, nil},                           // each version asked once
		{past + 3*sliceAuditEvery, dbChanged, []string{"db"}, []string{"db"}},
		{past + 4*sliceAuditEvery, []*corev1.Service{none}, nil, nil}, // db and flaky gone
		{past + 5*sliceAuditEvery, all, nil, nil},                     // back: a new grace
		{2*past + 5*sliceAuditEvery, all, []string{"db", "flaky", "unversioned"}, []string{"db", "flaky"}},
	} {
		asked, warned = nil, nil
		a.check(context.Background(), t0.Add(step.at), step.held, hasSlices)
		if !slices.Equal(asked, step.wantAsked) || !slices.Equal(warned, step.wantWarned) {
			t.Errorf("at %v: asked %v, warned %v; want %v, %v", step.at, asked, warned, step.wantAsked, step.wantWarned)
		}
	}
}

// TestSliceAuditSpread: nodes ask about one Service at different times within the
// spread, each node always at the same.
func TestSliceAuditSpread(t *testing.T) {
	name := types.NamespacedName{Namespace: "shop", Name: "db"}
	times := map[time.Duration]bool{}
	for i := range 100 {
		a := newSliceAudit("node-"+string(rune('a'+i%26))+string(rune('a'+i/26)), nil, nil)
		d := a.spread(name)
		if d < 0 || d >= sliceAuditSpread || d != a.spread(name) {
			t.Fatalf("spread %v of %s: outside [0, %v) or not stable", d, a.node, sliceAuditSpread)
		}
		times[d] = true
	}
	if len(times) < 90 {
		t.Errorf("100 nodes ask at only %d distinct times", len(times))
	}
}

// TestHeldServices: a Service two watches hold is listed once, in the newer version;
// Scoped tells a node watching some Services from one watching all.
func TestHeldServices(t *testing.T) {
	w, err := NewWatches(fake.NewClientset(), "node-1", []string{"a in (x)", "b in (x)"}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj := func(name, rv, label string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: rv,
			Labels: map[string]string{"a": label}}}
	}
	for i, svcs := range [][]*corev1.Service{{obj("db", "9", "new")}, {obj("db", "7", "old"), obj("web", "3", "x")}} {
		for _, s := range svcs {
			if err := w.services[i].GetStore().Add(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := map[string]string{}
	for _, s := range w.HeldServices() {
		got[s.Name] = s.ResourceVersion + "/" + s.Labels["a"]
	}
	if want := map[string]string{"db": "9/new", "web": "3/x"}; !maps.Equal(got, want) {
		t.Errorf("held %v, want %v", got, want)
	}
	all, err := NewWatches(fake.NewClientset(), "node-1", []string{""}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !w.Scoped() || all.Scoped() {
		t.Errorf("Scoped: %v for two selectors, %v for everything", w.Scoped(), all.Scoped())
	}
}
