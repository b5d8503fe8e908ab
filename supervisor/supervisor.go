// Package supervisor is the per-node process: it runs the proxy instances side by side
// and owns everything node-wide, once: the API watches, the health servers, conntrack
// cleanup, metrics and the masquerade mark.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/servicecidr"
)

// Deps are the supervisor's side-effect seams; New fills what is left nil with the real
// thing, except Client, which is required.
type Deps struct {
	Client kubernetes.Interface
	// Version is shardproxy's version, for shardproxy_build_info; default: "unknown".
	Version string
	// FullSync is every instance's instance.Options.FullSync, also called around the
	// work that follows a full sync (conntrack cleanup); may be nil.
	FullSync func() (done func())
	// NFT opens one table; default: knftables on the host (tables.NewNFT).
	NFT func(fam tables.Family, table string) (knftables.Interface, error)
	// ElementsPerCommand is how many set elements one nft command carries; default, when
	// NFT is defaulted too: tables.MaxElementsPerCommand (the nft binary); otherwise 1.
	ElementsPerCommand int
	// Direct opens the applier of the partial syncs that need no rule text; default,
	// when NFT is defaulted too: netlink on the host (tables.NetlinkWriter). Nil after
	// defaulting: everything goes through NFT.
	Direct func(cfg tables.Config) (tables.Applier, error)
	// Conntrack is the kernel's conntrack table; default: netlink. A nil interface after
	// defaulting (netlink unavailable) disables conntrack cleanup with a log line.
	Conntrack conntrack.Interface
	// HealthCheckListener opens healthCheckNodePort servers on node addresses; default:
	// TCP sockets (healthcheck.TCPListener).
	HealthCheckListener healthcheck.Listener
	// Recorder records Kubernetes events; default: events through Client.
	Recorder Recorder
	// InterfaceAddrs lists the node's addresses (for CIDR nodePortAddresses); default: net.InterfaceAddrs.
	InterfaceAddrs func() ([]netip.Addr, error)
	// AddrEvents calls changed after each change of the node's interface addresses until
	// ctx ends (then it returns nil) or it fails; default, when InterfaceAddrs is
	// defaulted too: a netlink subscription in the supervisor's network namespace
	// (NetlinkAddrEvents). Nil after defaulting: the addresses are re-read every
	// AddrResync only.
	AddrEvents func(ctx context.Context, changed func()) error
	// AddrResync is how often the node's interface addresses are re-read without any
	// event (a missed one, or no AddrEvents); default 30 s, the default syncPeriod
	// (kube-proxy re-reads them at every sync).
	AddrResync time.Duration
	// Sysctl writes a sysctl; default: /proc/sys. Errors are logged, never fatal.
	Sysctl func(name, value string) error
	// ConntrackHashsize raises nf_conntrack's hash table to at least buckets (never
	// lowers it); default: /sys/module/nf_conntrack/parameters/hashsize. Errors are logged.
	ConntrackHashsize func(buckets int) error
	// NumCPU counts the node's CPUs for conntrack.maxPerCore; default: the online CPUs
	// of /sys (a container's CPU set may be smaller), else runtime.NumCPU.
	NumCPU func() int
	// ListTables lists the host's nftables tables of one family with their comments, to
	// find the tables of instances removed from the configuration; default: netlink
	// (tables.ListTables).
	ListTables func(ctx context.Context, fam tables.Family) ([]tables.ListedTable, error)
	// LegacyRules reads which Services a legacy kube-proxy programmed on the node, for
	// the node status during a rollback; default: its iptables or nftables rules (legacy.ProgrammedServices).
	LegacyRules LegacyRules
	// Logger receives the supervisor's and its instances' log lines; default klog's.
	Logger logr.Logger
	// Metrics is where the supervisor's series go; default a fresh metrics.New(). The
	// caller passes its own when something outside the supervisor feeds it too (the
	// API client's transport, see metrics.InstrumentTransport).
	Metrics *metrics.Metrics
	// ConfigFile is the file the configuration was read from and ConfigData its content
	// then. When set, Run reads the file every ConfigPoll (default 2 s) and applies a
	// changed instance set live (reload.go).
	ConfigFile string
	ConfigData []byte
	ConfigPoll time.Duration
	// RescopeTimeout bounds the wait for the initial lists of the watches a live change
	// starts (default 2 min); past it the change is refused and nothing changes.
	RescopeTimeout time.Duration
	// MinRestartStuckAfter, when set, replaces minRestartStuckAfter, the floor of how long
	// an instance's sync loop may finish no sync before the supervisor restarts it.
	MinRestartStuckAfter time.Duration
}

