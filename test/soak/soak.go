// Package soak is `make soak`: the real `shardproxy run` with three instances on the
// test control plane (test/e2e/env), ~1,000 Services under a random, seeded stream of
// changes, and faults injected on their own schedules (kube-apiserver restarts, watches
// expired by etcd compaction, kill -9 in the middle of a full sync, tables, chains and
// elements broken by hand, nft and netlink failing, a full conntrack table). At quiescent
// checkpoints it asserts that every instance's tables in the kernel equal what
// `shardproxy render` makes of the API's current objects; it counts the probes of
// steady Services that nothing changes, which must never fail; and it follows every
// instance's full syncs through the supervisor's metrics, none of which may come later
// than twice fullSyncPeriod after the last.
package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Options configure a soak.
type Options struct {
	// RepoRoot is the repository (deploy/ and the binary's source).
	RepoRoot string
	// WorkDir holds the configuration, logs, the nft wrapper and rendered objects.
	WorkDir string
	// Duration is how long changes and faults run, after the set-up.
	Duration time.Duration
	// Seed seeds every random choice; the same seed replays the same changes and fault
	// schedule (their interleaving with the kernel differs).
	Seed uint64
	// Services is how many churned Services exist at a time, about.
	Services int
	// Rate is how many changes per second the churn makes.
	Rate float64
	// CheckpointEvery is the time between checkpoints; one more runs at the end.
	CheckpointEvery time.Duration
	// FaultsPerKind is how many times each kind of fault is injected.
	FaultsPerKind int
	// Faults are the kinds of fault to inject (default: all of them), for working on one.
	Faults []string
	// Logf prints progress; every line the soak prints carries a timestamp.
	Logf func(format string, args ...any)
}

// Config of the soak's supervisor.
const (
	fullSyncPeriod = 30 * time.Second
	// instancesConfig: the default instance serves the steady Services (namespace
	// soak-steady) and unlabeled churn; each team admits its own namespaces and has its
	// own external and load-balancer ranges (addressRanges). A periodic full sync rides on
	// the first sync after fullSyncPeriod, which may come syncPeriod after the last
	// partial one: full syncs come within fullSyncPeriod + syncPeriod + a sync. At the
	// default syncPeriod (30s) that is just over the full-sync watch's limit (2 ×
	// fullSyncPeriod) whenever an instance falls idle right before its full sync is due
	// (a 2-minute soak came within 9s of it); syncPeriod 15s leaves a margin.
	instancesConfig = `
- name: default
  default: true
  slot: 0
  minSyncPeriod: 250ms
  syncPeriod: 15s
  fullSyncPeriod: 30s
  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/48"]}
  tenant: {externalIPCIDRs: [100.64.0.0/16], loadBalancerCIDRs: [100.65.0.0/16]}
- name: team-a
  proxyNames: [team-a]
  slot: 1
  minSyncPeriod: 250ms
  syncPeriod: 15s
  fullSyncPeriod: 30s
  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.244.0.0/16, "fd00:10:244::/48"]}
  tenant:
    namespaces: [soak-a, soak-ab]
    externalIPCIDRs: [100.66.0.0/16, "fd00:66::/64"]
    loadBalancerCIDRs: [100.67.0.0/16]
- name: team-b
  proxyNames: [team-b]
  slot: 2
  minSyncPeriod: 250ms
  syncPeriod: 15s
  fullSyncPeriod: 30s
  detectLocal: {mode: InterfaceNamePrefix, interfaceNamePrefix: vpod}
  tenant:
    namespaces: [soak-b, soak-ab]
    externalIPCIDRs: [100.68.0.0/16]
    loadBalancerCIDRs: [100.69.0.0/16, "fd00:69::/64"]
`
)

// Steady Services' traffic.
const (
	steadyNamespace = "soak-steady"
	steadyNodeIP    = netns.NodeIPv4
)

var dialOnce = netns.DialOptions{Timeout: 2 * time.Second}

