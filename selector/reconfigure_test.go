package selector

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// reconfigureFixture starts from testRouter's three instances, each serving one Service
// with one slice, every sink programming on demand.
func reconfigureFixture(t *testing.T) (*dispatchFixture, []*corev1.Service) {
	t.Helper()
	f := newDispatchFixture(t, false)
	svcs := []*corev1.Service{service("x", "plain", ""), service("a1", "web", "team-a"), service("b", "db", "team-b")}
	for _, svc := range svcs {
		f.slices[svc.Namespace+"/"+svc.Name] = []*discoveryv1.EndpointSlice{slice(svc.Namespace, svc.Name+"-1", svc.Name)}
		f.d.ServiceChanged(svc)
	}
	f.take()
	return f, svcs
}

func (f *dispatchFixture) newSink(name string) *recorder {
	return &recorder{name: name, log: &f.log, logMu: &f.logMu, programs: map[types.NamespacedName][]chan struct{}{}}
}

func routerOf(t *testing.T, specs ...Spec) *Router {
	t.Helper()
	r, err := NewRouter(specs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReconfigureAddsRemovesAndReplaces: a live configuration change hands Services over
// as a relabel does (the new owner gets the Service and its slices, the old one lets go
// once it is programmed), leaves the instances it does not change untouched, and gives
// a replaced instance everything again.
func TestReconfigureAddsRemovesAndReplaces(t *testing.T) {
	web := types.NamespacedName{Namespace: "a1", Name: "web"}
	db := types.NamespacedName{Namespace: "b", Name: "db"}
	plain := types.NamespacedName{Namespace: "x", Name: "plain"}
	t.Run("removed instance lets go", func(t *testing.T) {
		f, svcs := reconfigureFixture(t)
		sinks := map[string]Sink{"default": f.sinks["default"], "team-b": f.sinks["team-b"]}
		f.d.Reconfigure(routerOf(t, Spec{Name: "default", Default: true}, Spec{Name: "team-b", ProxyNames: []string{"team-b"}}), sinks, nil, []string{"team-a"}, svcs)
		// No local instance serves web's label any more (the default instance serves
		// unlabeled Services only): team-a lets go at once; the instances the change
		// does not concern are given nothing.
		if got, want := f.take(), []string{"team-a: delete service a1/web"}; !sameItems(got, want) {
			t.Fatalf("re-dispatch: %q, want %q", got, want)
		}
		if f.d.Holds("team-a") != 0 || !f.d.Forget("team-a") {
			t.Fatalf("team-a holds %d after letting go", f.d.Holds("team-a"))
		}
		if f.d.Owner(web) != "" || f.d.Owner(db) != "team-b" || f.d.Owner(plain) != "default" {
			t.Errorf("owners: web %q db %q plain %q", f.d.Owner(web), f.d.Owner(db), f.d.Owner(plain))
		}
		f.d.SliceChanged(slice("a1", "web-1", "web"))
		if got := f.take(); len(got) != 0 {
			t.Errorf("a slice of a Service nothing here serves went to %q", got)
		}
	})
	t.Run("proxy name moves to an added instance", func(t *testing.T) {
		f, svcs := reconfigureFixture(t)
		teamC := f.newSink("team-c")
		router := routerOf(t, Spec{Name: "default", Default: true}, Spec{Name: "team-a", ProxyNames: []string{"team-a"}},
			Spec{Name: "team-b", ProxyNames: []string{"team-b-old"}}, Spec{Name: "team-c", ProxyNames: []string{"team-b"}})
		f.d.Reconfigure(router, map[string]Sink{"default": f.sinks["default"], "team-a": f.sinks["team-a"], "team-b": f.sinks["team-b"], "team-c": teamC}, nil, []string{"team-b", "team-c"}, svcs)
		got := f.take()
		if !slices.Contains(got, "team-c: slice b/db-1") || !slices.Contains(got, "team-c: service b/db") || slices.Contains(got, "team-b: delete service b/db") {
			t.Fatalf("team-c takes db, team-b keeps it until then: %q", got)
		}
		if f.d.Holds("team-b") != 1 {
			t.Fatalf("team-b holds %d while its Service is being handed over", f.d.Holds("team-b"))
		}
		teamC.program(db)
		waitFor(t, f, "team-b: delete service b/db")
		waitHolds(t, f.d, "team-b", 0)
		if f.d.Owner(db) != "team-c" {
			t.Errorf("db's owner is %q", f.d.Owner(db))
		}
	})
	t.Run("replaced instance is given everything again", func(t *testing.T) {
		f, svcs := reconfigureFixture(t)
		fresh := f.newSink("team-a")
		f.d.Reconfigure(testRouter(t), map[string]Sink{"default": f.sinks["default"], "team-a": fresh, "team-b": f.sinks["team-b"]}, []string{"team-a"}, []string{"team-a"}, svcs)
		got := f.take()
		if !slices.Contains(got, "team-a: slice a1/web-1") || !slices.Contains(got, "team-a: service a1/web") {
			t.Fatalf("the replaced instance got: %q", got)
		}
		if slices.ContainsFunc(got, func(s string) bool {
			return slices.Contains([]string{"team-a: delete service a1/web", "default: service a1/web"}, s)
		}) {
			t.Fatalf("a replacement is no handover: %q", got)
		}
		if owner, programmed := f.d.OwnerProgrammed(web); owner != "team-a" || programmed {
			t.Errorf("owner %q programmed %v before the new instance synced", owner, programmed)
		}
		fresh.program(web)
		waitProgrammed(t, f.d, web)
	})
}

func sameItems(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func waitHolds(t *testing.T, d *Dispatcher, inst string, want int) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, fmt.Sprintf("%s to hold %d Services", inst, want), func() bool { return d.Holds(inst) == want })
}

func waitProgrammed(t *testing.T, d *Dispatcher, name types.NamespacedName) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, name.String()+" programmed by its owner", func() bool { _, p := d.OwnerProgrammed(name); return p })
}

// TestReconfigureRacesEvents: slice and Service events while the routing changes reach
// the instances without a data race (run under -race).
func TestReconfigureRacesEvents(t *testing.T) {
	f, svcs := reconfigureFixture(t)
	for _, r := range f.sinks {
		r.auto = true
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			f.d.SliceChanged(slice("a1", "web-1", "web"))
			if i%10 == 0 {
				f.d.ServiceChanged(svcs[1])
			}
		}
	})
	for i := range 20 {
		sinks := map[string]Sink{"default": f.sinks["default"], "team-a": f.sinks["team-a"], "team-b": f.sinks["team-b"]}
		var replaced []string
		if i%2 == 0 {
			fresh := f.newSink("team-a")
			fresh.auto = true
			sinks["team-a"], replaced = fresh, []string{"team-a"}
		}
		f.d.Reconfigure(testRouter(t), sinks, replaced, replaced, svcs)
	}
	wg.Wait()
	if got := f.d.Owner(types.NamespacedName{Namespace: "a1", Name: "web"}); got != "team-a" {
		t.Errorf("owner %q", got)
	}
}