// Supervisor runs one node's instances.
type Supervisor struct {
	cfg     *config.Config
	deps    Deps
	logger  klog.Logger
	metrics *metrics.Metrics
	health  *healthcheck.ProxyHealth
	svcHC   *healthcheck.ServiceHealth
	watches *Watches
	// events is deps.Recorder when it is the API's own (not a test's), else nil.
	events *eventRecorder
	// tableConfigs maps the configuration to the instances' tables.
	tableConfigs tableConfigs
	// dispatcher is set in Run before any instance starts.
	dispatcher *selector.Dispatcher
	// slicesOf lists a Service's EndpointSlices from the watch; set in Run with watches.
	slicesOf selector.SliceLister

	// instancesMu guards the instance set, which a live configuration change replaces
	// (reload.go): the instances, their specs in the file's order, the router between
	// them and their supervised loops. cfg's node-wide fields never change.
	instancesMu sync.RWMutex
	instances   map[string]*instance.Proxy
	specs       map[string]config.Instance
	order       []config.Instance
	router      *selector.Router
	loops       map[string]*instanceLoop

	// conntrack cleans up conntrack flows after the instances' syncs; nil: disabled.
	conntrack *conntrack.Sweeper
	// changes counts the Service and EndpointSlice changes handed to each instance.
	changes *changeCounter
	// fullSyncs tracks the instances' first successful full syncs; once every instance
	// has had one, the tables of instances no longer configured are deleted.
	fullSyncs *firstFullSyncs

	nodeMu sync.Mutex
	node   *corev1.Node
	// nodeTablesMu serializes refreshNodeTables, so an older view never lands last.
	nodeTablesMu sync.Mutex
	// nodeChanged is closed (and replaced) when node changes.
	nodeChanged chan struct{}

	// legacy is the last reading of a legacy kube-proxy's rules (node status).
	legacy legacyCache

	// reservedMu serializes updateReserved.
	reservedMu sync.Mutex
	// otherNodes holds a pending "another Node's addresses changed" (capacity 1), so a
	// burst of them (the initial list of every Node) costs one updateReserved.
	otherNodes chan struct{}
	// nodeAddrsState is the published node address list's state last reported
	// (reportNodeAddresses); guarded by reservedMu.
	nodeAddrsState string
}

// withDefaults fills in the real system behind every seam a test leaves unset.
func (deps Deps) withDefaults(cfg *config.Config) Deps {
	if deps.NFT == nil {
		deps.NFT = tables.NewNFT
		if deps.ElementsPerCommand == 0 {
			deps.ElementsPerCommand = tables.MaxElementsPerCommand
		}
		if deps.Direct == nil {
			deps.Direct = func(cfg tables.Config) (tables.Applier, error) {
				return tables.NewNetlinkWriter(cfg)
			}
		}
	}
	if deps.InterfaceAddrs == nil {
		deps.InterfaceAddrs = hostAddrs
		if deps.AddrEvents == nil {
			deps.AddrEvents = NetlinkAddrEvents(netns.None())
		}
	}
	if deps.AddrResync <= 0 {
		deps.AddrResync = defaultAddrResync
	}
	if deps.Sysctl == nil {
		deps.Sysctl = writeSysctl
	}
	if deps.ConntrackHashsize == nil {
		deps.ConntrackHashsize = func(buckets int) error { return raiseHashsize(conntrackHashsizePath, buckets) }
	}
	if deps.NumCPU == nil {
		deps.NumCPU = func() int { return numCPU(onlineCPUsPath) }
	}
	if deps.ListTables == nil {
		deps.ListTables = tables.ListTables
	}
	if deps.Recorder == nil {
		deps.Recorder = newEventRecorder(deps.Client, cfg.NodeName)
	}
	if deps.LegacyRules == nil {
		deps.LegacyRules = hostLegacyRules
	}
	if deps.Logger.GetSink() == nil {
		deps.Logger = klog.Background()
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.New()
	}
	if deps.ConfigPoll <= 0 {
		deps.ConfigPoll = defaultConfigPoll
	}
	if deps.RescopeTimeout <= 0 {
		deps.RescopeTimeout = defaultRescopeTimeout
	}
	if deps.Version == "" {
		deps.Version = "unknown"
	}
	if deps.HealthCheckListener == nil {
		deps.HealthCheckListener = healthcheck.TCPListener{}
	}
	return deps
}

