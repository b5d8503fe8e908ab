package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/tablestest"
	"github.com/shardproxy/shardproxy/test/testutil"
)

const testConfigYAML = oneInstanceYAML + `- name: team-a
  proxyNames: [team-a]
  slot: 1
  minSyncPeriod: 0s
  syncPeriod: 30s
  tenant:
    namespaces: [a, shop]
    externalIPCIDRs: [192.0.2.0/24]
- name: team-b
  proxyNames: [team-b]
  slot: 2
  minSyncPeriod: 0s
  syncPeriod: 30s
  maxServiceElements: 20
  tenant:
    namespaces: [b]
    loadBalancerCIDRs: [192.0.2.0/24]
`

// fakeTables hands out one knftables.Fake per table and can make one instance fail.
type fakeTables struct {
	mu    sync.Mutex
	fakes map[string]*knftables.Fake
	fail  string // table name whose transactions always fail
	// hang is a table name whose transactions, after the first of each family, block
	// until their context ends: an nft that never returns.
	hang string
	runs map[string]int
}

// hangingTable is fakeTables.hang's table: its first transaction runs, the next ones
// never return before their context ends.
type hangingTable struct {
	knftables.Interface
	fk  *knftables.Fake
	f   *fakeTables
	key string
}

func (h *hangingTable) Run(ctx context.Context, tx *knftables.Transaction) error {
	h.f.mu.Lock()
	if h.f.runs == nil {
		h.f.runs = map[string]int{}
	}
	h.f.runs[h.key]++
	n := h.f.runs[h.key]
	h.f.mu.Unlock()
	if n == 1 {
		return h.fk.Run(ctx, tx)
	}
	<-ctx.Done()
	return ctx.Err()
}

type failing struct{ *knftables.Fake }

func (failing) Run(context.Context, *knftables.Transaction) error {
	return errors.New("nft: simulated failure")
}

func (f *fakeTables) open(fam tables.Family, table string) (knftables.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := tablestest.Key(fam, table)
	fk := f.fakes[key]
	if fk == nil {
		fk = knftables.NewFake(tables.KnftFamily(fam), table)
		f.fakes[key] = fk
	}
	if table == f.fail {
		return failing{fk}, nil
	}
	if table == f.hang {
		return &hangingTable{Interface: fk, fk: fk, f: f, key: key}, nil
	}
	return fk, nil
}

// seed creates a table ("ip name", or "ip name # comment" for one with a comment)
// holding one chain, as if left by an earlier run or by someone else.
func (f *fakeTables) seed(t *testing.T, spec string) {
	t.Helper()
	key, comment, _ := strings.Cut(spec, " # ")
	fam, name, _ := strings.Cut(key, " ")
	fk := knftables.NewFake(knftables.Family(fam), name)
	tx := fk.NewTransaction()
	table := &knftables.Table{}
	if comment != "" {
		table.Comment = &comment
	}
	tx.Add(table)
	tx.Add(&knftables.Chain{Name: "left-over"})
	if err := fk.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fakes[key] = fk
}

// list is the ListTables seam: the tables of a family that exist, with their comments.
func (f *fakeTables) list(_ context.Context, fam tables.Family) ([]tables.ListedTable, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return tablestest.Listed(f.fakes, fam), nil
}

// dump returns a table's content, or "" if it does not exist yet.
func (f *fakeTables) dump(key string) string {
	f.mu.Lock()
	fk := f.fakes[key]
	f.mu.Unlock()
	if fk == nil {
		return ""
	}
	// Dump read-locks the fake itself; locking it here too would deadlock as soon as a
	// sync's Run waits for the write lock in between.
	return fk.Dump()
}

type fakeRecorder struct {
	mu     sync.Mutex
	events []string
	// panicOnce names a Service whose first event panics (a bug in node-wide code, run
	// on the reporting instance's goroutine).
	panicOnce string
}

