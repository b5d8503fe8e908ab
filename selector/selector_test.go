package selector

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/testutil"
)

func testRouter(t *testing.T) *Router {
	t.Helper()
	r, err := NewRouter([]Spec{
		{Name: "default", Default: true},
		{Name: "team-a", ProxyNames: []string{"team-a", "a-legacy"}, Namespaces: []string{"a1", "a2"}},
		{Name: "team-b", ProxyNames: []string{"team-b"}, ExternalIPCIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
			LoadBalancerCIDRs: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func service(ns, name, proxyName string) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if proxyName != "" {
		svc.Labels = map[string]string{LabelServiceProxyName: proxyName}
	}
	return svc
}

func TestRoute(t *testing.T) {
	r := testRouter(t)
	cases := []struct {
		name           string
		svc            *corev1.Service
		want           string
		wantRejected   string
		wantRejectedBy []string
	}{
		{"unlabeled goes to the default instance", service("x", "s", ""), "default", "", nil},
		{"labeled goes to the instance with that proxy name", service("a1", "s", "team-a"), "team-a", "", nil},
		{"an instance may serve several proxy names", service("a2", "s", "a-legacy"), "team-a", "", nil},
		{"an unknown proxy name belongs to no local instance", service("x", "s", "someone-else"), "", "", nil},
		{"tenant guard refuses other namespaces", service("x", "s", "team-a"), "", `does not accept Services from namespace "x"`, []string{"team-a"}},
		{"no namespace guard means any namespace", service("anything", "s", "team-b"), "team-b", "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := r.Route(tc.svc)
			if got.Instance != tc.want {
				t.Errorf("instance: got %q, want %q", got.Instance, tc.want)
			}
			if (tc.wantRejected == "") != (got.Rejected == "") || !strings.Contains(got.Rejected, tc.wantRejected) {
				t.Errorf("rejected: got %q, want %q", got.Rejected, tc.wantRejected)
			}
			if !slices.Equal(got.RejectedBy, tc.wantRejectedBy) {
				t.Errorf("rejected by: got %q, want %q", got.RejectedBy, tc.wantRejectedBy)
			}
		})
	}
}

// TestRouteShadow: the annotation adds a shadow beside the label's owner; naming the
// label's own proxy makes the owner step back to a shadow; naming another proxy name of the
// owner's instance changes nothing.
func TestRouteShadow(t *testing.T) {
	r := testRouter(t)
	cases := []struct {
		name                string
		svc                 *corev1.Service
		wantOwner, wantShad string
	}{
		{"shadow beside a local owner", shadowed(service("a1", "s", "team-b"), "team-a"), "team-b", "team-a"},
		{"shadow of a Service no local instance owns", shadowed(service("a1", "s", "legacy"), "team-a"), "", "team-a"},
		{"shadow of an unlabeled Service beside the default instance", shadowed(service("a1", "s", ""), "team-a"), "default", "team-a"},
		{"the label's own proxy: the owner steps back", shadowed(service("a1", "s", "team-a"), "team-a"), "", "team-a"},
		{"another proxy name of the owner's instance: no shadow", shadowed(service("a1", "s", "a-legacy"), "team-a"), "team-a", ""},
		{"an unknown proxy name: no shadow", shadowed(service("a1", "s", "team-a"), "nobody"), "team-a", ""},
		{"stepping back is refused with the Service", shadowed(service("x", "s", "team-a"), "team-a"), "", ""},
		{"the shadow label alone", shadowLabel(service("a1", "s", "legacy"), "team-a"), "", "team-a"},
		{"the label wins over the annotation", shadowLabel(shadowed(service("a1", "s", "legacy"), "team-b"), "team-a"), "", "team-a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := r.Route(tc.svc)
			if got.Instance != tc.wantOwner || got.Shadow != tc.wantShad {
				t.Errorf("got owner %q shadow %q, want %q and %q", got.Instance, got.Shadow, tc.wantOwner, tc.wantShad)
			}
		})
	}
}

func TestNoDefaultInstance(t *testing.T) {
	r, err := NewRouter([]Spec{{Name: "team-a", ProxyNames: []string{"team-a"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Route(service("x", "s", "")); got.Instance != "" {
		t.Errorf("unlabeled Service without a default instance: got %q", got.Instance)
	}
}

func TestNewRouterRejectsAmbiguity(t *testing.T) {
	_, err := NewRouter([]Spec{
		{Name: "a", Default: true, ProxyNames: []string{"p"}},
		{Name: "b", Default: true, ProxyNames: []string{"p"}},
		{Name: "a"},
	})
	for _, want := range []string{`"a" and "b" are both the default`, `proxy name "p" is served by both "a" and "b"`, `instance "a" is defined twice`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
}

// TestGuardKeepsOnlyAddressesInsideTheTenantRanges: externalIPs and load-balancer IPs
// pass only inside the instance's ranges; an empty list admits none (closed by default).
func TestGuardKeepsOnlyAddressesInsideTheTenantRanges(t *testing.T) {
	r := testRouter(t)
	withAddrs := func(ext []string, lb ...string) *corev1.Service {
		svc := service("x", "s", "team-b")
		svc.Spec.ExternalIPs = ext
		for _, ip := range lb {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		return svc
	}
	for _, tc := range []struct {
		name     string
		instance string
		svc      *corev1.Service
		wantExt  []string
		wantLB   []string
		problems int
	}{
		{"inside and outside the externalIP ranges", "team-b", withAddrs([]string{"192.0.2.10", "198.51.100.1", "not-an-ip"}), []string{"192.0.2.10"}, nil, 2},
		{"no externalIP ranges: none pass", "default", withAddrs([]string{"192.0.2.10"}), nil, nil, 1},
		{"load-balancer IPs inside and outside", "team-b", withAddrs(nil, "203.0.113.7", "198.51.100.9"), nil, []string{"203.0.113.7"}, 1},
		{"no load-balancer ranges: none pass", "default", withAddrs(nil, "203.0.113.7"), nil, nil, 1},
		{"nothing user-set: kept as is", "default", withAddrs(nil), nil, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.svc.DeepCopy()
			got, problems := r.Guard(tc.instance, tc.svc)
			var lb []string
			for _, in := range got.Status.LoadBalancer.Ingress {
				lb = append(lb, in.IP)
			}
			if !slices.Equal(got.Spec.ExternalIPs, tc.wantExt) || !slices.Equal(lb, tc.wantLB) {
				t.Errorf("kept externalIPs %v, LB IPs %v; want %v, %v", got.Spec.ExternalIPs, lb, tc.wantExt, tc.wantLB)
			}
			if len(problems) != tc.problems {
				t.Errorf("want %d problems, got %q", tc.problems, problems)
			}
			if !equality.Semantic.DeepEqual(before, tc.svc) {
				t.Error("Guard must not modify the informer's object")
			}
			if tc.problems == 0 && got != tc.svc {
				t.Error("a Service with nothing to drop must be passed on as it is")
			}
		})
	}
}

// recorder is a Sink that logs what it receives and "programs" on demand.
type recorder struct {
	mu    sync.Mutex
	name  string
	log   *[]string
	logMu *sync.Mutex
	// programs are the channels handed out per Service not yet programmed.
	programs map[types.NamespacedName][]chan struct{}
	auto     bool
}

func (r *recorder) add(s string) {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	*r.log = append(*r.log, r.name+": "+s)
}

func (r *recorder) UpdateService(svc *corev1.Service) <-chan struct{} {
	r.add("service " + svc.Namespace + "/" + svc.Name)
	ch := make(chan struct{})
	if r.auto {
		close(ch)
		return ch
	}
	r.mu.Lock()
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	r.programs[name] = append(r.programs[name], ch)
	r.mu.Unlock()
	return ch
}

// program "syncs" a Service: as an instance's sync, it programs every version handed
// over before it.
func (r *recorder) program(name types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range r.programs[name] {
		close(ch)
	}
	delete(r.programs, name)
}

func (r *recorder) DeleteService(name types.NamespacedName) { r.add("delete service " + name.String()) }
func (r *recorder) UpdateEndpointSlice(s *discoveryv1.EndpointSlice) {
	r.add("slice " + s.Namespace + "/" + s.Name)
}
func (r *recorder) DeleteEndpointSlice(s *discoveryv1.EndpointSlice) {
	r.add("delete slice " + s.Namespace + "/" + s.Name)
}

type dispatchFixture struct {
	d      *Dispatcher
	sinks  map[string]*recorder
	log    []string
	logMu  sync.Mutex
	slices map[string][]*discoveryv1.EndpointSlice
	hand   []string
}

func newDispatchFixture(t *testing.T, auto bool) *dispatchFixture {
	f := &dispatchFixture{sinks: map[string]*recorder{}, slices: map[string][]*discoveryv1.EndpointSlice{}}
	sinks := map[string]Sink{}
	for _, n := range []string{"default", "team-a", "team-b"} {
		rec := &recorder{name: n, log: &f.log, logMu: &f.logMu, programs: map[types.NamespacedName][]chan struct{}{}, auto: auto}
		f.sinks[n] = rec
		sinks[n] = rec
	}
	f.d = NewDispatcher(testRouter(t), sinks, func(ns, svc string) []*discoveryv1.EndpointSlice {
		return f.slices[ns+"/"+svc]
	}, Events{Handover: func(svc types.NamespacedName, from, to string) {
		f.hand = append(f.hand, fmt.Sprintf("%s %q->%q", svc, from, to))
	}})
	return f
}

func (f *dispatchFixture) take() []string {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	out := f.log
	f.log = nil
	return out
}

func slice(ns, name, svc string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
}

func waitFor(t *testing.T, f *dispatchFixture, want string) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var all []string
	for time.Now().Before(deadline) {
		all = append(all, f.take()...)
		if slices.Contains(all, want) {
			return all
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("never saw %q; saw %q", want, all)
	return nil
}

func TestDispatchHandover(t *testing.T) {
	f := newDispatchFixture(t, false)
	name := types.NamespacedName{Namespace: "a1", Name: "web"}
	f.slices["a1/web"] = []*discoveryv1.EndpointSlice{slice("a1", "web-1", "web"), slice("a1", "web-2", "web")}

	f.d.ServiceChanged(service("a1", "web", ""))
	f.d.SliceChanged(slice("a1", "web-1", "web"))
	if got := f.take(); !slices.Equal(got, []string{"default: slice a1/web-1", "default: slice a1/web-2", "default: service a1/web", "default: slice a1/web-1"}) {
		t.Fatalf("unlabeled Service: %q", got)
	}

	// Relabel to team-a: team-a gets the Service and its current slices at once (the
	// slices first, so the sync that answers for the Service has them); the default
	// instance lets go only once team-a has programmed it.
	f.d.ServiceChanged(service("a1", "web", "team-a"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: slice a1/web-1", "team-a: slice a1/web-2", "team-a: service a1/web"}) {
		t.Fatalf("after relabel: %q", got)
	}
	if f.d.Owner(name) != "team-a" {
		t.Fatalf("owner is %q", f.d.Owner(name))
	}
	f.d.SliceChanged(slice("a1", "web-3", "web"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: slice a1/web-3"}) {
		t.Fatalf("slices follow the Service at once: %q", got)
	}
	f.sinks["team-a"].program(name)
	waitFor(t, f, "default: delete service a1/web")

	// And back to unlabeled.
	f.d.ServiceChanged(service("a1", "web", ""))
	f.sinks["default"].program(name)
	waitFor(t, f, "team-a: delete service a1/web")
	if want := []string{`a1/web ""->"default"`, `a1/web "default"->"team-a"`, `a1/web "team-a"->"default"`}; !slices.Equal(f.hand, want) {
		t.Errorf("handovers: %q", f.hand)
	}
}

// TestDispatchHandoverBackBeforeProgrammedKeepsService: a Service relabeled away and
// back before the new owner programmed it stays with the old owner when the first
// handover times out; the instance it went to in between lets go of it.
//
// It runs in a synctest bubble: the handover timers run on the bubble's clock, and
// synctest.Wait returns only once both release goroutines have finished, so the absence
// of a delete is observed after the code that would have made it ran, not after a guess.
func TestDispatchHandoverBackBeforeProgrammedKeepsService(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newDispatchFixture(t, false)
		f.d.HandoverTimeout = 50 * time.Millisecond
		f.d.ServiceChanged(service("a1", "web", ""))
		f.d.ServiceChanged(service("a1", "web", "team-a"))
		f.d.ServiceChanged(service("a1", "web", ""))
		time.Sleep(f.d.HandoverTimeout) // both handovers time out: nobody programs
		synctest.Wait()
		got := f.take()
		if slices.Contains(got, "default: delete service a1/web") {
			t.Errorf("the default instance dropped a Service it owns again: %q", got)
		}
		if !slices.Contains(got, "team-a: delete service a1/web") {
			t.Errorf("team-a kept a Service handed back from it after the timeout: %q", got)
		}
	})
}

func TestDispatchIgnoresUnownedObjects(t *testing.T) {
	f := newDispatchFixture(t, true)
	f.d.ServiceChanged(service("x", "elsewhere", "another-proxy"))
	f.d.SliceChanged(slice("x", "elsewhere-1", "elsewhere"))
	f.d.SliceChanged(slice("x", "orphan-1", "no-such-service"))
	f.d.ServiceDeleted(service("x", "elsewhere", "another-proxy"))
	if got := f.take(); len(got) != 0 {
		t.Errorf("objects no local instance owns reached an instance: %q", got)
	}
	// Relabeling such a Service to a local instance picks it up with its slices.
	f.slices["x/elsewhere"] = []*discoveryv1.EndpointSlice{slice("x", "elsewhere-1", "elsewhere")}
	f.d.ServiceChanged(service("x", "elsewhere", "team-b"))
	if got := f.take(); !slices.Equal(got, []string{"team-b: slice x/elsewhere-1", "team-b: service x/elsewhere"}) {
		t.Errorf("got %q", got)
	}
	// Relabeling it away again removes it from team-b.
	f.d.ServiceChanged(service("x", "elsewhere", "another-proxy"))
	if got := f.take(); !slices.Equal(got, []string{"team-b: delete service x/elsewhere"}) {
		t.Errorf("got %q", got)
	}
}

func TestDispatchTenantGuardRejectsNamespace(t *testing.T) {
	f := newDispatchFixture(t, true)
	var rejected []string
	f.d.events.Rejected = func(svc *corev1.Service, why string) { rejected = append(rejected, why) }
	f.d.ServiceChanged(service("intruder", "web", "team-a"))
	if got := f.take(); len(got) != 0 {
		t.Errorf("team-a got a Service from a namespace it does not accept: %q", got)
	}
	if len(rejected) != 1 {
		t.Errorf("want one rejection event, got %q", rejected)
	}
}

// shadowLabel marks svc with the shadow label (what migrate sets with the annotation).
func shadowLabel(svc *corev1.Service, proxyName string) *corev1.Service {
	if svc.Labels == nil {
		svc.Labels = map[string]string{}
	}
	svc.Labels[LabelShadow] = proxyName
	return svc
}

func shadowed(svc *corev1.Service, proxyName string) *corev1.Service {
	svc.Annotations = map[string]string{AnnotationShadow: proxyName}
	return svc
}

// TestDispatchShadowMigration walks a Service through a migration from a proxy that is
// not local (a legacy kube-proxy) to team-a and back: the shadow programs it before the
// label moves, nothing is deleted while it moves, and the node status learns when the
// shadow is programmed.
func TestDispatchShadowMigration(t *testing.T) {
	f := newDispatchFixture(t, false)
	name := types.NamespacedName{Namespace: "a1", Name: "web"}
	f.slices["a1/web"] = []*discoveryv1.EndpointSlice{slice("a1", "web-1", "web")}

	f.d.ServiceChanged(service("a1", "web", "legacy"))
	if got := f.take(); len(got) != 0 {
		t.Fatalf("a Service of a proxy that is not local went to %q", got)
	}
	// Shadow: team-a programs it while the label still names the legacy proxy.
	f.d.ServiceChanged(shadowed(service("a1", "web", "legacy"), "team-a"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: slice a1/web-1", "team-a: service a1/web"}) {
		t.Fatalf("shadow: %q", got)
	}
	if f.d.Owner(name) != "" {
		t.Errorf("a shadow is not the owner; got %q", f.d.Owner(name))
	}
	if got := f.d.Shadows(); len(got) != 0 {
		t.Errorf("reported as programmed before the sync: %v", got)
	}
	f.sinks["team-a"].program(name)
	testutil.Eventually(t, 5*time.Second, "the shadow to be reported programmed", func() bool {
		return slices.Equal(f.d.Shadows()["team-a"], []types.NamespacedName{name})
	})
	f.d.SliceChanged(slice("a1", "web-2", "web"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: slice a1/web-2"}) {
		t.Fatalf("slices reach the shadow: %q", got)
	}

	// The label moves to team-a, then the annotation goes: team-a keeps it throughout.
	f.d.ServiceChanged(shadowed(service("a1", "web", "team-a"), "team-a"))
	f.d.ServiceChanged(service("a1", "web", "team-a"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: service a1/web", "team-a: service a1/web"}) {
		t.Fatalf("moving the label to the shadow: %q", got)
	}
	if len(f.d.Shadows()) != 0 {
		t.Errorf("still reported as a shadow: %v", f.d.Shadows())
	}

	// Rollback: team-a steps back to a shadow while the label still names it (it keeps
	// the Service, no longer owns it, and the node status says so), the label goes back
	// to the legacy proxy; then the shadow is dropped, and only then does team-a let go.
	f.d.ServiceChanged(shadowed(service("a1", "web", "team-a"), "team-a"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: service a1/web"}) {
		t.Fatalf("stepping back keeps the Service on team-a: %q", got)
	}
	if f.d.Owner(name) != "" {
		t.Errorf("team-a stepped back but still owns the Service")
	}
	f.sinks["team-a"].program(name)
	testutil.Eventually(t, 5*time.Second, "the stepped-back owner to be reported as a shadow", func() bool {
		return slices.Equal(f.d.Shadows()["team-a"], []types.NamespacedName{name})
	})
	f.d.ServiceChanged(shadowed(service("a1", "web", "legacy"), "team-a"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: service a1/web"}) {
		t.Fatalf("rollback keeps the Service on team-a as a shadow: %q", got)
	}
	if !slices.Equal(f.d.Shadows()["team-a"], []types.NamespacedName{name}) {
		t.Errorf("handing the label back dropped the shadow from the node status: %v", f.d.Shadows())
	}
	f.d.ServiceChanged(service("a1", "web", "legacy"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: delete service a1/web"}) {
		t.Fatalf("dropping the shadow: %q", got)
	}
	f.d.SliceChanged(slice("a1", "web-3", "web"))
	if got := f.take(); len(got) != 0 {
		t.Fatalf("slices of a Service no local instance owns went to %q", got)
	}
}

// TestDispatchShadowBesideLocalOwner: a Service owned by one local instance and shadowed
// by another is programmed by both; slices reach both; deleting it deletes it from both.
func TestDispatchShadowBesideLocalOwner(t *testing.T) {
	f := newDispatchFixture(t, true)
	f.d.ServiceChanged(shadowed(service("a1", "web", "team-b"), "team-a"))
	f.d.SliceChanged(slice("a1", "web-1", "web"))
	f.d.ServiceDeleted(service("a1", "web", "team-b"))
	got := f.take()
	slices.Sort(got)
	want := []string{"team-a: delete service a1/web", "team-a: service a1/web", "team-a: slice a1/web-1",
		"team-b: delete service a1/web", "team-b: service a1/web", "team-b: slice a1/web-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// syncingSink is a Sink that "syncs" the moment it is given a Service, as a real instance
// may between two calls: its programmed channel closes with what it had at that moment.
type syncingSink struct {
	recorder
	slicesOf   map[types.NamespacedName]int
	atProgram  map[types.NamespacedName]int
	programsMu sync.Mutex
}

func (s *syncingSink) UpdateService(svc *corev1.Service) <-chan struct{} {
	s.programsMu.Lock()
	defer s.programsMu.Unlock()
	n := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	s.atProgram[n] = s.slicesOf[n]
	ch := make(chan struct{})
	close(ch)
	return ch
}

func (s *syncingSink) UpdateEndpointSlice(sl *discoveryv1.EndpointSlice) {
	s.programsMu.Lock()
	defer s.programsMu.Unlock()
	s.slicesOf[types.NamespacedName{Namespace: sl.Namespace, Name: sl.Labels[discoveryv1.LabelServiceName]}]++
}

// TestDispatchProgrammedIncludesEndpoints: when an instance takes a Service over (a
// shadow for a migration, a relabel), "programmed" must cover its endpoints: the status
// that lets a migration move the label, and the release of the old owner, rely on it.
func TestDispatchProgrammedIncludesEndpoints(t *testing.T) {
	var log []string
	var logMu sync.Mutex
	sinks := map[string]Sink{}
	syncing := map[string]*syncingSink{}
	for _, n := range []string{"default", "team-a", "team-b"} {
		s := &syncingSink{recorder: recorder{name: n, log: &log, logMu: &logMu, programs: map[types.NamespacedName][]chan struct{}{}},
			slicesOf: map[types.NamespacedName]int{}, atProgram: map[types.NamespacedName]int{}}
		sinks[n], syncing[n] = s, s
	}
	web := types.NamespacedName{Namespace: "a1", Name: "web"}
	d := NewDispatcher(testRouter(t), sinks, func(ns, svc string) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{slice("a1", "web-1", "web"), slice("a1", "web-2", "web")}
	}, Events{})

	d.ServiceChanged(shadowed(service("a1", "web", "legacy"), "team-a"))
	if got := syncing["team-a"].atProgram[web]; got != 2 {
		t.Errorf("the shadow was programmed with %d of its 2 EndpointSlices", got)
	}
	testutil.Eventually(t, 5*time.Second, "the shadow to be reported", func() bool { return len(d.Shadows()["team-a"]) == 1 })
	d.ServiceChanged(service("a1", "web", "team-b"))
	if got := syncing["team-b"].atProgram[web]; got != 2 {
		t.Errorf("the new owner was programmed with %d of its 2 EndpointSlices", got)
	}
}

// sliceState is a Sink that keeps what an instance would hold of each EndpointSlice: its
// resource version, by name.
type sliceState struct {
	mu     sync.Mutex
	slices map[string]string
}

func (s *sliceState) UpdateService(*corev1.Service) <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}
func (s *sliceState) DeleteService(types.NamespacedName) {}
func (s *sliceState) UpdateEndpointSlice(sl *discoveryv1.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slices[sl.Name] = sl.ResourceVersion
}
func (s *sliceState) DeleteEndpointSlice(sl *discoveryv1.EndpointSlice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.slices, sl.Name)
}

// TestDispatchHandoverSliceEventDuringSnapshot: a slice event that the watch delivers
// while the dispatcher hands a relabeled Service's slice snapshot to the new owner (after
// the snapshot was listed, before it was pushed) must win over the snapshot: a deleted
// slice must not stay with the new owner, an update must not be overwritten by the older
// version. The lister is the seam: it returns the snapshot, then plays the watch event,
// as the informer's goroutine may at that moment.
func TestDispatchHandoverSliceEventDuringSnapshot(t *testing.T) {
	v := func(name, rv string) *discoveryv1.EndpointSlice {
		sl := slice("a1", name, "web")
		sl.ResourceVersion = rv
		return sl
	}
	for _, tc := range []struct {
		name  string
		event func(d *Dispatcher)
		want  map[string]string
	}{
		{"deleted", func(d *Dispatcher) { d.SliceDeleted(v("web-1", "1")) }, map[string]string{"web-2": "1"}},
		{"updated", func(d *Dispatcher) { d.SliceChanged(v("web-1", "2")) }, map[string]string{"web-1": "2", "web-2": "1"}},
		{"added", func(d *Dispatcher) { d.SliceChanged(v("web-3", "1")) }, map[string]string{"web-1": "1", "web-2": "1", "web-3": "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sinks := map[string]Sink{}
			states := map[string]*sliceState{}
			for _, n := range []string{"default", "team-a", "team-b"} {
				states[n] = &sliceState{slices: map[string]string{}}
				sinks[n] = states[n]
			}
			var d *Dispatcher
			relabeled := false
			d = NewDispatcher(testRouter(t), sinks, func(ns, svc string) []*discoveryv1.EndpointSlice {
				snapshot := []*discoveryv1.EndpointSlice{v("web-1", "1"), v("web-2", "1")}
				if relabeled {
					tc.event(d)
				}
				return snapshot
			}, Events{})
			d.ServiceChanged(service("a1", "web", ""))
			relabeled = true
			d.ServiceChanged(service("a1", "web", "team-a"))
			if got := states["team-a"].slices; !maps.Equal(got, tc.want) {
				t.Errorf("the new owner holds %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDispatchGoroutinesBoundedWhileInstancesCannotSync: while the instances never
// program anything (they cannot sync), every update of a Service in shadow and with a
// new owner must not leave one more goroutine waiting for its programming: one per
// Service and role is enough.
func TestDispatchGoroutinesBoundedWhileInstancesCannotSync(t *testing.T) {
	f := newDispatchFixture(t, false)
	before := runtime.NumGoroutine()
	for i := range 500 {
		svc := shadowed(service("a1", "web", "team-b"), "team-a")
		svc.ResourceVersion = fmt.Sprint(i + 1)
		f.d.ServiceChanged(svc)
	}
	if grew := runtime.NumGoroutine() - before; grew > 5 {
		t.Errorf("500 updates of one Service left %d more goroutines", grew)
	}
	owner, programmed := f.d.OwnerProgrammed(types.NamespacedName{Namespace: "a1", Name: "web"})
	if owner != "team-b" || programmed {
		t.Errorf("OwnerProgrammed = %q, %v before any sync", owner, programmed)
	}
	f.sinks["team-b"].program(types.NamespacedName{Namespace: "a1", Name: "web"})
	testutil.Eventually(t, 5*time.Second, "the owner to be programmed", func() bool {
		_, programmed := f.d.OwnerProgrammed(types.NamespacedName{Namespace: "a1", Name: "web"})
		return programmed
	})
}

// TestDispatchShadowWaitsForSlices: on a node that watches only labelled objects, a
// shadowed Service arrives before its EndpointSlices (the EndpointSlice controller copies
// the shadow label to them after). The shadow's first sync has no endpoints and rejects,
// so it must not be reported programmed (a migration would move the label onto it: ~200 ms
// of refused connections on the real node); the sync after the first slice is.
//
// It runs in a synctest bubble: synctest.Wait returns once every goroutine of the test
// is idle, so "not reported programmed" is read after anything the sync could start.
func TestDispatchShadowWaitsForSlices(t *testing.T) {
	synctest.Test(t, testDispatchShadowWaitsForSlices)
}

func testDispatchShadowWaitsForSlices(t *testing.T) {
	f := newDispatchFixture(t, false)
	name := types.NamespacedName{Namespace: "a1", Name: "web"}
	withSelector := func(svc *corev1.Service) *corev1.Service {
		svc.Spec.Selector = map[string]string{"app": "web"}
		return svc
	}
	f.d.ServiceChanged(shadowed(withSelector(service("a1", "web", "legacy")), "team-a"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: service a1/web"}) {
		t.Fatalf("shadow without slices: %q", got)
	}
	f.sinks["team-a"].program(name)
	synctest.Wait() // the goroutine that waits for the sync has run
	if got := f.d.Shadows(); len(got) != 0 {
		t.Fatalf("reported programmed by a sync without the Service's slices: %v", got)
	}
	f.slices["a1/web"] = []*discoveryv1.EndpointSlice{slice("a1", "web-1", "web")}
	f.d.SliceChanged(slice("a1", "web-1", "web"))
	if got := f.take(); !slices.Equal(got, []string{"team-a: slice a1/web-1", "team-a: service a1/web"}) {
		t.Fatalf("the first slice, then the Service again for a sync that has it: %q", got)
	}
	f.sinks["team-a"].program(name)
	testutil.Eventually(t, 5*time.Second, "the shadow to be reported programmed", func() bool {
		return slices.Equal(f.d.Shadows()["team-a"], []types.NamespacedName{name})
	})

	// A Service whose slices are known when it is shadowed counts at its first sync.
	other := types.NamespacedName{Namespace: "a1", Name: "api"}
	f.slices["a1/api"] = []*discoveryv1.EndpointSlice{slice("a1", "api-1", "api")}
	f.d.ServiceChanged(shadowed(withSelector(service("a1", "api", "legacy")), "team-a"))
	f.sinks["team-a"].program(other)
	testutil.Eventually(t, 5*time.Second, "the shadow with slices to be reported programmed", func() bool {
		return slices.Contains(f.d.Shadows()["team-a"], other)
	})
}

// TestDispatchNoGoroutinePerShadow: a shadow whose instance never syncs (it cannot, or
// the shadow goes away first) must not leave a goroutine waiting for its programming:
// one per shadowed Service waited forever. Each still counts as programmed after the
// sync, and a shadow dropped before it never does.
func TestDispatchNoGoroutinePerShadow(t *testing.T) {
	f := newDispatchFixture(t, false)
	before := runtime.NumGoroutine()
	const n = 1000
	name := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "a1", Name: fmt.Sprintf("web-%d", i)}
	}
	for i := range 2 * n {
		f.d.ServiceChanged(shadowed(service("a1", name(i).Name, "legacy"), "team-a"))
	}
	if grew := runtime.NumGoroutine() - before; grew > 5 {
		t.Errorf("%d shadows waiting for their instance's first sync left %d more goroutines", 2*n, grew)
	}
	// The second half stops being shadowed before team-a ever synced it.
	for i := n; i < 2*n; i++ {
		f.d.ServiceChanged(service("a1", name(i).Name, "legacy"))
	}
	if grew := runtime.NumGoroutine() - before; grew > 5 {
		t.Errorf("%d shadows gone before their instance's first sync left %d more goroutines", n, grew)
	}
	if got := f.d.Shadows(); len(got) != 0 {
		t.Fatalf("reported programmed before any sync: %d", len(got["team-a"]))
	}
	for i := range 2 * n {
		f.sinks["team-a"].program(name(i))
	}
	got := f.d.Shadows()["team-a"]
	if len(got) != n {
		t.Fatalf("%d shadows reported programmed after the sync, want %d", len(got), n)
	}
	for _, nn := range got {
		var i int
		if _, err := fmt.Sscanf(nn.Name, "web-%d", &i); err != nil || i >= n {
			t.Errorf("%s is reported programmed in shadow, but it stopped being a shadow before the sync", nn)
		}
	}
}

// TestDispatchNoGoroutinePerOwnedService: a starting node hands every Service to its
// owner before the owner's first sync; waiting for each one's programming must not take
// a goroutine (and its stack) per Service, and each still counts as programmed after
// the sync.
func TestDispatchNoGoroutinePerOwnedService(t *testing.T) {
	f := newDispatchFixture(t, false)
	before := runtime.NumGoroutine()
	const n = 1000
	for i := range n {
		f.d.ServiceChanged(service("a1", fmt.Sprintf("web-%d", i), "team-b"))
	}
	if grew := runtime.NumGoroutine() - before; grew > 5 {
		t.Errorf("%d Services waiting for their owner's first sync left %d more goroutines", n, grew)
	}
	for i := range n {
		name := types.NamespacedName{Namespace: "a1", Name: fmt.Sprintf("web-%d", i)}
		if owner, programmed := f.d.OwnerProgrammed(name); owner != "team-b" || programmed {
			t.Fatalf("%s: OwnerProgrammed = %q, %v before any sync", name, owner, programmed)
		}
		f.sinks["team-b"].program(name)
		if _, programmed := f.d.OwnerProgrammed(name); !programmed {
			t.Fatalf("%s: not programmed after its owner's sync", name)
		}
	}
}