// New builds a supervisor from a validated configuration. Nothing runs before Run.
func New(cfg *config.Config, deps Deps) (*Supervisor, error) {
	if deps.Client == nil {
		return nil, errors.New("supervisor: no API client")
	}
	deps = deps.withDefaults(cfg)
	s := &Supervisor{
		cfg:       cfg,
		deps:      deps,
		logger:    deps.Logger.WithValues("node", cfg.NodeName),
		metrics:   deps.Metrics,
		instances: map[string]*instance.Proxy{},
		specs:     map[string]config.Instance{},
		order:     slices.Clone(cfg.Instances),
		loops:     map[string]*instanceLoop{},

		nodeChanged: make(chan struct{}),
		otherNodes:  make(chan struct{}, 1),
	}
	if r, ok := deps.Recorder.(*eventRecorder); ok {
		s.events = r // the API's: Run gives it the Services' UIDs and stops it
	}
	s.metrics.SetBuildInfo(deps.Version)
	s.tableConfigs = tableConfigs{cfg: cfg, interfaceAddrs: deps.InterfaceAddrs, logger: s.logger}
	s.changes = newChangeCounter(s.metrics)
	s.fullSyncs = newFirstFullSyncs(cfg.Instances)
	s.health = healthcheck.NewProxyHealth(nil, s.healthTimeout)
	s.svcHC = healthcheck.NewServiceHealth(deps.HealthCheckListener, deps.Recorder, s.health.Healthy)
	if deps.Conntrack == nil {
		ct, err := conntrack.New()
		if err != nil {
			s.logger.Error(err, "Conntrack is unavailable; stale UDP flows will not be cleaned up")
		} else {
			deps.Conntrack = ct
		}
	}
	if deps.Conntrack != nil {
		s.conntrack = conntrack.NewSweeper(conntrack.NewCleaner(deps.Conntrack), conntrackNode{services: s}, s.metrics, s.logger)
	}
	s.deps = deps

	router, specs, err := buildRouter(cfg)
	if err != nil {
		return nil, err
	}
	s.specs = specs
	s.router = router
	if deps.ConfigFile != "" {
		s.setConfigApplied(configHash(deps.ConfigData), time.Now(), "")
	}
	return s, nil
}

// buildRouter turns the instances' configuration into routing specs.
func buildRouter(cfg *config.Config) (*selector.Router, map[string]config.Instance, error) {
	var specs []selector.Spec
	byName := map[string]config.Instance{}
	for _, inst := range cfg.Instances {
		spec := selector.Spec{Name: inst.Name, Default: inst.Default, ProxyNames: inst.ProxyNames, Namespaces: inst.Tenant.Namespaces}
		for _, guard := range []struct {
			cidrs []string
			into  *[]netip.Prefix
		}{
			{inst.Tenant.ExternalIPCIDRs, &spec.ExternalIPCIDRs},
			{inst.Tenant.LoadBalancerCIDRs, &spec.LoadBalancerCIDRs},
		} {
			for _, c := range guard.cidrs {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					return nil, nil, fmt.Errorf("instance %q: tenant CIDR %q: %w", inst.Name, c, err)
				}
				*guard.into = append(*guard.into, p)
			}
		}
		specs = append(specs, spec)
		byName[inst.Name] = inst
	}
	router, err := selector.NewRouter(specs)
	return router, byName, err
}

// Metrics returns the supervisor's metrics (for tests and embedding).
func (s *Supervisor) Metrics() *metrics.Metrics { return s.metrics }

// Health returns the node health state.
func (s *Supervisor) Health() *healthcheck.ProxyHealth { return s.health }

// Instance returns a running instance by name (for tests).
// Safe to call while Run builds them.
func (s *Supervisor) Instance(name string) *instance.Proxy {
	s.instancesMu.RLock()
	defer s.instancesMu.RUnlock()
	return s.instances[name]
}

// spec returns an instance's configuration.
func (s *Supervisor) spec(name string) (config.Instance, bool) {
	s.instancesMu.RLock()
	defer s.instancesMu.RUnlock()
	spec, ok := s.specs[name]
	return spec, ok
}

// currentRouter is the router of the instance set in force.
func (s *Supervisor) currentRouter() *selector.Router {
	s.instancesMu.RLock()
	defer s.instancesMu.RUnlock()
	return s.router
}

// instanceSpecs are the configured instances, in the file's order.
func (s *Supervisor) instanceSpecs() []config.Instance {
	s.instancesMu.RLock()
	defer s.instancesMu.RUnlock()
	return slices.Clone(s.order)
}

// running returns the instances and their specs, a copy to range over without the lock.
func (s *Supervisor) running() (map[string]*instance.Proxy, map[string]config.Instance) {
	s.instancesMu.RLock()
	defer s.instancesMu.RUnlock()
	return maps.Clone(s.instances), maps.Clone(s.specs)
}

// Run starts everything and blocks until ctx is done. Rules stay in place when it
// returns: stopping the supervisor never interrupts traffic. Every goroutine it starts
// has ended when it returns.
func (s *Supervisor) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.events != nil {
		defer s.events.shutdown()
	}
	s.setConntrackSysctls()
	w, d, cidrDrop, err := s.wire(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		s.svcHC.Close()
		wg.Wait()
		w.Wait()
	}
	s.startServers(ctx, &wg, d)
	s.seedHoldings(ctx, d)
	if err := w.Start(ctx, 2*time.Minute); err != nil {
		stopped := ctx.Err() != nil
		stop()
		if stopped {
			return nil // stopped while waiting for the caches: not a failure
		}
		return err
	}
	// From here on a new claim on an address ranks after those already there.
	d.MarkListed()
	s.logger.Info("API caches filled; starting instances", "instances", len(s.instanceSpecs()))
	// Every Node's addresses are known: verdicts are final before any instance syncs.
	s.updateReserved()
	s.reportNodeAddresses()
	s.startLoops(ctx, &wg, w, cidrDrop)
	<-ctx.Done()
	stop()
	return nil
}

