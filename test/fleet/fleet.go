package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/measure"
)

// Options configure one fleet measurement against an existing API server.
type Options struct {
	// Proxy is the proxy the hollow nodes run (default Shardproxy).
	Proxy Proxy
	// Nodes is the number of hollow nodes.
	Nodes int
	// ReserveOtherNodeAddresses is every node's reserveOtherNodeAddresses.
	ReserveOtherNodeAddresses bool
	// OtherNodeAddresses is every node's otherNodeAddresses (default watch). With
	// "published", one node address writer runs in this process for the fleet, as
	// the Deployment beside the DaemonSet would, its requests counted with the nodes'.
	OtherNodeAddresses string
	// Settle is how long after the first syncs the steady state starts.
	Settle time.Duration
	// Steady is how long the steady state is measured.
	Steady time.Duration
	// StatusPeriod is how often the driver writes each Node's status (kubelet writes it
	// every nodeStatusReportFrequency, 5 minutes, when nothing changes).
	StatusPeriod time.Duration
	// Changes is how many Service changes are timed until every node has them.
	Changes int
	// Churn, when set, is the interval between Node changes during the steady window:
	// a Node joins, then leaves at the next tick (churn), and so on.
	Churn time.Duration
	// QPS and Burst are each node's client limits (kube-proxy's: 5 and 10).
	QPS   float32
	Burst int
	// ReadyTimeout bounds the wait for every node's first sync.
	ReadyTimeout time.Duration
	// Migrate, for shardproxy, gives every node a second instance (MigrationTarget) and,
	// after the steady window and the timed changes, runs the migrate step (runMigration)
	// on the Services MarkForMigration labeled; 0: none.
	Migrate int
	// MigrateTimeout is the Mover's Timeout for the move and the rollback (default 2m,
	// the CLI's); BlockTimeout the blocked move's (default 30s).
	MigrateTimeout, BlockTimeout time.Duration
	// MoverQPS and MoverBurst, each when set, replace the mover's client limit (default
	// the CLI's, migrate.ClientQPS and ClientBurst).
	MoverQPS   float32
	MoverBurst int
	// MigrateIdle leaves the fleet idle this long before the move, so that node statuses,
	// written only when they change, are as old as in a cluster at rest (a status older
	// than the mover's StaleAfter, 90 s, makes it read that node's Node); 0: none.
	MigrateIdle time.Duration
	// Logf receives progress lines.
	Logf func(format string, args ...any)
}

// Env is what a measurement runs against.
type Env struct {
	// Admin is the driver's client (Node status, Service changes, /metrics).
	Admin kubernetes.Interface
	// NodeConfig returns a rest config for one node's client (before QPS, Burst and the
	// request counter are set); nil with NodeClient.
	NodeConfig func() *rest.Config
	// NodeClient, when set, is every node's client (unit tests: one fake clientset).
	NodeClient kubernetes.Interface
	// APIServerPID is read for CPU and peak RSS; 0: not measured.
	APIServerPID int
	// APIServerMetrics reads /metrics; nil: not measured.
	APIServerMetrics func(ctx context.Context) (APIServerCounters, error)
	// Kubemark runs the KubeProxy fleets; nil: none.
	Kubemark *KubemarkOptions
}

