package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// Options configure one fleet measurement against an existing API server.
type Options struct {
	// Nodes is the number of hollow nodes.
	Nodes int
	// ReserveOtherNodeAddresses is every node's reserveOtherNodeAddresses.
	ReserveOtherNodeAddresses bool
	// Steady is how long the steady state is measured.
	Steady time.Duration
	// StatusPeriod is how often the driver writes each Node's status (kubelet writes it
	// every nodeStatusReportFrequency, 5 minutes, when nothing changes).
	StatusPeriod time.Duration
	// Changes is how many Service changes are timed until every node has them.
	Changes int
	// QPS and Burst are each node's client limits (kube-proxy's: 5 and 10).
	QPS   float32
	Burst int
	// ReadyTimeout bounds the wait for every node's first sync.
	ReadyTimeout time.Duration
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
}

// Result is one measurement.
type Result struct {
	Nodes                     int
	ReserveOtherNodeAddresses bool
	Services                  int
	// Ready is how long every node took to start and program every Service.
	Ready time.Duration
	// Steady is the measured steady-state window.
	Steady time.Duration
	// APIServerCPUPerMinute is kube-apiserver's CPU seconds per minute over Steady.
	APIServerCPUPerMinute float64
	// APIServerPeakRSS is kube-apiserver's VmHWM at the end (bytes; since it started).
	APIServerPeakRSS int64
	// Server are the apiserver's counters over Steady (every client's).
	Server APIServerCounters
	// ProxyRequests are the hollow nodes' own requests over Steady.
	ProxyRequests Counts
	// Programming is a Service change until every node has it, over all changes and
	// nodes.
	ProgrammingP50, ProgrammingP99, ProgrammingMax time.Duration
	// StatusWrites is the driver's Node status writes over Steady.
	StatusWrites int
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

// Measure starts opts.Nodes hollow nodes, waits for their first syncs, measures the
// steady state with the driver's Node heartbeats, times opts.Changes Service changes
// until every node has them, and stops the nodes.
func Measure(ctx context.Context, env Env, opts Options, services int) (*Result, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	res := &Result{Nodes: opts.Nodes, ReserveOtherNodeAddresses: opts.ReserveOtherNodeAddresses, Services: services}
	counter := NewRequestCounter()
	start := time.Now()
	var nodes []*HollowNode
	stopAll := func() error {
		var errs []error
		for _, h := range nodes {
			errs = append(errs, h.Stop())
		}
		return errors.Join(errs...)
	}
	for i := range opts.Nodes {
		client := env.NodeClient
		if client == nil {
			rc := rest.CopyConfig(env.NodeConfig())
			rc.QPS, rc.Burst = opts.QPS, opts.Burst
			rc.UserAgent = "shardproxy-hollow/" + NodeName(i)
			rc.WrapTransport = counter.Wrap
			var err error
			if client, err = kubernetes.NewForConfig(rc); err != nil {
				return nil, errors.Join(err, stopAll())
			}
		}
		h, err := StartHollow(ctx, HollowOptions{Name: NodeName(i), Addr: NodeAddr(i), Client: client,
			StatusNamespace: StatusNamespace, ReserveOtherNodeAddresses: opts.ReserveOtherNodeAddresses})
		if err != nil {
			return nil, errors.Join(err, stopAll())
		}
		nodes = append(nodes, h)
	}
	// Every node's first full sync programs every Service at once: the first one stands
	// for all.
	first := types.NamespacedName{Namespace: gen.Namespace, Name: gen.ServiceName(0)}
	if _, err := waitAll(ctx, nodes, first, time.Now(), opts.ReadyTimeout); err != nil {
		return nil, errors.Join(fmt.Errorf("waiting for the first syncs: %w", err), stopAll())
	}
	res.Ready = time.Since(start)
	opts.Logf("%d nodes (reserveOtherNodeAddresses %t) programmed %d Services in %v", opts.Nodes, opts.ReserveOtherNodeAddresses, services, res.Ready.Round(time.Millisecond))

	// Steady state: the driver heartbeats every Node once per StatusPeriod, spread evenly.
	beforeProc, beforeServer, beforeReq, err := readCounters(ctx, env, counter)
	if err != nil {
		return nil, errors.Join(err, stopAll())
	}
	steadyStart := time.Now()
	window, cancel := context.WithTimeout(ctx, opts.Steady)
	writes, hbErr := heartbeats(ctx, window, env.Admin, opts.Nodes, opts.StatusPeriod)
	cancel()
	if hbErr != nil && ctx.Err() == nil {
		return nil, errors.Join(hbErr, stopAll())
	}
	res.Steady = time.Since(steadyStart)
	res.StatusWrites = writes
	afterProc, afterServer, afterReq, err := readCounters(ctx, env, counter)
	if err != nil {
		return nil, errors.Join(err, stopAll())
	}
	res.APIServerCPUPerMinute = (afterProc.CPU - beforeProc.CPU).Seconds() / res.Steady.Minutes()
	res.APIServerPeakRSS = afterProc.PeakRSS
	res.Server = afterServer.Sub(beforeServer)
	res.ProxyRequests = afterReq.Sub(beforeReq)

	// Network programming: a new Service until every node has programmed it.
	var lat []time.Duration
	for k := range opts.Changes {
		name := fmt.Sprintf("fleet-probe-%d-%t-%d", opts.Nodes, opts.ReserveOtherNodeAddresses, k)
		t0 := time.Now()
		if err := createProbe(ctx, env.Admin, name); err != nil {
			return nil, errors.Join(err, stopAll())
		}
		got, err := waitAll(ctx, nodes, types.NamespacedName{Namespace: gen.Namespace, Name: name}, t0, time.Minute)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("change %d: %w", k, err), stopAll())
		}
		lat = append(lat, got...)
	}
	slices.Sort(lat)
	res.ProgrammingP50, res.ProgrammingP99 = Percentile(lat, 50), Percentile(lat, 99)
	if len(lat) > 0 {
		res.ProgrammingMax = lat[len(lat)-1]
	}
	return res, stopAll()
}

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