// wire builds what Run runs, none of it started: the watches, the instances (once this
// Node is read), the dispatcher between them and the ServiceCIDR drop.
func (s *Supervisor) wire(ctx context.Context) (*Watches, *selector.Dispatcher, *servicecidr.Keeper, error) {
	serviceCIDRs := serviceCIDRAPIAvailable(s.deps.Client)
	if !serviceCIDRs {
		s.logger.Info("The ServiceCIDR API is not served; continuing without it")
	}
	opts := WatchOptions{ServiceCIDRs: serviceCIDRs, OtherNodes: s.cfg.WatchesOtherNodes(), Logger: s.logger}
	if s.cfg.PublishedNodeAddresses() {
		opts.PublishedNodeAddresses = &types.NamespacedName{Namespace: s.cfg.StatusNamespace, Name: nodeaddrs.DefaultName}
	}
	w, err := NewWatches(s.deps.Client, s.cfg.NodeName, watchScope(s.cfg.Instances, serviceCIDRs), opts)
	if err != nil {
		return nil, nil, nil, err
	}
	s.watches = w
	s.slicesOf = w.SlicesOf
	if s.events != nil {
		s.events.setServiceUIDs(w.ServiceUID)
	}
	if *s.cfg.ReserveOtherNodeAddresses && !s.cfg.WatchesOtherNodes() {
		s.logger.Info("Not watching the other Nodes' addresses: no instance serves externalIPs or load-balancer IPs (tenant ranges)")
	}

	node := s.waitForNode(ctx)
	for _, spec := range s.cfg.Instances {
		p, err := s.newInstance(spec, node)
		if err != nil {
			return nil, nil, nil, err
		}
		s.instancesMu.Lock()
		s.instances[spec.Name] = p
		s.instancesMu.Unlock()
		s.listenHealthChecks(p)
		s.health.AddInstance(spec.Name)
		s.metrics.InitInstance(spec.Name)
	}
	sinks := map[string]selector.Sink{}
	for n, p := range s.instances {
		sinks[n] = &countingSink{Sink: p, instance: n, counter: s.changes}
	}
	d := selector.NewDispatcher(s.currentRouter(), sinks, w.SlicesOf, s.dispatcherEvents())
	s.dispatcher = d
	s.svcHC.SetOwnerLookup(d.Owner)
	cidrDrop := s.newServiceCIDRDrop(serviceCIDRs)
	onServiceCIDRs := s.updateReserved
	if cidrDrop != nil {
		onServiceCIDRs = func() { s.updateReserved(); cidrDrop.Changed() }
	}
	if err := w.Connect(d, s.onNode, onServiceCIDRs, s.otherNodesChanged, s.updateReserved); err != nil {
		return nil, nil, nil, err
	}
	return w, d, cidrDrop, nil
}

// dispatcherEvents turns the dispatcher's notifications into metrics, log lines and
// Events.
func (s *Supervisor) dispatcherEvents() selector.Events {
	return selector.Events{
		Handover: func(svc types.NamespacedName, from, to string) {
			if from != "" && to != "" {
				s.metrics.Handover(from, to)
				s.logger.Info("Service handed over", "service", svc, "from", from, "to", to)
			}
		},
		Rejected: func(svc *corev1.Service, why string) {
			// Route is pure: routing the Service again names the instances that refused it.
			for _, inst := range s.currentRouter().Route(svc).RejectedBy {
				s.metrics.GuardRefused(inst, metrics.GuardNamespace)
			}
			s.deps.Recorder.Eventf(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, corev1.EventTypeWarning, "ServiceRejected", "%s", why)
		},
		Guarded: func(svc *corev1.Service, inst string, problems []string) {
			name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
			s.logger.Info("Service addresses refused", "instance", inst, "service", name, "problems", problems)
			s.metrics.GuardRefused(inst, metrics.GuardAddress)
			for _, p := range problems {
				s.deps.Recorder.Eventf(name, corev1.EventTypeWarning, "AddressRefused", "%s", p)
			}
		},
	}
}