// Result is one measurement.
type Result struct {
	Proxy                     Proxy
	Nodes                     int
	ReserveOtherNodeAddresses bool
	OtherNodeAddresses        string
	Services                  int
	// Ready is how long every node took to start and program every Service.
	Ready time.Duration
	// Steady is the measured steady-state window.
	Steady time.Duration
	// APIServerCPUPerMinute is kube-apiserver's CPU seconds per minute over Steady.
	APIServerCPUPerMinute float64
	// APIServerPeakRSS is kube-apiserver's VmHWM at the end (bytes; since it started),
	// APIServerRSS its VmRSS then.
	APIServerPeakRSS, APIServerRSS int64
	// ProxyMemory is what the hollow proxies hold at the end (bytes): the kubemark
	// processes' proportional set sizes, or this process's resident growth since the
	// shardproxy nodes started.
	ProxyMemory int64
	// Server are the apiserver's counters over Steady (every client's).
	Server APIServerCounters
	// ProxyRequests are the hollow nodes' own requests over Steady: counted in their
	// transports (shardproxy), or the apiserver's count without the driver's (kube-proxy).
	ProxyRequests Counts
	// Programming is a Service change until every node has it, over all changes and
	// nodes.
	ProgrammingP50, ProgrammingP99, ProgrammingMax time.Duration
	// StatusWrites is the driver's Node status writes over Steady.
	StatusWrites int
	// ChurnChanges is the driver's Node joins and leaves over Steady (Options.Churn).
	ChurnChanges int
	// Publishes and PublishedBytes are the node address writer's lists written over
	// Steady and their sizes summed (OtherNodeAddresses published; 0 otherwise).
	Publishes      int
	PublishedBytes int64
	// Migration is the migrate step's (Options.Migrate); nil without one.
	Migration *Migration
}

// StatusNamespace holds the hollow nodes' status ConfigMaps.
const StatusNamespace = config.DefaultStatusNamespace

// NodeName names hollow node i; the generated endpoints run on node-0..node-19.
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// NodeAddr is hollow node i's InternalIP (10.0.0.0/8: no overlap with gen's plan).
func NodeAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(1 + i>>16), byte(i >> 8), byte(i)})
}

// Prepare creates the namespaces, n Node objects and the generated Services.
func Prepare(ctx context.Context, admin kubernetes.Interface, nodes int, c *gen.Cluster, workers int) error {
	for _, ns := range []string{StatusNamespace, gen.Namespace} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	if err := EnsureNodes(ctx, admin, nodes, workers); err != nil {
		return err
	}
	return parallel(ctx, len(c.Services), workers, func(i int) error {
		svc := c.Services[i].DeepCopy()
		svc.ResourceVersion, svc.Status = "", corev1.ServiceStatus{}
		svc.Spec.HealthCheckNodePort = 0
		for k := range svc.Spec.Ports {
			svc.Spec.Ports[k].NodePort = 0
		}
		if _, err := admin.CoreV1().Services(gen.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Service %s: %w", svc.Name, err)
		}
		slice := c.Slices[i].DeepCopy()
		slice.ResourceVersion = ""
		if _, err := admin.DiscoveryV1().EndpointSlices(gen.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating EndpointSlice %s: %w", slice.Name, err)
		}
		return nil
	})
}

// EnsureNodes creates Nodes node-0..node-(n-1) that do not exist yet.
func EnsureNodes(ctx context.Context, admin kubernetes.Interface, n, workers int) error {
	return parallel(ctx, n, workers, func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName(i), Labels: map[string]string{"kubernetes.io/hostname": NodeName(i)}}}
		created, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("creating Node %s: %w", node.Name, err)
		}
		created.Status = nodeStatus(i, time.Now())
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("setting Node %s's status: %w", node.Name, err)
		}
		return nil
	})
}

func nodeStatus(i int, now time.Time) corev1.NodeStatus {
	return corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: NodeAddr(i).String()}, {Type: corev1.NodeHostName, Address: NodeName(i)}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}},
	}
}