// soak is one run.
type soak struct {
	opts      Options
	e         *env.Env
	ctl, dir  string
	check     *checker
	probes    *prober
	churn     *churn
	instances []string
	inject    *injector
	res       resources
	// syncs follows every instance's full syncs; stopSyncs stops its reading of /metrics.
	syncs     *fullSyncWatch
	stopSyncs func()

	// steadyIPs are the steady Services' cluster IPs; steadyNodePort their NodePort.
	steadyIPs      map[string]bool
	steadyNodePort int32

	// quiesce: changes and faults hold it shared; a checkpoint holds it alone.
	quiesce sync.RWMutex
	// watchFaults serializes the faults that cut the supervisor's watches (an apiserver
	// restart, watch expiry, kill -9): one would moot another (a restarted supervisor
	// has no watch to expire).
	watchFaults sync.Mutex

	mu     sync.Mutex
	faults map[string]int
	// noEffect counts the faults that changed nothing (errNoEffect), by kind.
	noEffect    map[string]int
	faultErrors []string
	fullSyncs   FullSyncs
	checkpoints []checkpointResult
	start       time.Time
}

// Run runs a soak and returns its summary; the error is for a soak that could not run.
// The summary says whether it passed.
func Run(ctx context.Context, opts Options) (*Summary, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &soak{opts: opts, instances: []string{"default", "team-a", "team-b"}, faults: map[string]int{}, noEffect: map[string]int{}, steadyIPs: map[string]bool{}}
	s.inject = &injector{s: s}
	s.syncs = newFullSyncWatch(2*fullSyncPeriod, s.instances, s.logf)
	s.stopSyncs = func() {}
	s.ctl = filepath.Join(opts.WorkDir, "ctl")
	s.dir = opts.WorkDir
	if err := os.MkdirAll(s.ctl, 0o755); err != nil {
		return nil, err
	}
	e, err := s.setUp(ctx)
	if e != nil {
		defer func() {
			if err := e.Close(); err != nil {
				s.logf("cleanup: %v", err)
			}
		}()
	}
	defer func() { s.stopSyncs() }()
	if err != nil {
		if e != nil {
			s.logf("supervisor log (end):\n%s", lastLines(e.SupervisorLog(), 40))
		}
		return nil, err
	}
	return s.run(ctx)
}

func (o Options) validate() error {
	var errs []error
	for _, k := range o.Faults {
		if !slices.Contains(faultKinds, k) {
			errs = append(errs, fmt.Errorf("faults: unknown kind %q (known: %s)", k, strings.Join(faultKinds, ", ")))
		}
	}
	if o.Duration <= 0 || o.Rate <= 0 || o.FaultsPerKind <= 0 || o.CheckpointEvery <= 0 || o.Services <= 0 {
		errs = append(errs, fmt.Errorf("duration %v, rate %v, faults per kind %d, checkpoint interval %v and services %d must all be positive",
			o.Duration, o.Rate, o.FaultsPerKind, o.CheckpointEvery, o.Services))
	}
	return errors.Join(errs...)
}

func (s *soak) logf(format string, args ...any) {
	s.opts.Logf(stamp()+" "+format, args...)
}

// setUp starts the environment, the steady Services and their servers, the churned
// population and the supervisor, and checks the first checkpoint.
func (s *soak) setUp(ctx context.Context) (*env.Env, error) {
	realNFT, err := exec.LookPath("nft")
	if err != nil {
		return nil, err
	}
	wrapperDir := filepath.Join(s.dir, "wrapper")
	if err := writeWrapper(wrapperDir, s.ctl, realNFT); err != nil {
		return nil, err
	}
	e, err := env.Start(ctx, env.Options{
		RepoRoot: s.opts.RepoRoot, WorkDir: s.dir, Instances: instancesConfig, NoSupervisor: true,
		Logf: s.logf,
		// Watches are served from etcd, where compaction expires them (the watch cache
		// would serve a resumed watch from memory).
		ExtraAPIServerArgs: []string{"--watch-cache=false"},
		SupervisorEnv: []string{
			"PATH=" + wrapperDir + ":" + os.Getenv("PATH"),
			"SHARDPROXY_TEST_NETLINK_FAULTS=" + filepath.Join(s.ctl, "netlink-fail"),
		},
		// client-go says "too old resource version" at V(4) in reflector.go.
		SupervisorArgs: []string{"--vmodule", "reflector=4"},
	})
	s.e = e
	if err != nil {
		return e, err
	}
	scratch, err := e.TP.AddNamespace("scratch")
	if err != nil {
		return e, err
	}
	s.check = &checker{e: e, nft: realNFT, scratch: scratch, dir: s.dir, instances: s.instances}
	s.churn = newChurn(e.Client, s.opts.Seed, s.opts.Services, s.logf)
	for _, ns := range append([]string{steadyNamespace}, churnNamespaces...) {
		_, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return e, err
		}
	}
	if err := s.steady(ctx); err != nil {
		return e, err
	}
	start := time.Now()
	if err := s.populate(ctx); err != nil {
		return e, err
	}
	s.logf("created %d Services and their EndpointSlices in %v", len(s.churn.services), time.Since(start).Round(time.Millisecond))
	s.syncs.started()
	s.stopSyncs = sync.OnceFunc(s.syncs.watch(ctx, e))
	if err := e.StartSupervisor(); err != nil {
		return e, err
	}
	if err := e.WaitHealthy(ctx, 2*time.Minute); err != nil {
		return e, err
	}
	return e, nil
}