// startServers starts, before the caches fill, what answers from the start: the node
// status publisher, the health-check node port retries, /healthz and /metrics.
func (s *Supervisor) startServers(ctx context.Context, wg *sync.WaitGroup, d *selector.Dispatcher) {
	if s.cfg.StatusNamespace != config.StatusDisabled {
		pub := &migrate.Publisher{Client: s.deps.Client, Namespace: s.cfg.StatusNamespace, Node: s.cfg.NodeName,
			Source: func() migrate.NodeStatus { return s.nodeStatus(d) },
			// Heartbeats only while a migration needs them: at 5,000 nodes, one Get and
			// one Update every 30 s each were ~333 requests/s in steady state.
			Heartbeat: migrate.NodeStatus.Migrating}
		wg.Go(func() { pub.Run(ctx) })
	}
	wg.Go(func() { s.retryHealthChecks(ctx, healthCheckRetryInterval) })
	serve := func(name, addr, reason string, h http.Handler) {
		wg.Go(func() {
			if err := s.serveRetrying(ctx, name, addr, reason, h); err != nil && ctx.Err() == nil {
				s.logger.Error(err, "Server failed", "server", name)
			}
		})
	}
	serve("healthz", s.cfg.HealthzBindAddress, reasonFailedToStartHealthz, s.countedHealth())
	serve("metrics", s.cfg.MetricsBindAddress, reasonFailedToStartMetrics, s.metricsHandler())
}

// startLoops starts, once the caches are full, the node-wide loops and the instances:
// the other Nodes' addresses, the ServiceCIDR drop, the slice audit, then (after taking
// over the tables of an earlier run) one supervised loop per instance, and the deletion
// of unconfigured instances' tables once every instance has had a full sync.
func (s *Supervisor) startLoops(ctx context.Context, wg *sync.WaitGroup, w *Watches, cidrDrop *servicecidr.Keeper) {
	wg.Go(func() { s.runOtherNodes(ctx) })
	wg.Go(func() { s.runInterfaceAddrs(ctx, wg) })
	wg.Go(func() { s.runServiceCIDRDrop(ctx, cidrDrop) })
	wg.Go(func() { s.auditSlices(ctx, w) })
	s.takeOverTables(ctx)
	instances, _ := s.running()
	for _, name := range slices.Sorted(maps.Keys(instances)) {
		s.startInstance(ctx, wg, instances[name])
	}
	if s.deps.ConfigFile != "" {
		wg.Go(func() { s.watchConfig(ctx, wg) })
	}
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-s.fullSyncs.done:
			s.deleteUnconfiguredTables(ctx)
		}
	})
}

// superviseInstance runs one instance and restarts it with backoff if it panics, so one
// instance's failure never stops the others.
func (s *Supervisor) superviseInstance(ctx context.Context, p *instance.Proxy) {
	logger := s.logger.WithValues("instance", p.Name())
	if !s.waitForPodCIDRs(ctx, p.Name()) {
		return
	}
	backoff := restartBackoff()
	for {
		s.metrics.SetInstanceUp(p.Name(), true)
		s.health.SetInstanceUp(p.Name(), true, "")
		err := s.runWatched(ctx, p)
		if ctx.Err() != nil {
			return
		}
		delay := backoff.Step()
		logger.Error(err, "Instance stopped; restarting", "backoff", delay)
		s.metrics.SetInstanceUp(p.Name(), false)
		s.metrics.InstanceRestarted(p.Name())
		s.health.SetInstanceUp(p.Name(), false, err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

// restartBackoff spaces the restarts of a failing instance: from 1 s, doubling, with
// jitter so that the instances of many nodes hit by one bad object do not restart in
// step, up to a minute.
func restartBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: time.Minute}
}

// runWatched runs p until ctx ends or p stops, and stops it when its sync loop has
// finished no sync for restartStuckAfter (it is stale, stuck, well before): cancelling
// its context kills a hung nft, and the caller restarts it like a crashed one. Only this
// instance restarts: restarting the pod for it (a failing /livez) would stop every other
// tenant's too.
func (s *Supervisor) runWatched(ctx context.Context, p *instance.Proxy) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runContained(runCtx, p) }()
	after := s.restartStuckAfter(p.Name())
	tick := time.NewTicker(after / 8)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			idle := s.health.Idle(p.Name())
			if idle < after {
				continue
			}
			s.logger.Info("Stopping an instance whose sync loop is stuck, to restart it",
				"instance", p.Name(), "idle", idle.Round(time.Millisecond), "bound", after)
			cancel()
			err := <-done
			return errors.Join(fmt.Errorf("sync loop stuck: no sync finished for %s (bound %s), stopped", idle.Round(time.Millisecond), after), err)
		}
	}
}

// minRestartStuckAfter is the least time an instance's sync loop may finish no sync
// before the supervisor restarts it: a full sync of a very large instance may be slow
// without being stuck, and killing it each time would never let it finish.
const minRestartStuckAfter = 5 * time.Minute

// restartStuckAfter is how long inst's sync loop may finish no sync before the supervisor
// restarts it: twice the time after which it shows as stuck, at least
// minRestartStuckAfter (or Deps.MinRestartStuckAfter).
func (s *Supervisor) restartStuckAfter(inst string) time.Duration {
	floor := minRestartStuckAfter
	if s.deps.MinRestartStuckAfter > 0 {
		floor = s.deps.MinRestartStuckAfter
	}
	return max(2*healthcheck.StuckFactor*s.healthTimeout(inst), floor)
}