// createProbe creates a ClusterIP Service with one endpoint. Its cluster IP is chosen
// (10.97.0.0/16, inside gen.ServiceCIDRs and past the generated ones) so that a fake
// clientset, which allocates none, serves it too.
func createProbe(ctx context.Context, admin kubernetes.Interface, name string) error {
	k := probes.Add(1)
	ip := netip.AddrFrom4([4]byte{10, 97, byte(k >> 8), byte(k)}).String()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: gen.Namespace, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := admin.CoreV1().Services(gen.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Service %s: %w", name, err)
	}
	ready, port, proto := true, int32(80), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: gen.Namespace, Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"100.127.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: &port, Protocol: &proto}},
	}
	if _, err := admin.DiscoveryV1().EndpointSlices(gen.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating EndpointSlice %s: %w", slice.Name, err)
	}
	return nil
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

// Table formats results, one row each.
func Table(results []*Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%-6s %-8s %-8s %-6s %-9s %-10s %-9s %-11s %-8s %-9s %-9s %-9s %s\n",
		"nodes", "reserve", "ready", "hb/s", "apiCPU/m", "apiPeakRSS", "watchEv/s", "proxyReq/s", "etcdW/s", "prog p50", "prog p99", "prog max", "top watch events; top proxy requests")
	for _, r := range results {
		s := r.Steady
		fmt.Fprintf(&b, "%-6d %-8t %-8s %-6.1f %-9.1f %-10s %-9.1f %-11.2f %-8.1f %-9s %-9s %-9s %s; %s\n",
			r.Nodes, r.ReserveOtherNodeAddresses, r.Ready.Round(time.Second), float64(r.StatusWrites)/s.Seconds(), r.APIServerCPUPerMinute,
			fmt.Sprintf("%d MiB", r.APIServerPeakRSS>>20), r.Server.WatchEvents.Total()/s.Seconds(),
			r.ProxyRequests.Total()/s.Seconds(), r.Server.EtcdWrites.Total()/s.Seconds(),
			r.ProgrammingP50.Round(time.Millisecond), r.ProgrammingP99.Round(time.Millisecond), r.ProgrammingMax.Round(time.Millisecond),
			r.Server.WatchEvents.Top(3, s), r.ProxyRequests.Top(3, s))
	}
	return b.String()
}
