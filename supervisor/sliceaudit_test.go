package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestSliceAudit: a Service held without a slice past the grace (and this node's
// spread) is asked about once per version (no sooner than the recheck after the last
// answer), and warned about when the API server has
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
	again := past + sliceAuditRecheck + sliceAuditSpread
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
		{past + 3*sliceAuditEvery, dbChanged, nil, nil},                     // a new version, asked too recently
		{again, dbChanged, []string{"db"}, []string{"db"}},                  // and once the recheck has passed
		{again + sliceAuditEvery, []*corev1.Service{none}, nil, nil},        // db and flaky gone
		{again + 2*sliceAuditEvery, all, nil, nil},                          // back: a new grace
		{again + 2*sliceAuditEvery + past, all, []string{"db", "flaky", "unversioned"}, []string{"db", "flaky"}},
	} {
		asked, warned = nil, nil
		a.check(context.Background(), t0.Add(step.at), step.held, hasSlices)
		slices.Sort(asked)
		slices.Sort(warned)
		if !slices.Equal(asked, step.wantAsked) || !slices.Equal(warned, step.wantWarned) {
			t.Errorf("at %v: asked %v, warned %v; want %v, %v", step.at, asked, warned, step.wantAsked, step.wantWarned)
		}
	}
}

// TestSliceAuditBoundsLists: however often tenants change their Services, a node asks
// the API server about one Service at most once per recheck (plus its spread) and at
// most sliceAuditBudget times per check in all, and still asks about every bare Service,
// and warns about each one whose slices it does not see. An hour of checks, every
// Service's slices existing unlabelled.
func TestSliceAuditBoundsLists(t *testing.T) {
	const hour = time.Hour
	checks := int(hour / sliceAuditEvery)
	perService := 1 + int(hour/sliceAuditRecheck) // the first answer, then one per recheck at most
	for _, tc := range []struct {
		name     string
		services int
		churn    bool // a new version of every Service at every check
	}{
		{name: "one Service updated at every check", services: 1, churn: true},
		{name: "200 Services of one tenant updated at every check", services: 200, churn: true},
		{name: "50 Services that never change are asked once each", services: 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lists := map[string]int{}
			warned := map[string]bool{}
			a := newSliceAudit("node-1", func(_ context.Context, _, name string) (int, error) {
				lists[name]++
				return 1, nil
			}, func(s *corev1.Service, _ int) { warned[s.Name] = true })
			t0 := time.Unix(1_000_000, 0)
			maxPerCheck, total := 0, 0
			for i := range checks {
				held := make([]*corev1.Service, tc.services)
				for j := range held {
					rv := "1"
					if tc.churn {
						rv = strconv.Itoa(i + 1)
					}
					held[j] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: fmt.Sprintf("svc-%d", j), ResourceVersion: rv},
						Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
				}
				before := total
				a.check(context.Background(), t0.Add(time.Duration(i)*sliceAuditEvery), held, func(string, string) bool { return false })
				total = 0
				for _, n := range lists {
					total += n
				}
				maxPerCheck = max(maxPerCheck, total-before)
			}
			if maxPerCheck > sliceAuditBudget {
				t.Errorf("%d LISTs in one check, want at most %d", maxPerCheck, sliceAuditBudget)
			}
			for name, n := range lists {
				if n > perService || !tc.churn && n != 1 {
					t.Errorf("%s listed %d times in %v, want at most %d (once if it never changes)", name, n, hour, perService)
				}
			}
			if len(lists) != tc.services || len(warned) != tc.services {
				t.Errorf("%d of %d Services asked about, %d warned about; want all", len(lists), tc.services, len(warned))
			}
			t.Logf("%d Services, %d checks: %d LISTs, at most %d in one check", tc.services, checks, total, maxPerCheck)
		})
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
	w, err := NewWatches(testutil.NewClientset(), "node-1", []string{"a in (x)", "b in (x)"}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj := func(name, rv, label string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: rv,
			Labels: map[string]string{"a": label}}}
	}
	for i, svcs := range [][]*corev1.Service{{obj("db", "9", "new")}, {obj("db", "7", "old"), obj("web", "3", "x")}} {
		for _, s := range svcs {
			if err := w.scoped[i].services.GetStore().Add(s); err != nil {
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
	all, err := NewWatches(testutil.NewClientset(), "node-1", []string{""}, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !w.Scoped() || all.Scoped() {
		t.Errorf("Scoped: %v for two selectors, %v for everything", w.Scoped(), all.Scoped())
	}
}