func (r *fakeRecorder) Eventf(svc types.NamespacedName, eventType, reason, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.panicOnce != "" && svc.String() == r.panicOnce {
		r.panicOnce = ""
		panic("recorder exploded")
	}
	r.events = append(r.events, fmt.Sprintf("%s %s %s: %s", svc, eventType, reason, fmt.Sprintf(format, args...)))
}

func (r *fakeRecorder) NodeEventf(eventType, reason, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf("node %s %s: %s", eventType, reason, fmt.Sprintf(format, args...)))
}

func (r *fakeRecorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, "\n")
}

type fixture struct {
	t      *testing.T
	client *fake.Clientset
	tables *fakeTables
	rec    *fakeRecorder
	sup    *Supervisor
	ct     *conntrack.Fake
	// configPath is the watched configuration file (fixtureOptions.liveConfig), with
	// the servers on ports (healthz, metrics).
	configPath string
	ports      [2]int
}

func startSupervisor(t *testing.T, failTable string) *fixture {
	t.Helper()
	return startSupervisorWith(t, fixtureOptions{failTable: failTable})
}

// fixtureOptions change what startSupervisorWith starts.
type fixtureOptions struct {
	// failTable is a table name whose transactions always fail.
	failTable string
	// seed are tables ("ip name") that exist before the supervisor starts.
	seed []string
	// panicOnEvent is a Service (namespace/name) whose first event panics.
	panicOnEvent string
	// enableProfiling sets the configuration's enableProfiling.
	enableProfiling bool
	// legacyRules reads a legacy kube-proxy's rules; default: none programmed.
	legacyRules LegacyRules
	// configure changes the test configuration before it is validated.
	configure func(*config.Config)
	// metricsBindAddress replaces the metrics server's any-free-port address.
	metricsBindAddress string
	// configYAML replaces testConfigYAML; node replaces node-1 at 192.168.100.1.
	configYAML string
	node       *corev1.Node
	// logger receives the supervisor's log lines; default klog's.
	logger logr.Logger
	// serviceCIDRs, when set, makes the API serve ServiceCIDRs, with one object holding these.
	serviceCIDRs []string
	// noServiceCIDRDrop sets the configuration's serviceCIDRDrop to false.
	noServiceCIDRDrop bool
	// hcListener opens the health-check node ports (default: real sockets).
	hcListener healthcheck.Listener
	// interfaceAddrs are this host's addresses for CIDR nodePortAddresses (default: the
	// machine's own).
	interfaceAddrs []netip.Addr
	// hangTable is a table whose transactions after the first of each family hang.
	hangTable string
	// minRestartStuckAfter sets Deps.MinRestartStuckAfter.
	minRestartStuckAfter time.Duration
	// fullSync sets Deps.FullSync; objects are in the API before the supervisor starts.
	fullSync func() func()
	objects  []runtime.Object
	// apiEvents records events through the API (the supervisor's own recorder) instead
	// of fixture.rec.
	apiEvents bool
	// reactors are put before the clientset's own, before the supervisor starts (the
	// fake's reactor chain may not change while it is used).
	reactors []k8stesting.Reactor
	// liveConfig writes the configuration (with the test's bind addresses) to a file the
	// supervisor watches every 10 ms: fixture.configPath.
	liveConfig bool
	// addrs, when set, is this host's changing interface addresses (replaces
	// interfaceAddrs) and what reports their changes (Deps.AddrEvents); addrResync sets
	// Deps.AddrResync.
	addrs      *hostAddrsFake
	addrResync time.Duration
}