// heartbeat writes Node i's Ready heartbeat, as kubelet's status report does.
func heartbeat(ctx context.Context, admin kubernetes.Interface, i int, now time.Time) error {
	patch := fmt.Appendf(nil, `{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":%q}]}}`,
		now.UTC().Format(time.RFC3339))
	_, err := admin.CoreV1().Nodes().Patch(ctx, NodeName(i), types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// Measure starts opts.Nodes hollow nodes of opts.Proxy, waits for their first syncs,
// measures the steady state with the driver's Node heartbeats, times opts.Changes
// Service changes until every node has them (shardproxy only: kubemark's hollow
// kube-proxy programs nothing), and stops the nodes.
func Measure(ctx context.Context, env Env, opts Options, services int) (*Result, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.Proxy == "" {
		opts.Proxy = Shardproxy
	}
	res := &Result{Proxy: opts.Proxy, Nodes: opts.Nodes, ReserveOtherNodeAddresses: opts.ReserveOtherNodeAddresses,
		OtherNodeAddresses: opts.OtherNodeAddresses, Services: services}
	// The watches open before the fleet starts: after it stops, the next fleet waits for
	// the apiserver to be back to them, so that one's watches still closing are not
	// counted as the next one's (kubemark's readiness counts open watches).
	var before Counts
	if env.APIServerMetrics != nil {
		sc, err := env.APIServerMetrics(ctx)
		if err != nil {
			return nil, err
		}
		before = sc.Watches
	}
	counter := NewRequestCounter()
	start := time.Now()
	var (
		fl  running
		err error
	)
	switch opts.Proxy {
	case Shardproxy:
		fl, err = startShardproxy(ctx, env, opts, counter)
	case KubeProxy, KubeProxyNodeWatch:
		fl, err = startKubeProxy(ctx, env, opts)
	default:
		err = fmt.Errorf("unknown proxy %q", opts.Proxy)
	}
	if err != nil {
		return nil, err
	}
	if err := fl.waitReady(ctx, opts.ReadyTimeout); err != nil {
		return nil, errors.Join(fmt.Errorf("waiting for the first syncs: %w", err), fl.stop())
	}
	res.Ready = time.Since(start)
	opts.Logf("%d %s nodes (reserve %s) hold %d Services after %v", opts.Nodes, opts.Proxy, res.Reserve(), services, res.Ready.Round(time.Millisecond))

	// The nodes' first status writes (and kube-proxy's start events) are start-up, not
	// steady state.
	select {
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), fl.stop())
	case <-time.After(opts.Settle):
	}

	// Steady state: the driver heartbeats every Node once per StatusPeriod, spread evenly.
	beforeProc, beforeServer, beforeReq, err := readCounters(ctx, env, counter)
	if err != nil {
		return nil, errors.Join(err, fl.stop())
	}
	beforePub := fl.publishes()
	steadyStart := time.Now()
	window, cancel := context.WithTimeout(ctx, opts.Steady)
	var (
		churned   int
		left      []string
		churnErr  error
		churnDone = make(chan struct{})
	)
	go func() {
		defer close(churnDone)
		churned, left, churnErr = churn(ctx, window, env.Admin, opts.Churn)
	}()
	writes, hbErr := heartbeats(ctx, window, env.Admin, opts.Nodes, opts.StatusPeriod)
	cancel()
	<-churnDone
	if err := errors.Join(hbErr, churnErr); err != nil && ctx.Err() == nil {
		return nil, errors.Join(err, deleteChurnNodes(ctx, env.Admin, left), fl.stop())
	}
	res.Steady = time.Since(steadyStart)
	res.StatusWrites, res.ChurnChanges = writes, churned
	afterProc, afterServer, afterReq, err := readCounters(ctx, env, counter)
	afterPub := fl.publishes()
	res.Publishes, res.PublishedBytes = int(afterPub.n-beforePub.n), afterPub.bytes-beforePub.bytes
	if err = errors.Join(err, deleteChurnNodes(ctx, env.Admin, left)); err != nil {
		return nil, errors.Join(err, fl.stop())
	}
	if res.ProxyMemory, err = fl.memory(); err != nil {
		return nil, errors.Join(err, fl.stop())
	}
	res.APIServerCPUPerMinute = (afterProc.CPU - beforeProc.CPU).Seconds() / res.Steady.Minutes()
	res.APIServerPeakRSS, res.APIServerRSS = afterProc.PeakRSS, afterProc.RSS
	res.Server = afterServer.Sub(beforeServer)
	res.ProxyRequests = afterReq.Sub(beforeReq)
	if opts.Proxy.Kubemark() {
		// kubemark's clients cannot be counted in their transports: take the apiserver's
		// count without the driver's (its heartbeats and /metrics reads).
		res.ProxyRequests = withoutDriver(res.Server.Requests)
	}

	// Network programming: a new Service until every node has programmed it.
	var lat []time.Duration
	for k := range opts.Changes {
		if opts.Proxy != Shardproxy {
			break
		}
		name := fmt.Sprintf("fleet-probe-%d-%s-%d", opts.Nodes, res.Reserve(), k)
		t0 := time.Now()
		if _, err := CreateProbe(ctx, env.Admin, name); err != nil {
			return nil, errors.Join(err, fl.stop())
		}
		got, err := waitAll(ctx, fl.(*shardproxyFleet).nodes, types.NamespacedName{Namespace: gen.Namespace, Name: name}, t0, time.Minute)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("change %d: %w", k, err), fl.stop())
		}
		lat = append(lat, got...)
	}
	slices.Sort(lat)
	res.ProgrammingP50, res.ProgrammingP99 = measure.Percentile(lat, 50), measure.Percentile(lat, 99)
	if len(lat) > 0 {
		res.ProgrammingMax = lat[len(lat)-1]
	}
	if opts.Proxy == Shardproxy && opts.Migrate > 0 {
		if res.Migration, err = runMigration(ctx, env, opts, fl.(*shardproxyFleet).nodes, counter); err != nil {
			return res, errors.Join(fmt.Errorf("migrate step: %w", err), fl.stop())
		}
	}
	if err := fl.stop(); err != nil {
		return nil, err
	}
	if env.APIServerMetrics != nil {
		if err := WaitWatchesClosed(ctx, env.APIServerMetrics, before, 2*time.Minute); err != nil {
			return nil, fmt.Errorf("after %d %s nodes stopped: %w", opts.Nodes, opts.Proxy, err)
		}
	}
	return res, nil
}