// steady creates the steady Services, their servers and their probes.
func (s *soak) steady(ctx context.Context) error {
	tp := s.e.TP
	for ns, name := range map[string]string{tp.Pod1: "pod1", tp.Pod2: "pod2", tp.Remote: "remote"} {
		for _, l := range []struct {
			proto string
			port  int
		}{{"tcp", 8080}, {"udp", 8053}} {
			stop, err := tp.Serve(ns, name, l.proto, "", l.port, func(string, ...any) {})
			if err != nil {
				return err
			}
			s.e.OnClose(stop)
		}
	}
	v4 := []env.Backend{env.Pod1v4, env.Pod2v4, env.Remotev4}
	all := append(v4, env.Pod1v6, env.Remotev6, env.Backend{IP: netns.Pod2IPv6, NodeName: env.NodeName})
	tcp, err := s.e.CreateService(ctx, steadyNamespace, "steady-tcp", []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: 8080}}, all, env.WithDualStack())
	if err != nil {
		return err
	}
	np, err := s.e.CreateService(ctx, steadyNamespace, "steady-nodeport", []env.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 81, TargetPort: 8080}}, v4, env.WithType(corev1.ServiceTypeNodePort))
	if err != nil {
		return err
	}
	udp, err := s.e.CreateService(ctx, steadyNamespace, "steady-udp", []env.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: 8053}}, v4)
	if err != nil {
		return err
	}
	for _, svc := range []*corev1.Service{tcp, np, udp} {
		for _, ip := range svc.Spec.ClusterIPs {
			s.steadyIPs[ip] = true
		}
	}
	s.steadyNodePort = np.Spec.Ports[0].NodePort
	servers := []string{"pod1", "pod2", "remote"}
	s.probes = &prober{tp: tp, interval: 25 * time.Millisecond, probes: []*probe{
		{name: "pod1 -> steady-tcp cluster IP (IPv4)", ns: tp.Pod1, proto: "tcp", addr: tcp.Spec.ClusterIPs[0], port: 80, servers: servers},
		{name: "pod2 -> steady-tcp cluster IP (IPv6)", ns: tp.Pod2, proto: "tcp", addr: tcp.Spec.ClusterIPs[1], port: 80, servers: servers},
		{name: "client -> steady-nodeport NodePort", ns: tp.Client, proto: "tcp", addr: steadyNodeIP, port: int(s.steadyNodePort), servers: servers},
		{name: "pod1 -> steady-udp cluster IP (UDP)", ns: tp.Pod1, proto: "udp", addr: udp.Spec.ClusterIP, port: 53, servers: servers},
	}}
	return nil
}

// steadyKey reports whether a service-ips key (address, port) may be a steady Service's.
func (s *soak) steadyKey(addr, port string) bool {
	return s.steadyIPs[addr] || port == fmt.Sprint(s.steadyNodePort)
}

