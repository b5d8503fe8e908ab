package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// loopbackListener is a Listener that serves each node port on an ephemeral loopback
// port, so tests need no fixed ports, and remembers where.
type loopbackListener struct {
	mu    sync.Mutex
	addrs map[int]string
	calls map[int]int
}

var _ Listener = &loopbackListener{}

func newLoopbackListener() *loopbackListener {
	return &loopbackListener{addrs: map[int]string{}, calls: map[int]int{}}
}

func (l *loopbackListener) Listen(_ netip.Addr, port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addrs[port] = ln.Addr().String()
	l.calls[port]++
	return ln, nil
}

// addr returns where node port was last served, failing the test if it never was.
func (l *loopbackListener) addr(t *testing.T, port int) string {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	addr, ok := l.addrs[port]
	if !ok {
		t.Fatalf("node port %d was never opened", port)
	}
	return addr
}

func (l *loopbackListener) listenCalls(port int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[port]
}

// event is one recorded Eventf call.
type event struct {
	service   types.NamespacedName
	eventType string
	reason    string
	message   string
}

// fakeRecorder records events.
type fakeRecorder struct {
	mu     sync.Mutex
	events []event
}

var _ EventRecorder = &fakeRecorder{}

func (r *fakeRecorder) Eventf(service types.NamespacedName, eventType, reason, messageFmt string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{service, eventType, reason, fmt.Sprintf(messageFmt, args...)})
}

func (r *fakeRecorder) take() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	events := r.events
	r.events = nil
	return events
}

// healthSet is a healthy func whose answers the test sets.
type healthSet struct {
	mu        sync.Mutex
	unhealthy map[string]bool
}

func (h *healthSet) healthy(instance string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.unhealthy[instance]
}

func (h *healthSet) set(instance string, healthy bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unhealthy == nil {
		h.unhealthy = map[string]bool{}
	}
	h.unhealthy[instance] = !healthy
}

// fixture is a ServiceHealth with fakes, closed when the test ends.
type fixture struct {
	sh       *ServiceHealth
	listener *loopbackListener
	recorder *fakeRecorder
	health   *healthSet
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{listener: newLoopbackListener(), recorder: &fakeRecorder{}, health: &healthSet{}}
	f.sh = NewServiceHealth(f.listener, f.recorder, f.health.healthy)
	for _, inst := range []string{"team-a", "team-b"} {
		f.sh.SetInstanceAddrs(inst, []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	}
	t.Cleanup(f.sh.Close)
	return f
}

// checks turns node ports into health checks served in both families.
func checks(ports map[types.NamespacedName]int32) map[types.NamespacedName]HealthCheck {
	if ports == nil {
		return nil
	}
	out := make(map[types.NamespacedName]HealthCheck, len(ports))
	for name, port := range ports {
		out[name] = HealthCheck{Port: port, IPv4: true, IPv6: true}
	}
	return out
}

// checkRefused asserts nothing listens on addr any more.
func checkRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		conn.Close()
		t.Errorf("connecting to closed health check %s succeeded", addr)
		return
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connecting to closed health check %s: %v, want connection refused", addr, err)
	}
}

func nsn(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}