// WaitWatchesClosed waits until no more watches of Services, EndpointSlices or Nodes are
// open on the apiserver than in base.
func WaitWatchesClosed(ctx context.Context, metrics func(context.Context) (APIServerCounters, error), base Counts, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		sc, err := metrics(ctx)
		if err != nil {
			return err
		}
		var open []string
		for _, r := range []string{"services", "endpointslices", "nodes"} {
			if sc.Watches[r] > base[r] {
				open = append(open, fmt.Sprintf("%v of %s (%v before)", sc.Watches[r], r, base[r]))
			}
		}
		if len(open) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("watches still open after %v: %s", timeout, strings.Join(open, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// newDialer returns a dialer of its own, so that the client built with it gets a
// transport and connection of its own.
func newDialer() func(ctx context.Context, network, address string) (net.Conn, error) {
	return (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
}

// driverNodeWrites are the driver's requests to Nodes: heartbeats (PATCH) and churn's
// joins (POST) and leaves (DELETE). kube-proxy writes no Node.
var driverNodeWrites = map[string]bool{"PATCH nodes": true, "POST nodes": true, "DELETE nodes": true}

// withoutDriver returns the apiserver's request counts without the driver's: its Node
// heartbeats and churn (driverNodeWrites) and its /metrics reads (no resource). What is left are the
// proxies' requests and the apiserver's own (its lease and the kubernetes Service's
// endpoints, a few per minute whatever the fleet).
func withoutDriver(server Counts) Counts {
	out := Counts{}
	for k, v := range server {
		if driverNodeWrites[k] || strings.HasSuffix(k, " ") {
			continue
		}
		out[strings.ToLower(k)] = v
	}
	return out
}

// Proxy names the proxy a fleet runs.
type Proxy string

const (
	// Shardproxy is hollow shardproxy nodes (StartHollow), all in this process.
	Shardproxy Proxy = "shardproxy"
	// KubeProxy is kubemark's hollow kube-proxy (--morph=proxy), one process per node.
	KubeProxy Proxy = "kube-proxy"
	// KubeProxyNodeWatch is KubeProxy with the one watch a real kube-proxy makes that
	// kubemark's does not: of its own Node (kube-proxy's NodeManager, which kubemark's
	// HollowProxy leaves out), made from this process with a client per node.
	KubeProxyNodeWatch Proxy = "kube-proxy+node"
)

// Kubemark says whether p runs kubemark's hollow kube-proxy.
func (p Proxy) Kubemark() bool { return p == KubeProxy || p == KubeProxyNodeWatch }

// running is a started fleet of one proxy.
type running interface {
	// waitReady waits until every node holds every Service.
	waitReady(ctx context.Context, timeout time.Duration) error
	// memory is the resident memory the fleet's proxies hold (bytes).
	memory() (int64, error)
	// publishes is what the fleet's node address writer has written so far (none for
	// kube-proxy, and for shardproxy without the published list).
	publishes() publishCount
	stop() error
}

// shardproxyFleet is hollow shardproxy nodes in this process.
type shardproxyFleet struct {
	nodes []*HollowNode
	// baseRSS is this process's resident set before the nodes started.
	baseRSS int64
	// stopWriter stops the node address writer (OtherNodeAddresses published); nil: none.
	stopWriter func() error
	// written counts the writer's lists written and their bytes.
	written, writtenBytes atomic.Int64
}

// publishCount is how many lists a node address writer wrote, and their bytes summed.
type publishCount struct{ n, bytes int64 }

func (f *shardproxyFleet) publishes() publishCount {
	return publishCount{n: f.written.Load(), bytes: f.writtenBytes.Load()}
}

func startShardproxy(ctx context.Context, env Env, opts Options, counter *RequestCounter) (*shardproxyFleet, error) {
	debug.FreeOSMemory()
	self, err := ReadProc(os.Getpid())
	if err != nil {
		return nil, err
	}
	f := &shardproxyFleet{baseRSS: self.RSS}
	if opts.ReserveOtherNodeAddresses && opts.OtherNodeAddresses == config.OtherNodeAddressesPublished {
		written := func(_, size int) {
			f.written.Add(1)
			f.writtenBytes.Add(int64(size))
		}
		if f.stopWriter, err = startNodeAddressWriter(ctx, env, counter, written); err != nil {
			return nil, err
		}
	}
	target := ""
	if opts.Migrate > 0 {
		target = MigrationTarget
	}
	for i := range opts.Nodes {
		client := env.NodeClient
		if client == nil {
			rc := rest.CopyConfig(env.NodeConfig())
			rc.QPS, rc.Burst = opts.QPS, opts.Burst
			// As the shipped binary's clientConnection defaults, and kube-proxy's: protobuf.
			rc.ContentType = config.ContentTypeProtobuf
			rc.AcceptContentTypes = config.ContentTypeProtobuf + "," + config.ContentTypeJSON
			rc.UserAgent = "shardproxy-hollow/" + NodeName(i)
			// A dialer of its own: client-go shares one transport (and its HTTP/2
			// connection) among configs with the same TLS settings and dialer, which
			// would carry every node's watches on one connection; a node has its own,
			// as each kubemark process has.
			rc.Dial = newDialer()
			rc.WrapTransport = counter.Wrap
			var err error
			if client, err = kubernetes.NewForConfig(rc); err != nil {
				return nil, errors.Join(err, f.stop())
			}
		}
		h, err := StartHollow(ctx, HollowOptions{Name: NodeName(i), Addr: NodeAddr(i), Client: client,
			StatusNamespace: StatusNamespace, ReserveOtherNodeAddresses: opts.ReserveOtherNodeAddresses,
			OtherNodeAddresses: opts.OtherNodeAddresses, MigrationTarget: target})
		if err != nil {
			return nil, errors.Join(err, f.stop())
		}
		f.nodes = append(f.nodes, h)
	}
	return f, nil
}

// startNodeAddressWriter runs the node address writer, as its Deployment would (one
// leader; its requests counted with the nodes'), and waits for its first list.
func startNodeAddressWriter(ctx context.Context, env Env, counter *RequestCounter, written func(nodes, bytes int)) (func() error, error) {
	client := env.NodeClient
	if client == nil {
		rc := rest.CopyConfig(env.NodeConfig())
		rc.QPS, rc.Burst = 5, 10
		rc.ContentType = config.ContentTypeProtobuf
		rc.AcceptContentTypes = config.ContentTypeProtobuf + "," + config.ContentTypeJSON
		rc.UserAgent = "shardproxy-node-addresses"
		rc.Dial = newDialer()
		rc.WrapTransport = counter.Wrap
		var err error
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, err
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	w := &nodeaddrs.Writer{Client: client, Namespace: StatusNamespace, Logger: klog.Background().WithValues("writer", "fleet"), Written: written}
	go func() { done <- nodeaddrs.RunElected(wctx, w, nodeaddrs.Election{Identity: "fleet"}) }()
	stop := func() error {
		cancel()
		return <-done
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := env.Admin.CoreV1().ConfigMaps(StatusNamespace).Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
		if err == nil {
			return stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errors.Join(fmt.Errorf("the node address writer published no list within a minute: %w", err), stop())
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Reserve is the row's reserve setting: "published" (from the published list), "true"
// (a watch of every Node) or "false".
func (r *Result) Reserve() string {
	if r.ReserveOtherNodeAddresses && r.OtherNodeAddresses == config.OtherNodeAddressesPublished {
		return config.OtherNodeAddressesPublished
	}
	return fmt.Sprint(r.ReserveOtherNodeAddresses)
}

// waitReady waits for every node's first full sync, which programs every Service at
// once: the first Service stands for all.
func (f *shardproxyFleet) waitReady(ctx context.Context, timeout time.Duration) error {
	first := types.NamespacedName{Namespace: gen.Namespace, Name: gen.ServiceName(0)}
	_, err := waitAll(ctx, f.nodes, first, time.Now(), timeout)
	return err
}

// memory is this process's growth since the nodes started (the driver's share is small
// and the same at every N).
func (f *shardproxyFleet) memory() (int64, error) {
	self, err := ReadProc(os.Getpid())
	return self.RSS - f.baseRSS, err
}

func (f *shardproxyFleet) stop() error {
	var errs []error
	for _, h := range f.nodes {
		errs = append(errs, h.Stop())
	}
	if f.stopWriter != nil {
		errs = append(errs, f.stopWriter())
	}
	return errors.Join(errs...)
}

// kubeProxyFleet is kubemark's hollow kube-proxies, one process each, and for
// KubeProxyNodeWatch each node's own-Node watch.
type kubeProxyFleet struct {
	*kubemarkFleet
	env  Env
	n    int
	base Counts
	// nodeWatches are the own-Node watches' factories (KubeProxyNodeWatch), stopped by
	// cancel.
	nodeWatches []informers.SharedInformerFactory
	cancel      context.CancelFunc
}

func startKubeProxy(ctx context.Context, env Env, opts Options) (*kubeProxyFleet, error) {
	if env.Kubemark == nil || env.APIServerMetrics == nil {
		return nil, errors.New("kube-proxy fleet: needs kubemark and the apiserver's metrics")
	}
	before, err := env.APIServerMetrics(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, opts.Nodes)
	for i := range names {
		names[i] = NodeName(i)
	}
	km, err := startKubemark(*env.Kubemark, names, opts.QPS, opts.Burst)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &kubeProxyFleet{kubemarkFleet: km, env: env, n: opts.Nodes, base: before.Watches, cancel: cancel}
	if opts.Proxy != KubeProxyNodeWatch {
		return f, nil
	}
	for _, name := range names {
		// As kube-proxy's NodeManager: its own Node by name, resynced every
		// configSyncPeriod (30 s, kubemark's), on a client of its own.
		rc := rest.CopyConfig(env.NodeConfig())
		rc.QPS, rc.Burst = opts.QPS, opts.Burst
		rc.ContentType = config.ContentTypeProtobuf
		rc.UserAgent = "kube-proxy-node-watch/" + name
		rc.Dial = newDialer()
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, errors.Join(err, f.stop())
		}
		factory := informers.NewSharedInformerFactoryWithOptions(client, 30*time.Second,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			}))
		factory.Core().V1().Nodes().Informer()
		factory.Start(ctx.Done())
		f.nodeWatches = append(f.nodeWatches, factory)
	}
	return f, nil
}

func (f *kubeProxyFleet) waitReady(ctx context.Context, timeout time.Duration) error {
	resources := []string{"services", "endpointslices"}
	if len(f.nodeWatches) > 0 {
		resources = append(resources, "nodes")
	}
	return waitWatching(ctx, f.env, f.kubemarkFleet, f.base, f.n, resources, timeout)
}

func (f *kubeProxyFleet) stop() error {
	f.cancel()
	for _, w := range f.nodeWatches {
		w.Shutdown()
	}
	return f.kubemarkFleet.stop()
}

func (f *kubeProxyFleet) memory() (int64, error) { return f.pss() }

func (f *kubeProxyFleet) publishes() publishCount { return publishCount{} }

func readCounters(ctx context.Context, env Env, counter *RequestCounter) (ProcStat, APIServerCounters, Counts, error) {
	var ps ProcStat
	var err error
	if env.APIServerPID != 0 {
		if ps, err = ReadProc(env.APIServerPID); err != nil {
			return ps, APIServerCounters{}, nil, err
		}
	}
	var sc APIServerCounters
	if env.APIServerMetrics != nil {
		if sc, err = env.APIServerMetrics(ctx); err != nil {
			return ps, sc, nil, err
		}
	}
	return ps, sc, counter.Snapshot(), nil
}

// heartbeats writes every Node's heartbeat once per period, spread evenly, until
// window ends; it returns how many it wrote. The writes themselves run under ctx: one
// sent as the window closes completes.
func heartbeats(ctx, window context.Context, admin kubernetes.Interface, n int, period time.Duration) (int, error) {
	if n == 0 || period <= 0 {
		<-window.Done()
		return 0, nil
	}
	tick := time.NewTicker(period / time.Duration(n))
	defer tick.Stop()
	writes := 0
	for i := 0; ; i = (i + 1) % n {
		select {
		case <-window.Done():
			return writes, nil
		case now := <-tick.C:
			if err := heartbeat(ctx, admin, i, now); err != nil {
				if ctx.Err() != nil {
					return writes, nil
				}
				return writes, fmt.Errorf("heartbeat of %s: %w", NodeName(i), err)
			}
			writes++
		}
	}
}

// probes counts the probe Services of this process, for their cluster IPs.
var probes atomic.Int32

// CreateProbe creates a ClusterIP Service (TCP port 80) with one EndpointSlice of one
// ready endpoint, the change whose fleet-wide programming the harnesses time, and
// returns its cluster IP. The IP is chosen (10.97.0.0/16, inside gen.ServiceCIDRs and
// past the generated ones) so that a fake clientset, which allocates none, serves it too.
func CreateProbe(ctx context.Context, admin kubernetes.Interface, name string) (netip.Addr, error) {
	k := probes.Add(1)
	addr := netip.AddrFrom4([4]byte{10, 97, byte(k >> 8), byte(k)})
	ip := addr.String()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: gen.Namespace, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := admin.CoreV1().Services(gen.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return addr, fmt.Errorf("creating Service %s: %w", name, err)
	}
	ready, port, proto := true, int32(80), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: gen.Namespace, Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"100.127.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: &port, Protocol: &proto}},
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(gen.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return addr, fmt.Errorf("creating EndpointSlice %s: %w", slice.Name, err)
	}
	return addr, nil
}

func ptrTo[T any](v T) *T { return &v }

// waitAll polls every node until each has programmed svc, and returns each node's
// time since t0.
func waitAll(ctx context.Context, nodes []*HollowNode, svc types.NamespacedName, t0 time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(timeout)
	got := make([]time.Duration, len(nodes))
	left := len(nodes)
	for {
		for i, h := range nodes {
			if got[i] == 0 && h.Programmed(svc) {
				got[i] = time.Since(t0)
				left--
			}
		}
		if left == 0 {
			return got, nil
		}
		if time.Now().After(deadline) {
			var missing []string
			for i, h := range nodes {
				if got[i] == 0 && len(missing) < 5 {
					missing = append(missing, h.Name)
				}
			}
			return nil, fmt.Errorf("%d of %d nodes have not programmed %s after %v (%s ...)", left, len(nodes), svc, timeout, strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// parallel runs do(0..n-1) on workers goroutines; the first error stops it.
func parallel(ctx context.Context, n, workers int, do func(i int) error) error {
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	next := make(chan int)
	for range max(1, workers) {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop || ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// Table formats results, one row each. kube-proxy rows have no reserve setting and no
// programming figures (kubemark's proxier discards every change).
func Table(results []*Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%-15s %-6s %-9s %-7s %-6s %-7s %-8s %-9s %-8s %-9s %-9s %-6s %-10s %-8s %-9s %-9s %-9s %-9s %s\n",
		"proxy", "nodes", "reserve", "ready", "hb/s", "churn/s", "apiCPU/m", "apiRSS", "apiPeak", "watchEv/s", "watchKB/s", "pub/s", "proxyReq/s", "etcdW/s", "mem/node",
		"prog p50", "prog p99", "prog max", "top watch events; top watch KB; top proxy requests")
	for _, r := range results {
		s := r.Steady
		reserve, p50, p99, pmax := r.Reserve(), "n/a", "n/a", "n/a"
		if r.Proxy.Kubemark() {
			reserve = "-"
		} else {
			p50, p99, pmax = r.ProgrammingP50.Round(time.Millisecond).String(), r.ProgrammingP99.Round(time.Millisecond).String(),
				r.ProgrammingMax.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "%-15s %-6d %-9s %-7s %-6.1f %-7.2f %-8.2f %-9s %-8s %-9.1f %-9.1f %-6.2f %-10.2f %-8.1f %-9s %-9s %-9s %-9s %s; %s; %s\n",
			r.Proxy, r.Nodes, reserve, r.Ready.Round(time.Second), float64(r.StatusWrites)/s.Seconds(), float64(r.ChurnChanges)/s.Seconds(),
			r.APIServerCPUPerMinute, fmt.Sprintf("%d MiB", r.APIServerRSS>>20), fmt.Sprintf("%d MiB", r.APIServerPeakRSS>>20),
			r.Server.WatchEvents.Total()/s.Seconds(), r.Server.WatchBytes.Total()/1024/s.Seconds(), float64(r.Publishes)/s.Seconds(),
			r.ProxyRequests.Total()/s.Seconds(), r.Server.EtcdWrites.Total()/s.Seconds(), fmt.Sprintf("%.1f MiB", float64(r.ProxyMemory)/float64(max(1, r.Nodes))/(1<<20)),
			p50, p99, pmax, r.Server.WatchEvents.Top(3, s), r.Server.WatchBytes.Scale(1.0/1024).Top(2, s), r.ProxyRequests.Top(3, s))
	}
	return b.String()
}