func startSupervisorWith(t *testing.T, opts fixtureOptions) *fixture {
	t.Helper()
	failTable := opts.failTable
	if opts.configYAML == "" {
		opts.configYAML = testConfigYAML
	}
	var configPath string
	var ports [2]int
	if opts.liveConfig {
		ports = [2]int{freePort(t), freePort(t)}
		opts.configYAML = liveConfigYAML(opts.configYAML, ports[0], ports[1])
		configPath = filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(configPath, []byte(opts.configYAML), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := config.Decode([]byte(opts.configYAML), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if opts.configure != nil {
		opts.configure(cfg)
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Any free ports: the tests talk to the handlers directly.
	if !opts.liveConfig {
		cfg.HealthzBindAddress, cfg.MetricsBindAddress = "127.0.0.1:0", "127.0.0.1:0"
	}
	if opts.metricsBindAddress != "" {
		cfg.MetricsBindAddress = opts.metricsBindAddress
	}
	cfg.EnableProfiling = opts.enableProfiling
	if opts.noServiceCIDRDrop {
		no := false
		cfg.ServiceCIDRDrop = &no
	}
	node := opts.node
	if node == nil {
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.100.1"}}}}
	}
	objects := append([]runtime.Object{node}, opts.objects...)
	if opts.serviceCIDRs != nil {
		objects = append(objects, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: opts.serviceCIDRs}})
	}
	f := &fixture{t: t, configPath: configPath, ports: ports, client: testutil.NewClientset(objects...), tables: &fakeTables{fakes: map[string]*knftables.Fake{}, fail: failTable, hang: opts.hangTable},
		rec: &fakeRecorder{panicOnce: opts.panicOnEvent}, ct: conntrack.NewFake()}
	f.client.ReactionChain = append(slices.Clone(opts.reactors), f.client.ReactionChain...)
	if opts.serviceCIDRs != nil {
		f.client.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1",
			APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}}}}
	}
	for _, key := range opts.seed {
		f.tables.seed(t, key)
	}
	if opts.legacyRules == nil {
		opts.legacyRules = func(context.Context) (map[string]legacy.ServiceRules, error) { return nil, nil }
	}
	var recorder Recorder = f.rec
	if opts.apiEvents {
		recorder = nil // New's default: the API's
	}
	f.sup, err = New(cfg, Deps{
		Client: f.client, NFT: f.tables.open, Conntrack: f.ct, Recorder: recorder,
		Sysctl:               func(string, string) error { return nil },
		ConntrackHashsize:    func(int) error { return nil },
		ListTables:           f.tables.list,
		LegacyRules:          opts.legacyRules,
		Logger:               opts.logger,
		HealthCheckListener:  opts.hcListener,
		InterfaceAddrs:       interfaceAddrs(opts.interfaceAddrs),
		AddrResync:           opts.addrResync,
		MinRestartStuckAfter: opts.minRestartStuckAfter,
		FullSync:             opts.fullSync,
		ConfigFile:           configPath,
		ConfigData:           []byte(opts.configYAML),
		ConfigPoll:           10 * time.Millisecond,
		RescopeTimeout:       3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if opts.addrs != nil {
		f.sup.deps.InterfaceAddrs, f.sup.tableConfigs.interfaceAddrs = opts.addrs.list, opts.addrs.list
		f.sup.deps.AddrEvents = opts.addrs.events
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := f.sup.Run(ctx); err != nil {
			t.Errorf("supervisor: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *fixture) createService(ns, name, proxyName, clusterIP string) {
	f.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if proxyName != "" {
		svc.Labels = map[string]string{selector.LabelServiceProxyName: proxyName}
	}
	if _, err := f.client.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	ready := true
	port := int32(8080)
	pname := "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port}},
	}
	if _, err := f.client.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), sl, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) relabel(ns, name, proxyName string) {
	f.t.Helper()
	svc, err := f.client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	svc.Labels = map[string]string{}
	if proxyName != "" {
		svc.Labels[selector.LabelServiceProxyName] = proxyName
	}
	if _, err := f.client.CoreV1().Services(ns).Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// waitTimeout bounds how long a test waits for the supervisor to act.
const waitTimeout = 10 * time.Second

func has(dump, ip string) bool { return strings.Contains(dump, "cluster-ips { "+ip+" }") }

func TestInstancesServeOnlyTheirServices(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("x", "plain", "", "172.30.0.1")
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	f.createService("b", "web-b", "team-b", "172.30.0.3")
	f.createService("x", "foreign", "some-other-proxy", "172.30.0.4")
	f.createService("x", "intruder", "team-b", "172.30.0.5") // team-b only accepts namespace b

	want := map[string]string{"default": "172.30.0.1", "team-a": "172.30.0.2", "team-b": "172.30.0.3"}
	for inst, ip := range want {
		key := "ip shardproxy-" + inst
		testutil.Eventually(t, waitTimeout, inst+" programs its Service", func() bool { return has(f.tables.dump(key), ip) })
	}
	for inst := range want {
		d := f.tables.dump("ip shardproxy-" + inst)
		for other, ip := range want {
			if other != inst && has(d, ip) {
				t.Errorf("%s's table holds %s's Service %s", inst, other, ip)
			}
		}
		for _, ip := range []string{"172.30.0.4", "172.30.0.5"} {
			if has(d, ip) {
				t.Errorf("%s's table holds %s, which no local instance may serve", inst, ip)
			}
		}
	}
	testutil.Eventually(t, waitTimeout, "a rejection event for the intruding Service", func() bool {
		return strings.Contains(f.rec.all(), "x/intruder Warning ServiceRejected")
	})
	// Counted once, under the instance whose namespace guard refused it, for the alert.
	if got := metricValue(t, f.sup, `shardproxy_guard_refusals_total{proxy_instance="team-b",guard="namespace"}`); got != "1" {
		t.Errorf("team-b's namespace guard refusals: %q, want 1", got)
	}
	// One watch per resource for the whole node, however many instances run (beside
	// the one of the API server's own EndpointSlice, reserved from user addresses).
	watches := map[string]int{}
	for _, a := range f.client.Actions() {
		if wa, ok := a.(k8stesting.WatchAction); ok && a.GetVerb() == "watch" &&
			wa.GetWatchRestrictions().Labels.String() != discoveryv1.LabelServiceName+"=kubernetes" {
			watches[a.GetResource().Resource]++
		}
	}
	for _, res := range []string{"services", "endpointslices", "nodes"} {
		if watches[res] != 1 {
			t.Errorf("%d watches on %s for 3 instances, want 1 (all: %v)", watches[res], res, watches)
		}
	}
	// Distinct priorities per instance.
	for inst, prio := range map[string]string{"default": "-67", "team-a": "-66", "team-b": "-65"} {
		if d := f.tables.dump("ip shardproxy-" + inst); !strings.Contains(d, "nat-prerouting { type nat hook prerouting priority "+prio+" ; }") {
			t.Errorf("%s does not hook DNAT at %s:\n%s", inst, prio, d)
		}
	}
}

func TestRelabelHandsServiceOver(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("a", "web", "team-a", "172.30.0.9")
	testutil.Eventually(t, waitTimeout, "team-a programs web", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.9") })

	f.relabel("a", "web", "") // to the default instance
	testutil.Eventually(t, waitTimeout, "default takes web over with its endpoints", func() bool {
		d := f.tables.dump("ip shardproxy-default")
		return has(d, "172.30.0.9") && strings.Contains(d, "10.244.1.2 . 8080")
	})
	testutil.Eventually(t, waitTimeout, "team-a lets go", func() bool { return !has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.9") })

	f.relabel("a", "web", "team-a") // and back
	testutil.Eventually(t, waitTimeout, "team-a takes it back", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.9") })
	testutil.Eventually(t, waitTimeout, "default lets go", func() bool { return !has(f.tables.dump("ip shardproxy-default"), "172.30.0.9") })

	f.relabel("a", "web", "unknown-proxy") // to nobody here
	testutil.Eventually(t, waitTimeout, "team-a lets go of a Service no local instance serves", func() bool {
		return !has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.9")
	})
	if got := metricValue(t, f.sup, `shardproxy_handovers_total{from="team-a",to="default"}`); got != "1" {
		t.Errorf("handover metric = %q", got)
	}
}

func TestFailingInstanceIsContained(t *testing.T) {
	f := startSupervisor(t, "shardproxy-team-b")
	f.createService("x", "plain", "", "172.30.0.1")
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	f.createService("b", "web-b", "team-b", "172.30.0.3")
	testutil.Eventually(t, waitTimeout, "default and team-a keep syncing", func() bool {
		return has(f.tables.dump("ip shardproxy-default"), "172.30.0.1") && has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2")
	})
	testutil.Eventually(t, waitTimeout, "health names the failing instance", func() bool {
		body := get(t, f.sup, "/status")
		return strings.Contains(body, `"team-b"`) && strings.Contains(body, "simulated failure")
	})
	if !f.sup.Health().Healthy("team-a") || !f.sup.Health().Healthy("default") {
		t.Error("healthy instances must stay healthy while another one fails")
	}
	if got := metricValue(t, f.sup, `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{proxy_instance="team-b",ip_family="IPv4"}`); got == "" || got == "0" {
		t.Errorf("sync failures of team-b not counted: %q", got)
	}
}

func get(t *testing.T, s *Supervisor, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = "127.0.0.1:40000" // /status answers loopback only
	s.countedHealth().ServeHTTP(rec, req)
	return rec.Body.String()
}

func metricValue(t *testing.T, s *Supervisor, series string) string {
	t.Helper()
	srv := httptest.NewServer(s.Metrics().Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	want := canonicalSeries(series)
	for _, line := range strings.Split(string(body), "\n") {
		if name, v, ok := strings.Cut(line, " "); ok && canonicalSeries(name) == want {
			return v
		}
	}
	return ""
}

// canonicalSeries sorts the labels of a series name{a="x",b="y"}, so that a selector
// written in any label order finds the scrape's (sorted by label name). Label values
// here carry no commas.
func canonicalSeries(series string) string {
	name, labels, ok := strings.Cut(strings.TrimSuffix(series, "}"), "{")
	if !ok {
		return series
	}
	pairs := strings.Split(labels, ",")
	slices.Sort(pairs)
	return name + "{" + strings.Join(pairs, ",") + "}"
}

// TestNetworkProgrammingLatency checks an EndpointSlice change carrying
// endpoints.kubernetes.io/last-change-trigger-time is observed, once, in kube-proxy's
// network programming histogram of the owning instance.
func TestNetworkProgrammingLatency(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	testutil.Eventually(t, waitTimeout, "team-a programs its Service", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2") })

	ctx := context.Background()
	sl, err := f.client.DiscoveryV1().EndpointSlices("a").Get(ctx, "web-a-abc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The trigger (a pod became ready) happened 300ms before the slice reached the API.
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
	time.Sleep(300 * time.Millisecond)
	sl.Endpoints[0].Addresses = []string{"10.244.1.9"}
	sl.ResourceVersion = "2"
	if _, err := f.client.DiscoveryV1().EndpointSlices("a").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	histogram := func(inst string) (count uint64, sum float64) {
		families, err := f.sup.Metrics().Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range families {
			if mf.GetName() != "kubeproxy_network_programming_duration_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				// The changed slice is IPv4: its latency is observed in that family.
				if labels["proxy_instance"] == inst && labels["ip_family"] == "IPv4" {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
		return 0, 0
	}
	testutil.Eventually(t, waitTimeout, "team-a observes the change's programming latency", func() bool { c, _ := histogram("team-a"); return c == 1 })
	if _, sum := histogram("team-a"); sum < 0.3 || sum > 10 {
		t.Errorf("observed latency %.3fs, want at least the 0.3s between the trigger and the update", sum)
	}
	if c, _ := histogram("default"); c != 0 {
		t.Errorf("the default instance observed %d latencies for a Service it does not own", c)
	}
}

// TestPanickingInstanceRestarts: a panic on one instance's loop restarts that instance
// (counted, named by /status while it is down) and nothing else; the others keep their
// rules and keep syncing.
func TestPanickingInstanceRestarts(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{panicOnEvent: "b/bad"})
	f.createService("x", "plain", "", "172.30.0.1")
	testutil.Eventually(t, waitTimeout, "default programs its Service", func() bool { return has(f.tables.dump("ip shardproxy-default"), "172.30.0.1") })
	// A Service with a malformed part makes team-b report an event, which panics.
	f.createService("b", "bad", "team-b", "172.30.0.3")
	svc, err := f.client.CoreV1().Services("b").Get(context.Background(), "bad", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The instance's model reports it (the dispatcher's guards never look at it).
	svc.Spec.SessionAffinity = "Bogus"
	if _, err := f.client.CoreV1().Services("b").Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "team-b restarted once", func() bool {
		return metricValue(t, f.sup, `shardproxy_instance_restarts_total{proxy_instance="team-b"}`) == "1"
	})
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	testutil.Eventually(t, waitTimeout, "team-a keeps syncing", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2") })
	testutil.Eventually(t, waitTimeout, "team-b is back with its Service", func() bool {
		return f.sup.Health().Healthy("team-b") && has(f.tables.dump("ip shardproxy-team-b"), "172.30.0.3")
	})
	for _, inst := range []string{"default", "team-a"} {
		if got := metricValue(t, f.sup, `shardproxy_instance_restarts_total{proxy_instance="`+inst+`"}`); got != "0" {
			t.Errorf("%s restarted %s times, want 0", inst, got)
		}
	}
	if !has(f.tables.dump("ip shardproxy-default"), "172.30.0.1") {
		t.Error("default's rules changed while team-b restarted")
	}
}

// TestProfilingOnMetricsServer: enableProfiling adds pprof beside /metrics; without it
// there is none.
func TestProfilingOnMetricsServer(t *testing.T) {
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, enabled := range []bool{false, true} {
		f := startSupervisorWith(t, fixtureOptions{enableProfiling: enabled})
		srv := httptest.NewServer(f.sup.metricsHandler())
		// The instances' series exist once they have synced: wait for that, not for time.
		testutil.Eventually(t, waitTimeout, "/metrics serves the instances' series", func() bool {
			code, body := get(srv.URL + "/metrics")
			return code == http.StatusOK && strings.Contains(body, "kubeproxy_")
		})
		code, body := get(srv.URL + "/debug/pprof/goroutine?debug=1")
		if served := code == http.StatusOK && strings.Contains(body, "goroutine profile: total"); served != enabled {
			t.Errorf("enableProfiling=%v: GET /debug/pprof/goroutine: %d, served=%v", enabled, code, served)
		}
		srv.Close()
	}
}

// TestNodeAddressesAreReserved: the supervisor tells the dispatcher this node's
// addresses, so a Service's externalIP equal to one is refused with a Warning event.
func TestNodeAddressesAreReserved(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("x", "plain", "", "172.30.0.1")
	svc, err := f.client.CoreV1().Services("x").Get(context.Background(), "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalIPs = []string{"192.168.100.1"} // the fixture Node's InternalIP
	if _, err := f.client.CoreV1().Services("x").Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "an AddressRefused event naming the node", func() bool {
		return strings.Contains(f.rec.all(), "AddressRefused: externalIP 192.168.100.1 refused: it is an address of this node")
	})
	// Counted when the refusal begins or changes: once or twice, as the node's
	// addresses arrive before or after the update (the instance's ranges refuse it
	// first).
	if got := metricValue(t, f.sup, `shardproxy_guard_refusals_total{proxy_instance="default",guard="address"}`); got != "1" && got != "2" {
		t.Errorf("default's address guard refusals: %q, want 1 or 2", got)
	}
}

// TestHolderKeepsAddressAcrossInstances: the Service serving an address keeps it, node-
// wide across instances: an older Service of another instance given it later (a
// load-balancer status written after the externalIP) is refused, and gets it once the
// holder lets go.
func TestHolderKeepsAddressAcrossInstances(t *testing.T) {
	f := startSupervisor(t, "")
	ctx := context.Background()
	svc := func(ns, name, proxy, clusterIP string, created time.Time) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name),
				CreationTimestamp: metav1.NewTime(created), Labels: map[string]string{selector.LabelServiceProxyName: proxy}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}}},
		}
	}
	// The fake API keeps no resource versions: each write here gives one, increasing, as
	// a real apiserver does.
	now := time.Now().Truncate(time.Second)
	old := svc("b", "old", "team-b", "172.30.0.60", now.Add(-time.Hour))
	old.ResourceVersion = "3"
	old, err := f.client.CoreV1().Services("b").Create(ctx, old, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	young := svc("a", "young", "team-a", "172.30.0.61", now)
	young.Spec.Type, young.Spec.Ports[0].NodePort = corev1.ServiceTypeClusterIP, 0
	young.Spec.ExternalIPs = []string{"192.0.2.5"}
	young.ResourceVersion = "5"
	young, err = f.client.CoreV1().Services("a").Create(ctx, young, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	teamA, teamB := "ip shardproxy-team-a", "ip shardproxy-team-b"
	testutil.Eventually(t, waitTimeout, "team-a serves the externalIP", func() bool {
		return strings.Contains(f.tables.dump(teamA), "192.0.2.5 . tcp . 80")
	})
	old.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.5"}}
	old.ResourceVersion = "9"
	if _, err := f.client.CoreV1().Services("b").UpdateStatus(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the older Service refused the address it was given later", func() bool {
		return strings.Contains(f.rec.all(), "b/old Warning AddressRefused: load-balancer IP 192.0.2.5 refused: a/young claimed it first")
	})
	if !strings.Contains(f.tables.dump(teamA), "192.0.2.5 . tcp . 80") || strings.Contains(f.tables.dump(teamB), "192.0.2.5") {
		t.Errorf("after the older Service asked for it, team-a:\n%s\nteam-b:\n%s\nwant the address in team-a's table only", f.tables.dump(teamA), f.tables.dump(teamB))
	}
	young.Spec.ExternalIPs = nil
	young.ResourceVersion = "12"
	if _, err := f.client.CoreV1().Services("a").Update(ctx, young, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "team-b serves the address once team-a lets go", func() bool {
		return strings.Contains(f.tables.dump(teamB), "192.0.2.5 . tcp . 80") && !strings.Contains(f.tables.dump(teamA), "192.0.2.5")
	})
}

// TestOtherNodesAddressesAreReserved: an externalIP or load-balancer IP equal to another
// Node's address (this node's pods would reach that node's kubelet or SSH at the
// Service's endpoints instead), or inside reservedCIDRs, is refused with a Warning event;
// the address is served once no Node has it any more.
func TestOtherNodesAddressesAreReserved(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{configure: func(c *config.Config) {
		c.ReservedCIDRs = []string{"198.51.100.0/24"}
		c.SharedTenants = true // every instance admits every externalIP
		for i := range c.Instances {
			c.Instances[i].Tenant.ExternalIPCIDRs = []string{"0.0.0.0/0"}
		}
	}})
	ctx := context.Background()
	node2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.31.0.2"}}}}
	if _, err := f.client.CoreV1().Nodes().Create(ctx, node2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.createService("x", "plain", "", "172.30.0.1")
	svc, err := f.client.CoreV1().Services("x").Get(ctx, "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalIPs = []string{"172.31.0.2", "198.51.100.7"}
	if _, err := f.client.CoreV1().Services("x").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"AddressRefused: externalIP 172.31.0.2 refused: it is an address of node node-2",
		"AddressRefused: externalIP 198.51.100.7 refused: it is inside the reserved CIDR 198.51.100.0/24 (reservedCIDRs)",
	} {
		testutil.Eventually(t, waitTimeout, want, func() bool { return strings.Contains(f.rec.all(), want) })
	}
	if dump := f.tables.dump("ip shardproxy-default"); strings.Contains(dump, "172.31.0.2") || strings.Contains(dump, "198.51.100.7") {
		t.Fatalf("a refused address is programmed:\n%s", dump)
	}
	node2.Status.Addresses[0].Address = "172.31.0.3"
	if _, err := f.client.CoreV1().Nodes().UpdateStatus(ctx, node2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "172.31.0.2 programmed once node-2 no longer has it", func() bool {
		return strings.Contains(f.tables.dump("ip shardproxy-default"), "172.31.0.2 . tcp . 80")
	})
}

// TestStalledSyncLoopIsStaleButNodeHealthy: an instance whose periodic full sync hangs in
// nft (nothing queued, so upstream's verdict never goes stale) shows as stale in /status,
// in /healthz's instances and in shardproxy_instance_stale; /healthz and /livez stay 200,
// since the other instances serve their tenants and a pod restart would stop them too.
// The supervisor restarts that instance alone instead (cancelling its context kills the
// hung nft), as it restarts a crashed one.
func TestStalledSyncLoopIsStaleButNodeHealthy(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{hangTable: "shardproxy-team-b", minRestartStuckAfter: time.Millisecond, configure: func(c *config.Config) {
		for i := range c.Instances {
			if c.Instances[i].Name == "team-b" {
				c.Instances[i].SyncPeriod = config.Duration{Duration: 100 * time.Millisecond}
				c.Instances[i].FullSyncPeriod = config.Duration{Duration: 100 * time.Millisecond}
			}
		}
	}})
	srv := httptest.NewServer(f.sup.countedHealth())
	defer srv.Close()
	metricsSrv := httptest.NewServer(f.sup.metricsHandler())
	defer metricsSrv.Close()
	var status healthcheck.StatusResponse
	seen := map[string]bool{}
	// The first restart waits out the loop's bound; a stuck loop is seen before it.
	testutil.Eventually(t, waitTimeout, "team-b stale with a stuck sync loop, then restarted for it", func() bool {
		code, body := httpGet(t, srv.URL+"/status")
		if code != http.StatusOK || json.Unmarshal([]byte(body), &status) != nil {
			return false
		}
		b := status.Instances["team-b"]
		if strings.Contains(b.Stale, "the sync loop is stuck") {
			seen["stale"] = true
			if b.Healthy || !b.Up {
				t.Errorf("team-b in /status: healthy %v, up %v while stale; want unhealthy and up", b.Healthy, b.Up)
			}
			for _, path := range []string{"/healthz", "/livez"} {
				code, body := httpGet(t, srv.URL+path)
				var resp healthcheck.HealthResponse
				if err := json.Unmarshal([]byte(body), &resp); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if code != http.StatusOK || !resp.Healthy {
					t.Errorf("GET %s: %d %s; want 200 and healthy", path, code, body)
				}
			}
			_, metrics := httpGet(t, metricsSrv.URL+"/metrics")
			seen["metric"] = seen["metric"] || strings.Contains(metrics, `shardproxy_instance_stale{proxy_instance="team-b"} 1`)
		}
		restarts, _ := strconv.Atoi(metricValue(t, f.sup, `shardproxy_instance_restarts_total{proxy_instance="team-b"}`))
		return seen["stale"] && seen["metric"] && restarts >= 1
	})
	for _, inst := range []string{"default", "team-a"} {
		if st := status.Instances[inst]; !st.Healthy || st.Stale != "" {
			t.Errorf("%s in /status: healthy %v, stale %q; want healthy", inst, st.Healthy, st.Stale)
		}
		if got := metricValue(t, f.sup, `shardproxy_instance_restarts_total{proxy_instance="`+inst+`"}`); got != "0" {
			t.Errorf("%s restarted %s times, want 0", inst, got)
		}
	}
}

// httpGet returns the status code and body of a GET.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// interfaceAddrs lists addrs as the host's addresses; nil leaves Deps' default.
func interfaceAddrs(addrs []netip.Addr) func() ([]netip.Addr, error) {
	if addrs == nil {
		return nil
	}
	return func() ([]netip.Addr, error) { return slices.Clone(addrs), nil }
}