func TestServiceHealthResponse(t *testing.T) {
	svc := nsn("shop", "frontend")
	tests := []struct {
		name      string
		endpoints map[types.NamespacedName]LocalEndpoints
		healthy   bool
		path      string
		wantCode  int
		wantBody  string
	}{
		{
			name:      "local endpoints and healthy instance",
			endpoints: map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 3}},
			healthy:   true,
			path:      "/",
			wantCode:  http.StatusOK,
			wantBody:  `{"service":{"namespace":"shop","name":"frontend"},"localEndpoints":3,"serviceProxyHealthy":true}`,
		},
		{
			name:      "any path is answered",
			endpoints: map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 1}},
			healthy:   true,
			path:      "/some/lb/probe?x=1",
			wantCode:  http.StatusOK,
			wantBody:  `{"service":{"namespace":"shop","name":"frontend"},"localEndpoints":1,"serviceProxyHealthy":true}`,
		},
		{
			name:      "no local endpoints",
			endpoints: map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 0}},
			healthy:   true,
			path:      "/",
			wantCode:  http.StatusServiceUnavailable,
			wantBody:  `{"service":{"namespace":"shop","name":"frontend"},"localEndpoints":0,"serviceProxyHealthy":true}`,
		},
		{
			name:      "service missing from endpoints has none",
			endpoints: map[types.NamespacedName]LocalEndpoints{nsn("shop", "other"): {IPv4: 4}},
			healthy:   true,
			path:      "/",
			wantCode:  http.StatusServiceUnavailable,
			wantBody:  `{"service":{"namespace":"shop","name":"frontend"},"localEndpoints":0,"serviceProxyHealthy":true}`,
		},
		{
			name:      "unhealthy instance",
			endpoints: map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 3}},
			healthy:   false,
			path:      "/",
			wantCode:  http.StatusServiceUnavailable,
			wantBody:  `{"service":{"namespace":"shop","name":"frontend"},"localEndpoints":3,"serviceProxyHealthy":false}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.health.set("team-a", tc.healthy)
			f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{svc: 30001}))
			f.sh.SyncEndpoints("team-a", tc.endpoints)

			r := get(t, "http://"+f.listener.addr(t, 30001)+tc.path)
			if r.code != tc.wantCode {
				t.Errorf("status %d, want %d", r.code, tc.wantCode)
			}
			if string(r.body) != tc.wantBody {
				t.Errorf("body\n got %s\nwant %s", r.body, tc.wantBody)
			}
			checkJSONHeaders(t, r)
			wantWeight := fmt.Sprint(tc.endpoints[svc].IPv4)
			if got := r.header.Get("X-Load-Balancing-Endpoint-Weight"); got != wantWeight {
				t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %q", got, wantWeight)
			}
			if events := f.recorder.take(); len(events) != 0 {
				t.Errorf("unexpected events %+v", events)
			}
		})
	}
}

func TestServiceHealthEndpointsFollowSync(t *testing.T) {
	f := newFixture(t)
	svc := nsn("shop", "frontend")
	f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{svc: 30001}))
	url := "http://" + f.listener.addr(t, 30001)

	if r := get(t, url); r.code != http.StatusServiceUnavailable {
		t.Errorf("before any endpoints: status %d, want 503", r.code)
	}
	f.sh.SyncEndpoints("team-a", map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 2}})
	if r := get(t, url); r.code != http.StatusOK {
		t.Errorf("with endpoints: status %d, want 200", r.code)
	}
	// Another instance's endpoints never touch team-a's Services.
	f.sh.SyncEndpoints("team-b", map[types.NamespacedName]LocalEndpoints{})
	if r := get(t, url); r.code != http.StatusOK {
		t.Errorf("after another instance's sync: status %d, want 200", r.code)
	}
	f.sh.SyncEndpoints("team-a", nil)
	if r := get(t, url); r.code != http.StatusServiceUnavailable {
		t.Errorf("after endpoints went away: status %d, want 503", r.code)
	}
}

func TestServiceHealthSyncServices(t *testing.T) {
	f := newFixture(t)
	kept, dropped, moved := nsn("shop", "kept"), nsn("shop", "dropped"), nsn("shop", "moved")
	other := nsn("bank", "ledger")

	f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{kept: 30001, dropped: 30002, moved: 30003}))
	f.sh.SyncServices("team-b", checks(map[types.NamespacedName]int32{other: 30010}))
	keptAddr := f.listener.addr(t, 30001)
	droppedAddr := f.listener.addr(t, 30002)
	movedAddr := f.listener.addr(t, 30003)
	otherAddr := f.listener.addr(t, 30010)
	for _, addr := range []string{keptAddr, droppedAddr, movedAddr, otherAddr} {
		get(t, "http://"+addr)
	}

	f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{kept: 30001, moved: 30004}))
	checkRefused(t, droppedAddr)
	checkRefused(t, movedAddr)
	if got := f.listener.listenCalls(30001); got != 1 {
		t.Errorf("unchanged Service's port opened %d times, want 1", got)
	}
	if r := get(t, "http://"+f.listener.addr(t, 30004)); !strings.Contains(string(r.body), `"name":"moved"`) {
		t.Errorf("new port of moved Service answers %s", r.body)
	}
	get(t, "http://"+keptAddr)
	get(t, "http://"+otherAddr)

	f.sh.SyncServices("team-a", nil)
	checkRefused(t, keptAddr)
	checkRefused(t, f.listener.addr(t, 30004))
	if r := get(t, "http://"+otherAddr); !strings.Contains(string(r.body), `"name":"ledger"`) {
		t.Errorf("team-b's health check answers %s after team-a dropped all its Services", r.body)
	}
	if events := f.recorder.take(); len(events) != 0 {
		t.Errorf("unexpected events %+v", events)
	}

	f.sh.Close()
	checkRefused(t, otherAddr)
	f.sh.SyncServices("team-b", checks(map[types.NamespacedName]int32{other: 30011}))
	if got := f.listener.listenCalls(30011); got != 0 {
		t.Errorf("SyncServices after Close opened a port")
	}
}

func TestServiceHealthPortConflict(t *testing.T) {
	tests := []struct {
		name string
		// syncs run in order; the last one's loser must get an event.
		syncs []struct {
			instance string
			ports    map[types.NamespacedName]int32
		}
		wantServing types.NamespacedName
		wantLoser   types.NamespacedName
	}{
		{
			name: "another instance's Service holds the port",
			syncs: []struct {
				instance string
				ports    map[types.NamespacedName]int32
			}{
				{"team-b", map[types.NamespacedName]int32{nsn("b", "z"): 30001}},
				{"team-a", map[types.NamespacedName]int32{nsn("a", "a"): 30001}},
			},
			wantServing: nsn("b", "z"),
			wantLoser:   nsn("a", "a"),
		},
		{
			name: "two Services of one instance, the first by name wins",
			syncs: []struct {
				instance string
				ports    map[types.NamespacedName]int32
			}{
				{"team-a", map[types.NamespacedName]int32{nsn("shop", "b"): 30001, nsn("shop", "a"): 30001}},
			},
			wantServing: nsn("shop", "a"),
			wantLoser:   nsn("shop", "b"),
		},
		{
			name: "a Service already serving keeps its port against a new one",
			syncs: []struct {
				instance string
				ports    map[types.NamespacedName]int32
			}{
				{"team-a", map[types.NamespacedName]int32{nsn("shop", "z"): 30001}},
				{"team-a", map[types.NamespacedName]int32{nsn("shop", "z"): 30001, nsn("shop", "a"): 30001}},
			},
			wantServing: nsn("shop", "z"),
			wantLoser:   nsn("shop", "a"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			for _, s := range tc.syncs {
				f.sh.SyncServices(s.instance, checks(s.ports))
			}
			if got := f.listener.listenCalls(30001); got != 1 {
				t.Errorf("port opened %d times, want 1", got)
			}
			r := get(t, "http://"+f.listener.addr(t, 30001))
			wantName := fmt.Sprintf(`"name":%q`, tc.wantServing.Name)
			if !strings.Contains(string(r.body), wantName) {
				t.Errorf("port serves %s, want %s", r.body, tc.wantServing)
			}
			events := f.recorder.take()
			if len(events) != 1 {
				t.Fatalf("events %+v, want one for %s", events, tc.wantLoser)
			}
			if e := events[0]; e.service != tc.wantLoser || e.eventType != "Warning" || e.reason != ReasonFailedToStartServiceHealthcheck {
				t.Errorf("event %+v, want a Warning %s on %s", e, ReasonFailedToStartServiceHealthcheck, tc.wantLoser)
			}
		})
	}
}

// TestServiceHealthMovedServiceKeepsItsServer: a Service moving between instances
// (whichever syncs first) keeps its running server: the port never closes, no Warning
// event, and answers follow the new owner's endpoints and health.
func TestServiceHealthMovedServiceKeepsItsServer(t *testing.T) {
	f := newFixture(t)
	svc := nsn("shop", "frontend")
	f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{svc: 30001}))
	f.sh.SyncEndpoints("team-a", map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 1}})
	addr := f.listener.addr(t, 30001)

	// The Service moves to team-b, and team-b syncs first.
	f.sh.SyncServices("team-b", checks(map[types.NamespacedName]int32{svc: 30001}))
	f.sh.SyncEndpoints("team-b", map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 5}})
	if events := f.recorder.take(); len(events) != 0 {
		t.Errorf("events %+v, want none: the Service only changed instance", events)
	}
	f.health.set("team-a", false)
	r := get(t, "http://"+addr)
	if r.code != http.StatusOK || !strings.Contains(string(r.body), `"localEndpoints":5`) {
		t.Errorf("after the move: status %d body %s, want team-b's 200 with 5 endpoints", r.code, r.body)
	}
	// team-a's own sync no longer has it, and must not close what team-b now owns.
	f.sh.SyncServices("team-a", nil)
	f.sh.SyncEndpoints("team-a", nil)
	if r := get(t, "http://"+addr); r.code != http.StatusOK {
		t.Errorf("after team-a's sync: status %d body %s, want team-b's 200 on the same socket", r.code, r.body)
	}
	if got := f.listener.listenCalls(30001); got != 1 {
		t.Errorf("port opened %d times, want 1 (one socket from start to end)", got)
	}
	f.health.set("team-b", false)
	if r := get(t, "http://"+addr); r.code != http.StatusServiceUnavailable {
		t.Errorf("with team-b unhealthy: status %d, want 503 (health follows the owner)", r.code)
	}
}

// TestServiceHealthFreedPortGoesToWaitingService: a port one Service gives up goes at once
// to another Service (of any instance) that was waiting for it.
func TestServiceHealthFreedPortGoesToWaitingService(t *testing.T) {
	f := newFixture(t)
	old, waiting := nsn("shop", "old"), nsn("shop", "new")
	f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{old: 30001}))
	f.sh.SyncServices("team-b", checks(map[types.NamespacedName]int32{waiting: 30001}))
	f.sh.SyncEndpoints("team-b", map[types.NamespacedName]LocalEndpoints{waiting: {IPv4: 5}})
	if events := f.recorder.take(); len(events) != 1 || events[0].service != waiting {
		t.Errorf("events %+v, want one for %s's conflict", events, waiting)
	}
	oldAddr := f.listener.addr(t, 30001)

	f.sh.SyncServices("team-a", nil)
	checkRefused(t, oldAddr)
	r := get(t, "http://"+f.listener.addr(t, 30001))
	if r.code != http.StatusOK || !strings.Contains(string(r.body), `"name":"new"`) {
		t.Errorf("after team-a let go: status %d body %s, want %s's 200", r.code, r.body, waiting)
	}
}

func TestServiceHealthBindFailure(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := held.Addr().(*net.TCPAddr).Port
	recorder := &fakeRecorder{}
	sh := NewServiceHealth(TCPListener{}, recorder, nil)
	clock := testutil.NewClock(time.Now())
	sh.now = clock.Now
	sh.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("127.0.0.1")})
	t.Cleanup(sh.Close)
	svc := nsn("shop", "frontend")
	ports := map[types.NamespacedName]int32{svc: int32(port)}

	sh.SyncServices("team-a", checks(ports))
	sh.SyncEndpoints("team-a", map[types.NamespacedName]LocalEndpoints{svc: {IPv4: 2}})
	events := recorder.take()
	if len(events) != 1 {
		t.Fatalf("events %+v, want one", events)
	}
	e := events[0]
	if e.service != svc || e.eventType != "Warning" || e.reason != ReasonFailedToStartServiceHealthcheck {
		t.Errorf("event %+v, want a Warning %s on %s", e, ReasonFailedToStartServiceHealthcheck, svc)
	}
	if !strings.Contains(e.message, fmt.Sprint(port)) || !strings.Contains(e.message, `"team-a"`) {
		t.Errorf("event message %q does not name the port and instance", e.message)
	}

	// Still taken: every sync retries and fails again, reported again only reportEvery
	// after the last report (each report an event write to the API server).
	for range 5 {
		sh.SyncServices("team-a", checks(ports))
	}
	if events := recorder.take(); len(events) != 0 {
		t.Errorf("events on 5 retries with the same failure %+v, want none", events)
	}
	clock.Step(reportEvery)
	sh.SyncServices("team-a", checks(ports))
	sh.SyncServices("team-a", checks(ports))
	if events := recorder.take(); len(events) != 1 {
		t.Errorf("events on retries %v after the report %+v, want one", reportEvery, events)
	}

	// A timed retry while the port is still held: no event, still closed.
	sh.RetryFailed()
	if events := recorder.take(); len(events) != 0 {
		t.Errorf("RetryFailed recorded events %+v, want none", events)
	}
	// The holder accepts but never answers: a short timeout, and no answer expected.
	client := &http.Client{Timeout: 300 * time.Millisecond}
	if _, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
		t.Fatal("the holder's port answered as a health check")
	}

	// Freed (a legacy kube-proxy letting go): the timed retry opens it, no sync needed.
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	sh.RetryFailed()
	if events := recorder.take(); len(events) != 0 {
		t.Errorf("events after the port was freed %+v, want none", events)
	}
	r := get(t, fmt.Sprintf("http://127.0.0.1:%d/", port))
	want := `{"service":{"namespace":"shop","name":"frontend"},"localEndpoints":2,"serviceProxyHealthy":true}`
	if r.code != http.StatusOK || string(r.body) != want {
		t.Errorf("after retry: status %d body %s, want 200 %s", r.code, r.body, want)
	}
}

func TestServiceHealthInvalidPort(t *testing.T) {
	f := newFixture(t)
	f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{nsn("shop", "zero"): 0, nsn("shop", "big"): 70000}))
	if events := f.recorder.take(); len(events) != 2 {
		t.Errorf("events %+v, want one per invalid port", events)
	}
	if got := f.listener.listenCalls(0) + f.listener.listenCalls(70000); got != 0 {
		t.Errorf("invalid ports reached the listener %d times", got)
	}
}

// failingListener fails every Listen, or with only set those on that address, with its
// current error; nil listens on loopback.
type failingListener struct {
	mu   sync.Mutex
	err  error
	only netip.Addr
}

func (l *failingListener) Listen(addr netip.Addr, _ int) (net.Listener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil && (!l.only.IsValid() || addr == l.only) {
		return nil, l.err
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// TestServiceHealthReportsEachFailureOnce: a failure is reported (an event) when it
// begins, when it changes, and reportEvery while it lasts, not on every retry; once the
// health check opens, the next failure is new.
func TestServiceHealthReportsEachFailureOnce(t *testing.T) {
	listener := &failingListener{err: errors.New("cannot assign requested address")}
	recorder := &fakeRecorder{}
	sh := NewServiceHealth(listener, recorder, nil)
	clock := testutil.NewClock(time.Now())
	sh.now = clock.Now
	sh.SetInstanceAddrs("team-a", []netip.Addr{netip.MustParseAddr("192.0.2.1")})
	t.Cleanup(sh.Close)
	ports := checks(map[types.NamespacedName]int32{nsn("shop", "frontend"): 30001})
	steps := []struct {
		name   string
		do     func()
		events int
	}{
		{"the first failure", func() {}, 1},
		{"the same failure, retried", func() {}, 0},
		{"the same failure a minute later", func() { clock.Step(time.Minute) }, 0},
		{"another failure", func() { listener.err = errors.New("address already in use") }, 1},
		{"the same failure reportEvery later", func() { clock.Step(reportEvery) }, 1},
		{"opened", func() { listener.err = nil }, 0},
		{"closed, then the first failure again", func() {
			sh.SyncServices("team-a", nil)
			listener.err = errors.New("cannot assign requested address")
		}, 1},
	}
	for _, st := range steps {
		listener.mu.Lock()
		st.do()
		listener.mu.Unlock()
		sh.SyncServices("team-a", ports)
		if events := recorder.take(); len(events) != st.events {
			t.Errorf("%s: events %+v, want %d", st.name, events, st.events)
		}
	}
}

// TestServiceHealthHandOverReportsOnce: a health check failing on one of its addresses
// (served on the others) that moves to another instance failing alike is reported once
// more, naming the new owner, and then no more on its retries; whichever instance syncs
// first.
func TestServiceHealthHandOverReportsOnce(t *testing.T) {
	good, bad := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.1")
	svc := nsn("shop", "frontend")
	ports := checks(map[types.NamespacedName]int32{svc: 30001})
	for _, tc := range []struct {
		name string
		// handOver moves the Service to team-b: its first sync there.
		handOver func(sh *ServiceHealth, owner *atomic.Value)
		// settle is the other instance's sync that follows.
		settle func(sh *ServiceHealth)
	}{
		{"the new owner syncs first and adopts it",
			func(sh *ServiceHealth, _ *atomic.Value) { sh.SyncServices("team-b", ports) },
			func(sh *ServiceHealth) { sh.SyncServices("team-a", nil) }},
		{"the old owner syncs first and hands it over",
			func(sh *ServiceHealth, owner *atomic.Value) { owner.Store("team-b"); sh.SyncServices("team-a", nil) },
			func(sh *ServiceHealth) { sh.SyncServices("team-b", ports) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listener := &failingListener{err: errors.New("cannot assign requested address"), only: bad}
			recorder := &fakeRecorder{}
			sh := NewServiceHealth(listener, recorder, nil)
			clock := testutil.NewClock(time.Now())
			sh.now = clock.Now
			var owner atomic.Value
			owner.Store("team-a")
			sh.SetOwnerLookup(func(types.NamespacedName) string { return owner.Load().(string) })
			for _, inst := range []string{"team-a", "team-b"} {
				sh.SetInstanceAddrs(inst, []netip.Addr{good, bad})
			}
			t.Cleanup(sh.Close)
			steps := []struct {
				name string
				do   func()
				// events are the instances the events name, in order.
				events []string
			}{
				{"team-a's first failure", func() { sh.SyncServices("team-a", ports) }, []string{"team-a"}},
				{"team-a's retry", func() { sh.SyncServices("team-a", ports) }, nil},
				{"handed to team-b, failing alike", func() { tc.handOver(sh, &owner) }, []string{"team-b"}},
				{"the other instance's sync", func() { tc.settle(sh) }, nil},
				{"team-b's retries", func() {
					clock.Step(time.Minute)
					sh.SyncServices("team-b", ports)
					sh.RetryFailed()
				}, nil},
			}
			for _, st := range steps {
				st.do()
				var got []string
				for _, e := range recorder.take() {
					_, inst, _ := strings.Cut(e.message, "(instance ")
					inst, _, _ = strings.Cut(inst, ")")
					got = append(got, strings.Trim(inst, `"`))
				}
				if !slices.Equal(got, st.events) {
					t.Errorf("%s: events naming %v, want %v", st.name, got, st.events)
				}
			}
		})
	}
}