// populate creates the churned Services, four at a time; their choices were drawn in
// order, so the population is the seed's whatever the timing.
func (s *soak) populate(ctx context.Context) error {
	var ops []op
	for range s.opts.Services {
		ops = append(ops, s.churn.createOp(s.churn.rng.Uint64()))
	}
	defer s.churn.resetApplied()
	work := make(chan op)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range work {
				if err := s.churn.apply(ctx, o); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for _, o := range ops {
		select {
		case work <- o:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// run is the soak proper: churn, faults and probes until Duration, checkpoints
// between them, and a last one after.
func (s *soak) run(ctx context.Context) (*Summary, error) {
	if err := s.checkpoint(ctx, "start"); err != nil {
		return nil, err
	}
	s.start = time.Now()
	s.probes.start()
	stopSampler := s.res.sample(ctx, s.e)
	churnCtx, stopChurn := context.WithCancel(ctx)
	defer stopChurn()
	churnDone := make(chan struct{})
	go func() { defer close(churnDone); s.runChurn(churnCtx) }()
	var faults sync.WaitGroup
	for i, kind := range faultKinds {
		if len(s.opts.Faults) > 0 && !slices.Contains(s.opts.Faults, kind) {
			continue
		}
		faults.Add(1)
		go func() { defer faults.Done(); s.schedule(ctx, kind, rand.New(rand.NewPCG(s.opts.Seed, uint64(i+1)))) }()
	}

	end := s.start.Add(s.opts.Duration)
	for n := 1; time.Until(end) > s.opts.CheckpointEvery/2; n++ {
		if err := sleep(ctx, min(s.opts.CheckpointEvery, time.Until(end))); err != nil {
			return nil, err
		}
		if time.Until(end) < s.opts.CheckpointEvery/4 {
			break
		}
		if err := s.checkpoint(ctx, fmt.Sprint(n)); err != nil {
			return nil, err
		}
	}
	if err := sleep(ctx, time.Until(end)); err != nil {
		return nil, err
	}
	s.logf("%v passed: stopping the changes; waiting for the faults still scheduled", s.opts.Duration)
	stopChurn()
	<-churnDone
	faults.Wait()
	if err := s.checkpoint(ctx, "end"); err != nil {
		return nil, err
	}
	s.stopSyncs()
	fullSyncs := s.syncs.finish(time.Now())
	s.mu.Lock()
	s.fullSyncs = fullSyncs
	s.mu.Unlock()
	s.probes.Stop()
	stopSampler()
	return s.summary(), nil
}

// runChurn makes changes at the configured rate, each under the shared quiesce lock.
func (s *soak) runChurn(ctx context.Context) {
	ticker := time.NewTicker(time.Duration(float64(time.Second) / s.opts.Rate))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		s.quiesce.RLock()
		o := s.churn.nextOp()
		err := s.churn.apply(ctx, o)
		s.quiesce.RUnlock()
		if err != nil {
			return
		}
	}
}

// schedule injects FaultsPerKind faults of kind, each in its own slot of the first 85%
// of the run at a random point, one after the other.
func (s *soak) schedule(ctx context.Context, kind string, r *rand.Rand) {
	n := s.opts.FaultsPerKind
	slot := time.Duration(float64(s.opts.Duration) * 0.85 / float64(n))
	for i := range n {
		at := s.start.Add(time.Duration(i)*slot + time.Duration(r.Float64()*0.7*float64(slot)))
		if err := sleep(ctx, time.Until(at)); err != nil {
			return
		}
		exclusive := kind == faultAPIServer || kind == faultCompaction || kind == faultKill
		if exclusive {
			s.watchFaults.Lock()
		}
		s.quiesce.RLock()
		start := time.Now()
		s.logf("fault %s #%d: injecting", kind, i+1)
		detail, err := s.inject.inject(ctx, kind, i+1, r)
		s.quiesce.RUnlock()
		if exclusive {
			s.watchFaults.Unlock()
		}
		s.recordFault(kind, i+1, time.Since(start), detail, err)
	}
}

// recordFault counts a fault that took took: injected when it changed something, apart
// when it changed nothing (errNoEffect), and its error when it failed.
func (s *soak) recordFault(kind string, n int, took time.Duration, detail string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	took = took.Round(time.Millisecond)
	switch {
	case errors.Is(err, errNoEffect):
		s.noEffect[kind]++
		s.logf("fault %s #%d: NO EFFECT after %v, not counted as injected: %v", kind, n, took, err)
	case err != nil:
		s.faultErrors = append(s.faultErrors, fmt.Sprintf("%s %s #%d: %v", stamp(), kind, n, err))
		s.logf("fault %s #%d: FAILED after %v: %v", kind, n, took, err)
	default:
		s.faults[kind]++
		s.logf("fault %s #%d: done in %v: %s", kind, n, took, detail)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