// healthTimeout is how long an instance's queued update may wait before it is stale:
// upstream's twice the sync period.
func (s *Supervisor) healthTimeout(inst string) time.Duration {
	if spec, ok := s.spec(inst); ok && spec.SyncPeriod.Duration > 0 {
		return 2 * spec.SyncPeriod.Duration
	}
	return healthcheck.DefaultHealthTimeout
}

func runContained(ctx context.Context, p *instance.Proxy) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	if err := p.Run(ctx); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return errors.New("instance loop returned")
	}
	return nil
}

// listenHealthChecks sets where instance p's health-check node ports listen: where it
// serves NodePorts, as upstream's. It is called once the instance is in the running
// set, so that an instance built for a change that is then refused moves nothing.
func (s *Supervisor) listenHealthChecks(p *instance.Proxy) {
	s.svcHC.SetInstanceAddrs(p.Name(), p.NodePortIPs())
}

// newInstance builds one instance from its configuration and this node, with no side
// effect outside it.
func (s *Supervisor) newInstance(spec config.Instance, node *corev1.Node) (*instance.Proxy, error) {
	opts := instanceOptions(spec, s.tableConfigs.forInstance(spec, node), s.cfg.NodeName, node)
	opts.Logger = s.deps.Logger
	opts.NFT = s.deps.NFT
	opts.Direct = s.deps.Direct
	opts.ElementsPerCommand = s.deps.ElementsPerCommand
	opts.Observer = s.newObserver()
	opts.FullSync = s.deps.FullSync
	return instance.New(opts)
}

// instanceOptions are the settings of spec's instance that come from the configuration
// and the node (tables, sync periods, size limits, load balancing), the same for a running
// instance and Render's; the caller adds how it reaches nftables and who hears of it.
func instanceOptions(spec config.Instance, tc tables.Config, nodeName string, node *corev1.Node) instance.Options {
	minSync := time.Duration(0)
	if spec.MinSyncPeriod != nil {
		minSync = spec.MinSyncPeriod.Duration
	}
	return instance.Options{
		Name:               spec.Name,
		Tables:             tc,
		MinSyncPeriod:      minSync,
		SyncPeriod:         spec.SyncPeriod.Duration,
		FullSyncPeriod:     spec.FullSyncPeriod.Duration,
		MaxServiceElements: spec.MaxServiceElements,
		MaxInstanceCost:    spec.MaxInstanceCost,
		LoadBalancing:      loadBalancing(spec),
		Node:               nodeInfo(nodeName, node),
	}
}

// waitForNode reads this Node once before the instances start (addresses, pod CIDRs),
// retrying for up to 30 s (nodeBackoff); later changes arrive through the watch.
func (s *Supervisor) waitForNode(ctx context.Context) *corev1.Node {
	deadline := time.Now().Add(30 * time.Second)
	backoff := nodeBackoff()
	for {
		n, err := s.deps.Client.CoreV1().Nodes().Get(ctx, s.cfg.NodeName, metav1GetOptions)
		if err == nil {
			s.setNode(n)
			return n
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.logger.Error(err, "Could not read this Node; NodePorts wait for its addresses")
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff.Step()):
		}
	}
}

// nodeBackoff spaces the reads of this Node at start: from 250 ms, doubling up to 4 s,
// with jitter so that the supervisors of many nodes started together (a DaemonSet
// rollout) do not retry in step while the API server is down.
func nodeBackoff() wait.Backoff {
	return wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 4 * time.Second}
}

// onNode reacts to this Node changing: topology labels, addresses, pod CIDRs, deletion
// and the autoscaler's deletion taint.
func (s *Supervisor) onNode(node *corev1.Node, deleted bool) {
	s.health.SetNodeDeleting(deleted || node.DeletionTimestamp != nil)
	s.health.SetNodeToBeDeleted(!deleted && slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == healthcheck.ToBeDeletedTaint
	}))
	if deleted {
		return
	}
	s.setNode(node)
	s.updateReserved()
	instances, _ := s.running()
	for _, p := range instances {
		p.SetNode(nodeInfo(s.cfg.NodeName, node))
	}
	s.refreshNodeTables()
}

// refreshNodeTables recomputes every running instance's node-dependent table settings
// (NodePort addresses, node IPs, pod CIDRs) from this Node and the node's interface
// addresses, and reconfigures the instances whose settings changed, moving their
// health-check node ports along. An instance whose settings stay as they are is left
// alone: no full sync (instance.Proxy.Reconfigure). Calls are serialized and each reads
// the newest Node and addresses. When the interfaces cannot be listed, the instances
// with CIDR nodePortAddresses keep the addresses they have.
func (s *Supervisor) refreshNodeTables() {
	s.nodeTablesMu.Lock()
	defer s.nodeTablesMu.Unlock()
	s.nodeMu.Lock()
	node := s.node
	s.nodeMu.Unlock()
	addrs := sync.OnceValues(s.deps.InterfaceAddrs)
	instances, specs := s.running()
	for _, name := range slices.Sorted(maps.Keys(instances)) {
		spec := specs[name]
		if err := instances[name].Reconfigure(func(cfg *tables.Config) {
			before := cfg.NodePortIPs
			s.tableConfigs.applyNode(spec, node, addrs, cfg)
			if !slices.Equal(before, cfg.NodePortIPs) {
				s.logger.Info("NodePort addresses changed", "instance", name, "from", before, "to", cfg.NodePortIPs)
				s.svcHC.SetInstanceAddrs(name, cfg.NodePortIPs)
			}
		}); err != nil {
			s.logger.Error(err, "Reconfiguring instance for new node addresses", "instance", name)
		}
	}
}