// TestServiceHealthAnswersTheProbedFamily: a probe gets the local endpoints of the IP
// family of the node address it reached (the connection's local address; an
// IPv4-mapped one, on a dual-stack wildcard socket, is IPv4), in the status, the body's
// localEndpoints and the weight header.
func TestServiceHealthAnswersTheProbedFamily(t *testing.T) {
	svc := nsn("shop", "dual")
	tests := []struct {
		name      string
		local     string
		endpoints LocalEndpoints
		wantCode  int
		wantLocal int
	}{
		{"IPv4 probe, IPv4 endpoints", "192.0.2.1:30001", LocalEndpoints{IPv4: 2}, http.StatusOK, 2},
		{"IPv6 probe, only IPv4 endpoints", "[2001:db8::1]:30001", LocalEndpoints{IPv4: 2}, http.StatusServiceUnavailable, 0},
		{"IPv6 probe, IPv6 endpoints", "[2001:db8::1]:30001", LocalEndpoints{IPv4: 2, IPv6: 1}, http.StatusOK, 1},
		{"IPv4 probe, only IPv6 endpoints", "192.0.2.1:30001", LocalEndpoints{IPv6: 3}, http.StatusServiceUnavailable, 0},
		{"IPv4 probe on a dual-stack socket", "[::ffff:192.0.2.1]:30001", LocalEndpoints{IPv4: 4, IPv6: 0}, http.StatusOK, 4},
		{"IPv6 link-local probe", "[fe80::1%eth0]:30001", LocalEndpoints{IPv4: 4, IPv6: 5}, http.StatusOK, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.sh.SyncServices("team-a", checks(map[types.NamespacedName]int32{svc: 30001}))
			f.sh.SyncEndpoints("team-a", map[types.NamespacedName]LocalEndpoints{svc: tc.endpoints})
			f.sh.mu.RLock()
			h := f.sh.ports[30001].server.Handler
			f.sh.mu.RUnlock()
			local, err := net.ResolveTCPAddr("tcp", tc.local)
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, local))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			want := fmt.Sprintf(`{"service":{"namespace":"shop","name":"dual"},"localEndpoints":%d,"serviceProxyHealthy":true}`, tc.wantLocal)
			if rec.Code != tc.wantCode || rec.Body.String() != want {
				t.Errorf("%d %s, want %d %s", rec.Code, rec.Body, tc.wantCode, want)
			}
			if got := rec.Header().Get("X-Load-Balancing-Endpoint-Weight"); got != fmt.Sprint(tc.wantLocal) {
				t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %d", got, tc.wantLocal)
			}
		})
	}
}
