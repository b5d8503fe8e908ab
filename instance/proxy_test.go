package instance

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// flakyNFT wraps a Fake and fails Run while fail is set.
type flakyNFT struct {
	*knftables.Fake
	fail atomic.Bool
	runs atomic.Int32
	// held, when set, holds Run (a sync stuck in nft) until it is released.
	held atomic.Pointer[gate]
}

func (f *flakyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.runs.Add(1)
	if g := f.held.Load(); g != nil {
		g.pass()
	}
	if f.fail.Load() {
		return errors.New("simulated nft failure")
	}
	return f.Fake.Run(ctx, tx)
}

type recordingObserver struct {
	mu      sync.Mutex
	results []*SyncResult
	fails   int
}

func (o *recordingObserver) Queued(string) {}
func (o *recordingObserver) Synced(r *SyncResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, r)
}
func (o *recordingObserver) SyncFailed(string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.fails++
}

func (o *recordingObserver) failures() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fails
}

// newTestProxy returns an IPv4 instance "test" on a flakyNFT, after edits to its Options.
func newTestProxy(t *testing.T, obs Observer, edits ...func(*Options)) (*Proxy, *flakyNFT) {
	t.Helper()
	nft := &flakyNFT{Fake: knftables.NewFake(knftables.IPv4Family, "shardproxy-test")}
	opts := Options{
		Name:     "test",
		Tables:   tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14},
		Families: []tables.Family{tables.IPv4},
		NFT: func(tables.Family, string) (knftables.Interface, error) {
			return nft, nil
		},
		SyncPeriod:       time.Hour,
		TableCheckPeriod: 20 * time.Millisecond,
		Node:             thisNode(),
		Observer:         obs,
	}
	for _, edit := range edits {
		edit(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p, nft
}

func (f *flakyNFT) dump() string {
	f.RLock()
	defer f.RUnlock()
	if f.Table == nil {
		return ""
	}
	return f.Dump()
}

func TestSyncPartialAfterFull(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	ctx := context.Background()
	p.UpdateService(service())
	res, err := p.Sync(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Full || res.Services != 1 {
		t.Fatalf("first sync: want a full sync of 1 Service, got full=%v services=%d", res.Full, res.Services)
	}
	p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.5", thisNodeName)))
	programmed := p.UpdateService(service())
	res, err = p.Sync(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Full {
		t.Error("second sync should be partial")
	}
	if len(res.Changed) != 1 || res.Changed[0].Before == nil || res.Changed[0].After == nil {
		t.Errorf("want one changed Service with before and after, got %+v", res.Changed)
	}
	if !strings.Contains(nft.dump(), "10.244.1.5 . 8080") {
		t.Errorf("endpoint not programmed:\n%s", nft.dump())
	}
	select {
	case <-programmed:
	default:
		t.Error("the Service's programmed channel was not closed by the sync")
	}
}

func TestFailedSyncRetriesAsFull(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	ctx := context.Background()
	p.UpdateService(service())
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	nft.fail.Store(true)
	ch := p.UpdateService(service(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.99"} }))
	if _, err := p.Sync(ctx, false); err == nil {
		t.Fatal("want a failure")
	}
	select {
	case <-ch:
		t.Fatal("a failed sync must not report the Service as programmed")
	default:
	}
	nft.fail.Store(false)
	res, err := p.Sync(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Full {
		t.Error("the sync after a failure must be full")
	}
	<-ch
	if !strings.Contains(nft.dump(), "192.0.2.99") {
		t.Error("the change that failed was not applied by the retry")
	}
}

func TestRunRebuildsDeletedTable(t *testing.T) {
	obs := &recordingObserver{}
	p, nft := newTestProxy(t, obs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	ch := p.UpdateService(service())
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("Service never programmed")
	}
	// Someone deletes the table.
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for !strings.Contains(nft.dump(), clusterIP4) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("table not rebuilt within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("table rebuilt after %v", time.Since(start))
}

func TestRunBatchesChangesWithinMinSyncPeriod(t *testing.T) {
	obs := &recordingObserver{}
	p, nft := newTestProxy(t, obs)
	p.opts.MinSyncPeriod = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	first := p.UpdateService(service())
	<-first
	before := nft.runs.Load()
	var last <-chan struct{}
	for i := 0; i < 20; i++ {
		last = p.UpdateService(service(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2." + strconv.Itoa(i+1)} }))
	}
	select {
	case <-last:
	case <-time.After(5 * time.Second):
		t.Fatal("changes never programmed")
	}
	if runs := nft.runs.Load() - before; runs > 2 {
		t.Errorf("20 quick changes took %d transactions; minSyncPeriod should batch them", runs)
	}
	if !strings.Contains(nft.dump(), "192.0.2.20") {
		t.Error("last change missing")
	}
}

// TestSyncReportsProgrammingLatency checks a sync reports, for each endpoint change it
// programmed, the time since the change's trigger, and that a failed sync keeps them for
// the next one.
func TestSyncReportsProgrammingLatency(t *testing.T) {
	clock := testutil.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	nft := &flakyNFT{Fake: knftables.NewFake(knftables.IPv4Family, "shardproxy-test")}
	p, err := New(Options{
		Name: "test", Tables: tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14},
		Families: []tables.Family{tables.IPv4},
		NFT:      func(tables.Family, string) (knftables.Interface, error) { return nft, nil },
		Node:     thisNode(), Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p.UpdateService(service())
	if res, err := p.Sync(ctx, false); err != nil || len(res.ProgrammingLatencies) != 0 {
		t.Fatalf("first sync: %v, latencies %v; want none", err, res.ProgrammingLatencies)
	}

	clock.Step(time.Second)
	p.UpdateEndpointSlice(triggered(v4Slice("web-1", ep("10.244.1.5", thisNodeName)), "2", clock.Now()))
	clock.Step(300 * time.Millisecond)
	nft.fail.Store(true)
	if _, err := p.Sync(ctx, false); err == nil {
		t.Fatal("want a failure")
	}
	nft.fail.Store(false)
	clock.Step(200 * time.Millisecond)
	res, err := p.Sync(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{500 * time.Millisecond}; !slices.Equal(res.ProgrammingLatencies[tables.IPv4], want) || len(res.ProgrammingLatencies) != 1 {
		t.Errorf("latencies after the retry = %v, want %v", res.ProgrammingLatencies, want)
	}
	if res, err := p.Sync(ctx, false); err != nil || len(res.ProgrammingLatencies) != 0 {
		t.Errorf("a sync with nothing new: %v, latencies %v; want none", err, res.ProgrammingLatencies)
	}
}

// TestSyncLatencyOfWrittenTriggers: the latency a sync reports for an endpoint change
// is measured from a trigger time held between when the slice's previous version and
// this one were seen, whatever its writer put in the annotation.
func TestSyncLatencyOfWrittenTriggers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trigger time.Duration // from when the change is seen, 10 minutes after the previous version
		want    []time.Duration
	}{
		{name: "an honest trigger before the change was seen", trigger: -2 * time.Second, want: []time.Duration{2500 * time.Millisecond}},
		{name: "a trigger in the future counts from when the change was seen", trigger: time.Hour, want: []time.Duration{500 * time.Millisecond}},
		{name: "a trigger years ahead is no negative latency", trigger: 100 * 365 * 24 * time.Hour, want: []time.Duration{500 * time.Millisecond}},
		{name: "a trigger between the previous version and this one", trigger: -5 * time.Minute, want: []time.Duration{5*time.Minute + 500*time.Millisecond}},
		{name: "a trigger older than the previous version, newer than the Service, is not counted", trigger: -10*time.Minute - 500*time.Millisecond},
		{name: "a trigger older than the Service is not counted", trigger: -time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
			nft := knftables.NewFake(knftables.IPv4Family, "shardproxy-test")
			p, err := New(Options{
				Name: "test", Tables: tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14},
				Families: []tables.Family{tables.IPv4},
				NFT:      func(tables.Family, string) (knftables.Interface, error) { return nft, nil },
				Node:     thisNode(), Clock: clock,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			p.UpdateService(service())
			clock.Step(time.Second)
			p.UpdateEndpointSlice(triggered(v4Slice("web-1", ep("10.244.1.5", thisNodeName)), "2", clock.Now()))
			if _, err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			clock.Step(10 * time.Minute)
			p.UpdateEndpointSlice(triggered(v4Slice("web-1", ep("10.244.1.6", thisNodeName)), "3", clock.Now().Add(tc.trigger)))
			clock.Step(500 * time.Millisecond)
			res, err := p.Sync(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.ProgrammingLatencies[tables.IPv4]; !slices.Equal(got, tc.want) {
				t.Errorf("latencies %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRunRetriesAfterBackoff checks a failed sync is retried once its backoff runs out
// although the table check (and changes) keep waking the loop more often than that.
func TestRunRetriesAfterBackoff(t *testing.T) {
	obs := &recordingObserver{}
	p, nft := newTestProxy(t, obs) // table check every 20ms, SyncPeriod 1h
	nft.fail.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	programmed := p.UpdateService(service())
	deadline := time.Now().Add(5 * time.Second)
	for obs.failures() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first sync never failed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	failed := time.Now()
	nft.fail.Store(false)
	// Changes during the backoff must not push the retry back either.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1."+strconv.Itoa(i%200+1), thisNodeName)))
			}
		}
	}()
	// The first backoff is 1s; allow for a slow machine, not for SyncPeriod.
	select {
	case <-programmed:
		t.Logf("retried %v after the failure", time.Since(failed))
	case <-time.After(5 * time.Second):
		t.Fatalf("no retry within 5s of a failure with a 1s backoff (failures %d)", obs.failures())
	}
	if !strings.Contains(nft.dump(), clusterIP4) {
		t.Errorf("the retry did not program the Service:\n%s", nft.dump())
	}
}

// TestSyncSurvivesPanickingModel checks a Service whose model building panics is skipped
// with the panic as its Problem, while every other Service is programmed and the proxy
// keeps taking events (its lock is not left held).
func TestSyncSurvivesPanickingModel(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	badName := types.NamespacedName{Namespace: "ns", Name: "bad"}
	p.tracker.build = func(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo) *ServiceModel {
		if svc.Name == badName.Name {
			panic("malformed Service")
		}
		return Build(svc, slices, node)
	}
	bad := service(func(s *corev1.Service) {
		s.Name = badName.Name
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "172.30.0.99", []string{"172.30.0.99"}
	})
	ctx := context.Background()

	// sync runs one sync, turning a panic into a test failure instead of a crash.
	sync := func(name string) *SyncResult {
		t.Helper()
		var res *SyncResult
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s: Sync panicked: %v", name, r)
				}
			}()
			res, err = p.Sync(ctx, false)
		}()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	// update calls fn, failing the test if it blocks (p.mu left locked).
	update := func(name string, fn func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); fn() }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s blocked: the proxy no longer takes events", name)
		}
	}

	for _, tc := range []struct {
		name string
		full bool
	}{
		{name: "full sync", full: true},
		{name: "partial sync"},
	} {
		if !tc.full {
			update("UpdateEndpointSlice", func() { p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.5", thisNodeName))) })
		}
		var programmed <-chan struct{}
		update("UpdateService", func() {
			p.UpdateService(bad)
			programmed = p.UpdateService(service())
		})
		res := sync(tc.name)
		if res.Full != tc.full {
			t.Errorf("%s: full = %v", tc.name, res.Full)
		}
		select {
		case <-programmed:
		default:
			t.Errorf("%s: ns/web was not reported programmed", tc.name)
		}
		applied := p.Applied()
		if m := applied[webName]; m == nil || len(m.Ports[tables.IPv4]) != 1 {
			t.Errorf("%s: ns/web not applied: %+v", tc.name, m)
		}
		m := applied[badName]
		if m == nil || len(m.Ports) != 0 {
			t.Fatalf("%s: ns/bad applied as %+v, want a model with no ports", tc.name, m)
		}
		checkProblems(t, m.Problems, []string{"malformed Service"})
		dump := nft.dump()
		if !strings.Contains(dump, clusterIP4) || strings.Contains(dump, "172.30.0.99") {
			t.Errorf("%s: want ns/web programmed and ns/bad not:\n%s", tc.name, dump)
		}
	}
	if !strings.Contains(nft.dump(), "10.244.1.5 . 8080") {
		t.Errorf("the partial sync did not program ns/web's endpoint:\n%s", nft.dump())
	}
}

// TestSyncReleasesLockOnPanic checks a panic that does escape Sync's locked section (here
// from the logger reporting a model's panic) leaves the proxy taking events, so the
// supervisor's restart of the instance finds it working.
func TestSyncReleasesLockOnPanic(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	p.tracker.build = func(*corev1.Service, []*discoveryv1.EndpointSlice, NodeInfo) *ServiceModel {
		panic("malformed Service")
	}
	p.logger = funcr.New(func(string, string) { panic("logger failed") }, funcr.Options{})
	p.UpdateService(service())
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("want the logger's panic out of Sync")
			}
		}()
		_, _ = p.Sync(context.Background(), false)
	}()

	p.tracker.build = Build
	p.logger = klog.Background()
	var programmed <-chan struct{}
	done := make(chan struct{})
	go func() { defer close(done); programmed = p.UpdateService(service()) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("UpdateService blocked after a panic in Sync: p.mu was left locked")
	}
	if _, err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	<-programmed
	if !strings.Contains(nft.dump(), clusterIP4) {
		t.Errorf("Service not programmed after the panic:\n%s", nft.dump())
	}
}

// TestSyncLogsProblemsWhenBuilt checks a changed model's Problems are logged by the sync
// that builds it, even when that sync fails (its retry does not see the model as changed).
func TestSyncLogsProblemsWhenBuilt(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	var mu sync.Mutex
	var logged []string
	p.logger = funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{})
	problemLogs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, l := range logged {
			if strings.Contains(l, "Skipped parts of a Service") {
				out = append(out, l)
			}
		}
		return out
	}
	ctx := context.Background()
	p.UpdateService(service())
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got := problemLogs(); len(got) != 0 {
		t.Fatalf("a valid Service logged problems: %q", got)
	}

	nft.fail.Store(true)
	p.UpdateService(service(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"not-an-ip", "192.0.2.99"} }))
	if _, err := p.Sync(ctx, false); err == nil {
		t.Fatal("want a failure")
	}
	got := problemLogs()
	if len(got) != 1 || !strings.Contains(got[0], `spec.externalIPs[0]: \"not-an-ip\" is not an IP address`) ||
		!strings.Contains(got[0], `"service"`) {
		t.Fatalf("after the failed sync that built the model, problem logs = %q; want one naming the problem", got)
	}
	nft.fail.Store(false)
	if res, err := p.Sync(ctx, false); err != nil || !res.Full {
		t.Fatalf("retry: %v (want a full sync)", err)
	}
	if got := problemLogs(); len(got) != 1 {
		t.Errorf("problem logs after the retry = %q; want still the one", got)
	}
}

// TestDeleteServiceForgetsItsSlices: a Service handed to another instance (or deleted)
// takes its EndpointSlices with it, so when it comes back with its current slices, an
// endpoint removed meanwhile (an event this instance never heard) is not programmed.
func TestDeleteServiceForgetsItsSlices(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	ctx := context.Background()
	p.UpdateService(service())
	p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.5", thisNodeName)))
	p.UpdateEndpointSlice(v4Slice("web-2", ep("10.244.2.5", "node-b")))
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	p.DeleteService(webName)
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	// Back, with only the slice that still exists.
	p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.5", thisNodeName)))
	p.UpdateService(service())
	if _, err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	dump := nft.dump()
	if !strings.Contains(dump, "10.244.1.5 . 8080") {
		t.Errorf("the current endpoint is not programmed:\n%s", dump)
	}
	if strings.Contains(dump, "10.244.2.5") {
		t.Errorf("an endpoint of a slice deleted while the Service was away is programmed:\n%s", dump)
	}
}

// panickingNFT panics in Run.
type panickingNFT struct{ *knftables.Fake }

func (panickingNFT) Run(context.Context, *knftables.Transaction) error { panic("nft exploded") }

// TestSyncContainsPanicInFamilySync: the families sync on goroutines of their own, where a
// panic would escape the supervisor's recover and end the process; it must come back as
// the sync's error instead.
func TestSyncContainsPanicInFamilySync(t *testing.T) {
	p, err := New(Options{
		Name: "test", Tables: tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14},
		Families: []tables.Family{tables.IPv4, tables.IPv6},
		NFT: func(fam tables.Family, table string) (knftables.Interface, error) {
			return panickingNFT{knftables.NewFake(tables.KnftFamily(fam), table)}, nil
		},
		Node: thisNode(),
	})
	if err != nil {
		t.Fatal(err)
	}
	p.UpdateService(service())
	_, err = p.Sync(context.Background(), false)
	if err == nil || !strings.Contains(err.Error(), "nft exploded") {
		t.Fatalf("Sync error = %v, want the panic as an error", err)
	}
}

// TestAppliedModel: one Service's programmed model is the one Applied holds, read
// without copying the others (the supervisor reads a few after every sync), nil for a
// Service not programmed, and gone with the Service.
func TestAppliedModel(t *testing.T) {
	p, _ := newTestProxy(t, nil)
	sync := func(full bool) {
		t.Helper()
		if _, err := p.Sync(context.Background(), full); err != nil {
			t.Fatal(err)
		}
	}
	p.UpdateService(service())
	p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.0.5", thisNodeName)))
	sync(true)
	unknown := types.NamespacedName{Namespace: "ns", Name: "none"}
	for _, tc := range []struct {
		name types.NamespacedName
		want *ServiceModel
	}{{webName, p.Applied()[webName]}, {unknown, nil}} {
		if got := p.AppliedModel(tc.name); got != tc.want {
			t.Errorf("AppliedModel(%s) = %p, want %p", tc.name, got, tc.want)
		}
	}
	if p.AppliedModel(webName) == nil {
		t.Fatal("ns/web not programmed")
	}
	if allocs := testing.AllocsPerRun(100, func() { p.AppliedModel(webName) }); allocs != 0 {
		t.Errorf("AppliedModel allocates %v times, want 0 (no copy)", allocs)
	}
	p.DeleteService(webName)
	sync(false)
	if m := p.AppliedModel(webName); m != nil {
		t.Errorf("AppliedModel(ns/web) after its deletion = %+v", m)
	}
}

// TestFullSyncHook: Options.FullSync hears each full sync start and end (a failed one
// too), and no partial sync; the sync's work happens between the two.
func TestFullSyncHook(t *testing.T) {
	var events []string
	p, nft := newTestProxy(t, nil, func(o *Options) {
		o.FullSync = func() func() {
			events = append(events, "start")
			return func() { events = append(events, "end") }
		}
	})
	ctx := context.Background()
	p.UpdateService(service())
	for _, step := range []struct {
		name     string
		endpoint string
		fail     bool
		want     []string
	}{
		{"first sync (full)", "10.244.1.5", false, []string{"start", "end"}},
		{"partial sync", "10.244.1.6", false, nil},
		{"failed partial sync", "10.244.1.7", true, nil},
		{"full sync after the failure, failing", "10.244.1.8", true, []string{"start", "end"}},
		{"full sync after the failure", "10.244.1.9", false, []string{"start", "end"}},
	} {
		events = nil
		nft.fail.Store(step.fail)
		p.UpdateEndpointSlice(v4Slice("web-1", ep(step.endpoint, thisNodeName)))
		res, err := p.Sync(ctx, false)
		if (err != nil) != step.fail {
			t.Fatalf("%s: error %v", step.name, err)
		}
		if err == nil && res.Full != (step.want != nil) {
			t.Fatalf("%s: full = %v", step.name, res.Full)
		}
		if !slices.Equal(events, step.want) {
			t.Errorf("%s: hook events %v, want %v", step.name, events, step.want)
		}
	}
}

// TestFullSyncKeepsUnchangedModels: a full sync over Services that did not change keeps
// their applied models (the same pointers: one model per Service in memory while the
// tables are rebuilt, not two), while a changed Service gets its new model and is the
// only one reported as changed.
func TestFullSyncKeepsUnchangedModels(t *testing.T) {
	p, nft := newTestProxy(t, nil)
	ctx := context.Background()
	api := types.NamespacedName{Namespace: webName.Namespace, Name: "api"}
	apiSlice := func(ip string) *discoveryv1.EndpointSlice {
		s := v4Slice("api-1", ep(ip, thisNodeName))
		s.Labels[discoveryv1.LabelServiceName] = api.Name
		return s
	}
	p.UpdateService(service())
	p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.1.5", thisNodeName)))
	p.UpdateService(service(func(svc *corev1.Service) {
		svc.Name = api.Name
		svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "172.30.0.99", []string{"172.30.0.99"}
	}))
	p.UpdateEndpointSlice(apiSlice("10.244.1.6"))
	if _, err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	before := p.Applied()
	if before[webName] == nil || before[api] == nil {
		t.Fatalf("applied after the first sync: %v", before)
	}

	p.UpdateEndpointSlice(apiSlice("10.244.1.7"))
	res, err := p.Sync(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Full {
		t.Fatal("the forced sync was not full")
	}
	after := p.Applied()
	if after[webName] != before[webName] {
		t.Error("the unchanged Service's model was rebuilt and kept twice, not reused")
	}
	if after[api] == before[api] || !strings.Contains(nft.dump(), "10.244.1.7 . 8080") {
		t.Errorf("the changed Service kept its old model or rules:\n%s", nft.dump())
	}
	if len(res.Changed) != 1 || res.Changed[0].Name != api {
		t.Errorf("changed %+v, want only %v", res.Changed, api)
	}
}