// defaultAddrResync is Deps.AddrResync's default.
const defaultAddrResync = 30 * time.Second

// runInterfaceAddrs follows the node's interface addresses until ctx ends: after every
// change AddrEvents reports, and every AddrResync in any case, it re-reads them, updates
// the reserved addresses if they changed, and reconfigures the instances whose CIDR
// nodePortAddresses now match other addresses (refreshNodeTables). So an address added
// later (a DHCP renumbering, a keepalived VIP, a new NIC) serves NodePorts without a
// restart, as kube-proxy's re-reading at every sync does. A burst of events costs one re-read or
// two. A failed subscription is retried with backoff, with a re-read after each retry
// (events may have been missed meanwhile).
func (s *Supervisor) runInterfaceAddrs(ctx context.Context, wg *sync.WaitGroup) {
	changed := make(chan struct{}, 1)
	notify := func() {
		select {
		case changed <- struct{}{}:
		default: // one is pending already
		}
	}
	if s.deps.AddrEvents != nil {
		wg.Go(func() {
			backoff := restartBackoff()
			for ctx.Err() == nil {
				err := s.deps.AddrEvents(ctx, notify)
				if ctx.Err() != nil {
					return
				}
				delay := backoff.Step()
				s.logger.Error(err, "Following the node's address changes failed; retrying (meanwhile they are re-read periodically)",
					"backoff", delay, "resync", s.deps.AddrResync)
				select {
				case <-ctx.Done():
					return
				case <-time.After(delay):
				}
				notify()
			}
		})
	}
	tick := time.NewTicker(s.deps.AddrResync)
	defer tick.Stop()
	var last []netip.Addr
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
		// The reserved addresses are recomputed (every Node's, at a cost that grows with
		// the cluster) only when this node's addresses did change.
		if addrs, err := s.deps.InterfaceAddrs(); err == nil {
			slices.SortFunc(addrs, netip.Addr.Compare)
			if !slices.Equal(addrs, last) {
				last = addrs
				s.updateReserved()
			}
		}
		s.refreshNodeTables()
	}
}

// otherNodesChanged notes that another Node's addresses changed, for runOtherNodes.
func (s *Supervisor) otherNodesChanged() {
	select {
	case s.otherNodes <- struct{}{}:
	default: // one is pending already
	}
}

// runOtherNodes updates the reserved addresses after other Nodes' changes until ctx
// ends.
func (s *Supervisor) runOtherNodes(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.otherNodes:
			s.updateReserved()
			s.reportNodeAddresses()
		}
	}
}

// reportNodeAddresses puts the published node address list's state (when the node reads
// one) in /status and the metrics, and logs each change of state once: an absent or
// unreadable list leaves the last one read in force, so a Node added meanwhile has its
// addresses unreserved here until the list is back.
func (s *Supervisor) reportNodeAddresses() {
	st, ok := s.watches.PublishedNodeAddresses()
	if !ok {
		return
	}
	s.health.SetNodeAddresses(st)
	s.metrics.SetPublishedNodeAddresses(st.ConfigMap, st.State == publishedOK, st.Nodes)
	s.reservedMu.Lock()
	last := s.nodeAddrsState
	s.nodeAddrsState = st.State
	s.reservedMu.Unlock()
	if st.State == last {
		return
	}
	switch st.State {
	case publishedOK:
		s.logger.Info("Reading the other Nodes' addresses from the published list", "configMap", st.ConfigMap, "nodes", st.Nodes)
	default:
		s.logger.Error(errors.New(st.Error), "The published node address list is not usable; the last list read stays reserved, "+
			"and Nodes added since are not (is `shardproxy node-addresses` running?)",
			"state", st.State, "configMap", st.ConfigMap, "nodes", st.Nodes)
	}
}

// updateReserved tells the dispatcher the addresses no Service's user-set addresses may
// take: this node's (its Node object's and its interfaces'), the other Nodes', the
// ServiceCIDRs, the pod CIDRs, the operator's reservedCIDRs and the API server's
// endpoints.
//
// The Node and ServiceCIDR handlers run on their own goroutines: reservedMu makes each
// call read and hand over the addresses as one step, so an older view never lands last.
func (s *Supervisor) updateReserved() {
	if s.dispatcher == nil || s.watches == nil {
		return
	}
	s.reservedMu.Lock()
	defer s.reservedMu.Unlock()
	s.nodeMu.Lock()
	node := s.node
	s.nodeMu.Unlock()
	host, err := s.deps.InterfaceAddrs()
	if err != nil {
		s.logger.Error(err, "Listing this node's addresses for the address precedence")
	}
	r := reservedAddresses(s.cfg, node, host, s.watches.ServiceCIDRs(), s.watches.OtherNodeIPs())
	r.APIServerIPs = s.watches.APIServerIPs()
	s.dispatcher.SetReserved(r)
}

func nodeInfo(name string, node *corev1.Node) instance.NodeInfo {
	info := instance.NodeInfo{Name: name}
	if node != nil {
		info.Labels = node.Labels
	}
	return info
}

// countedHealth wraps the health handler to count answers in the kube-proxy metrics.
func (s *Supervisor) countedHealth() http.Handler {
	h := s.health.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		switch r.URL.Path {
		case "/healthz":
			s.metrics.HealthzResult(rec.code)
		case "/livez":
			s.metrics.LivezResult(rec.code)
		}
	})
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// serveHTTP serves h on addr until ctx is done.

// metricsHandler serves /metrics and, with enableProfiling, Go's pprof handlers.
func (s *Supervisor) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	metricsHandler := s.metrics.Handler()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		// Staleness grows with time alone, no event sets it: read it at scrape time.
		for inst, why := range s.health.Stale() {
			s.metrics.SetInstanceStale(inst, why != "")
		}
		metricsHandler.ServeHTTP(w, r)
	})
	if !s.cfg.EnableProfiling {
		return mux
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// nodeStatus is what this node reports for `shardproxy migrate`: its instances, the
// Services each has programmed in shadow, and which of those their label's proxy has
// programmed here.
func (s *Supervisor) nodeStatus(d *selector.Dispatcher) migrate.NodeStatus {
	st := migrate.NodeStatus{Instances: map[string]migrate.InstanceStatus{}}
	shadows := d.Shadows()
	handed := s.handedBack(d, shadows)
	health := s.health.Status().Instances
	for _, in := range s.instanceSpecs() {
		is := migrate.InstanceStatus{Default: in.Default, ProxyNames: in.ProxyNames}
		// Health in words that hold while the fault does, and the last sync coarse while
		// healthy: the status is rewritten on change, not on every sync.
		if h, ok := health[in.Name]; ok {
			is.Failing = migrate.FailingReason(h.Healthy, h.Up, h.DownReason, h.LastError, h.LastQueued)
			is.LastSync = migrate.PublishedSync(s.cfg.NodeName, h.LastUpdated, is.Failing != "")
		}
		for _, n := range shadows[in.Name] {
			is.Shadow = append(is.Shadow, n.String())
			if handed[n] {
				is.HandedBack = append(is.HandedBack, n.String())
			}
		}
		slices.Sort(is.Shadow)
		slices.Sort(is.HandedBack)
		st.Instances[in.Name] = is
	}
	st.Holdings = d.Holdings()
	if len(st.Holdings) > migrate.MaxHoldings {
		st.Holdings = st.Holdings[:migrate.MaxHoldings]
	}
	return st
}

// seedHoldings gives the Dispatcher, before the initial lists, the holders of contested
// addresses that a sample of node statuses reports (this node's own from before a
// restart among them), so that it ranks the claims it is about to see all at once as
// the nodes that watched them arrive do. Without statuses it ranks them by age.
func (s *Supervisor) seedHoldings(ctx context.Context, d *selector.Dispatcher) {
	if s.cfg.StatusNamespace == config.StatusDisabled {
		return
	}
	statuses, err := migrate.ReadStatusSample(ctx, s.deps.Client, s.cfg.StatusNamespace, migrate.SeedSample)
	if err != nil {
		s.logger.Error(err, "Reading node statuses for the address holders failed; contested addresses present at start go to the oldest Service")
		return
	}
	if hs := migrate.SeedHoldings(statuses); len(hs) > 0 {
		s.logger.Info("Seeded address holders from node statuses", "holdings", len(hs), "statuses", len(statuses))
		d.SeedHoldings(hs)
	}
}

// healthCheckRetryInterval is how often health-check node ports that could not be bound
// are tried again between syncs.
const healthCheckRetryInterval = 5 * time.Second

// retryHealthChecks retries unbound health-check node ports until ctx ends: a port
// another process held (a legacy kube-proxy that just let go of a migrated Service) opens
// within seconds, not at the owner's next periodic sync.
func (s *Supervisor) retryHealthChecks(ctx context.Context, every time.Duration) {
	runEvery(ctx, every, func() {
		s.svcHC.RetryFailed()
		s.reportUnboundHealthChecks()
	})
}

// runEvery calls f every interval until ctx is done.
func runEvery(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
