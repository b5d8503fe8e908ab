// Package realfleet runs a small fleet of real nodes: each a network namespace of its
// own with its own Node object and a real proxy process in it, upstream kube-proxy
// (--proxy-mode nftables) or shardproxy's supervisor (`shardproxy run`, one default
// instance), against one kube-apiserver and etcd in a namespace of their own. It times
// fleet-wide network programming the same way for both proxies: the driver creates a
// Service and its EndpointSlice (test/fleet's probe change) and records when each node's
// kernel holds the Service's cluster IP in its proxy's service-ips map, as `nft monitor`
// in that node's namespace reports it. That is the denominator the hollow fleet lacks:
// kubemark's hollow kube-proxy programs nothing (docs/fleet.md).
//
// Nothing leaves the namespaces it creates: the nodes reach the apiserver over veths to a
// bridge in the control plane's namespace; Run deletes every namespace and stops every
// process it started, on failure too.
package realfleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/test/bench/compare"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/fleet"
	"github.com/shardproxy/shardproxy/test/measure"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Proxy names the proxy the real nodes run.
type Proxy string

const (
	// KubeProxy is upstream kube-proxy in nftables mode, its defaults otherwise
	// (minSyncPeriod 1 s).
	KubeProxy Proxy = "kube-proxy"
	// Shardproxy is `shardproxy run` with one default instance, its defaults otherwise
	// (minSyncPeriod 1 s).
	Shardproxy Proxy = "shardproxy"
)

// syncSeries selects proxy's IPv4 series of its sync metrics: kube-proxy labels them by
// ip_family, shardproxy by instance too.
func (p Proxy) syncSeries() compare.Series {
	if p == KubeProxy {
		return compare.Series{"ip_family": "IPv4"}
	}
	return compare.Series{"proxy_instance": "default", "ip_family": "IPv4"}
}

// table is the nftables table (family ip) whose service-ips map holds proxy's cluster IPs.
func (p Proxy) table() string {
	if p == KubeProxy {
		return "kube-proxy"
	}
	return "shardproxy-default"
}

// Addresses of the control plane's link. They exist only inside the fleet's namespaces.
const (
	// ControlPlaneIP is kube-apiserver's address on the bridge every node is wired to.
	ControlPlaneIP = "172.30.0.1"
	// linkPrefix is the bridge's subnet length.
	linkPrefix = 16
)

// nodeLinkIP is node i's address on the control plane's bridge.
func nodeLinkIP(i int) string { return fmt.Sprintf("172.30.%d.%d", 1+i/250, 1+i%250) }

// Options configure Run.
type Options struct {
	// Nodes are the fleet sizes, each run with every proxy.
	Nodes []int
	// Proxies run at each size, in this order.
	Proxies []Proxy
	// Services and Endpoints are the bench's mix created before the first fleet starts.
	Services, Endpoints int
	// Changes is how many probe Services are timed per fleet, one after the other (each
	// once the previous is on every node, as test/fleet's Measure does).
	Changes int
	// Gap is the wait between one change on every node and the next one's creation: 0, as
	// test/fleet, puts each change inside the minSyncPeriod after the last sync; a gap
	// longer than minSyncPeriod times a change to a proxy at rest.
	Gap time.Duration
	// Settle is the wait after every node's first sync before the first change.
	Settle time.Duration
	// ReadyTimeout bounds every node's first sync; ChangeTimeout one change.
	ReadyTimeout, ChangeTimeout time.Duration
	// ShardproxyBinary and KubeProxyBinary are the proxies to run.
	ShardproxyBinary, KubeProxyBinary string
	// WorkDir holds the configs, kubeconfig and each proxy's log.
	WorkDir string
	// Logf receives progress lines.
	Logf func(format string, args ...any)
}

// Result is one fleet's measurement.
type Result struct {
	Proxy Proxy
	Nodes int
	// Ready is how long every node took from the start to its first programmed Services.
	Ready time.Duration
	// Changes is each change's fleet-wide time: until the last node had it.
	Changes []time.Duration
	// PerNode are every node's times over every change.
	PerNode []time.Duration
	// APIServerCPUPerMinute is kube-apiserver's CPU seconds per minute during the changes.
	APIServerCPUPerMinute float64
	// Syncs is how many IPv4 syncs the nodes made during the changes, SyncTime how long
	// they took in all (kubeproxy_sync_proxy_rules_duration_seconds, which both proxies
	// export under that name).
	Syncs    float64
	SyncTime time.Duration
	// MonitorCPU is the CPU time the nodes' nft monitors used during the changes, the
	// harness's own share of the machine.
	MonitorCPU time.Duration
	// Requests are the apiserver's requests during the changes (every client's), by verb
	// and resource.
	Requests fleet.Counts
	// changeWindow is how long the changes took.
	changeWindow time.Duration
}

// SyncMean is the mean IPv4 sync's duration during the changes.
func (r *Result) SyncMean() time.Duration {
	if r.Syncs == 0 {
		return 0
	}
	return time.Duration(float64(r.SyncTime) / r.Syncs)
}

// Fleet returns the p50, p99 and max of the changes' fleet-wide times.
func (r *Result) Fleet() (p50, p99, maxd time.Duration) { return stats(r.Changes) }

// Node returns the p50, p99 and max of every node's time over every change (test/fleet's
// programming figures pool these).
func (r *Result) Node() (p50, p99, maxd time.Duration) { return stats(r.PerNode) }

func stats(d []time.Duration) (p50, p99, maxd time.Duration) {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0, 0, 0
	}
	return measure.Percentile(s, 50), measure.Percentile(s, 99), s[len(s)-1]
}

// Run builds the namespaces and the control plane, creates the Services and Nodes, runs
// every fleet of opts and returns their results; it removes everything it made before it
// returns.
func Run(ctx context.Context, opts Options) (results []*Result, err error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	maxNodes := slices.Max(opts.Nodes)
	tp, err := netns.Empty()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, tp.Close()) }()
	cpNS, nodeNS, err := wire(tp, maxNodes)
	if err != nil {
		return nil, err
	}
	opts.Logf("starting etcd and kube-apiserver in %s", cpNS)
	cp, stopCP, err := controlplane.StartProcess(ctx, controlplane.Options{
		Netns: cpNS, Dial: tp.Dialer(cpNS), BindAddress: "0.0.0.0", AdvertiseAddress: ControlPlaneIP,
		ServiceCIDRs:       gen.ServiceCIDRs,
		ExtraAPIServerArgs: []string{"--service-node-port-range=" + gen.NodePortRange},
	})
	if stopCP != nil {
		defer func() { err = errors.Join(err, stopCP()) }()
	}
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(opts.WorkDir, "node.kubeconfig")
	server := fmt.Sprintf("https://%s:%d", ControlPlaneIP, cp.Port)
	if err := controlplane.WriteKubeconfig(kubeconfig, server, "admin", cp.AdminToken); err != nil {
		return nil, err
	}
	admin := cp.Client()
	c := gen.Generate(opts.Services, opts.Endpoints)
	start := time.Now()
	if err := fleet.Prepare(ctx, admin, maxNodes, c, 8); err != nil {
		return nil, err
	}
	opts.Logf("created %d Nodes and %d Services × %d endpoints in %v", maxNodes, opts.Services, opts.Endpoints, time.Since(start).Round(time.Second))
	first, err := netip.ParseAddr(c.Services[0].Spec.ClusterIP)
	if err != nil {
		return nil, fmt.Errorf("the first Service's cluster IP: %w", err)
	}
	pids := cp.PIDs()
	env := runEnv{tp: tp, admin: admin, apiserverPID: pids[len(pids)-1], kubeconfig: kubeconfig, first: first}
	for _, n := range opts.Nodes {
		for _, p := range opts.Proxies {
			res, err := env.measure(ctx, opts, p, nodeNS[:n])
			if err != nil {
				return results, fmt.Errorf("%d %s nodes: %w", n, p, err)
			}
			results = append(results, res)
			p50, p99, pmax := res.Fleet()
			opts.Logf("%d %s nodes: fleet-wide p50 %v p99 %v max %v over %d changes", n, p, p50, p99, pmax, len(res.Changes))
		}
	}
	return results, nil
}

// wire adds the control plane's namespace with a bridge and n node namespaces, each
// with a veth to that bridge carrying its link address and its Node's InternalIP.
func wire(tp *netns.Topology, n int) (string, []string, error) {
	cpNS, err := tp.AddNamespace("cp")
	if err != nil {
		return "", nil, err
	}
	cmds := [][]string{
		{"ip", "-n", cpNS, "link", "set", "lo", "up"},
		{"ip", "-n", cpNS, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", cpNS, "addr", "add", fmt.Sprintf("%s/%d", ControlPlaneIP, linkPrefix), "dev", "br0"},
		{"ip", "-n", cpNS, "link", "set", "br0", "up"},
	}
	var nodes []string
	for i := range n {
		ns, err := tp.AddNamespace(fmt.Sprintf("n%d", i))
		if err != nil {
			return "", nil, err
		}
		nodes = append(nodes, ns)
		veth := fmt.Sprintf("v%d", i)
		cmds = append(cmds,
			[]string{"ip", "link", "add", veth, "netns", cpNS, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", cpNS, "link", "set", veth, "master", "br0", "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", ns, "addr", "add", fmt.Sprintf("%s/%d", nodeLinkIP(i), linkPrefix), "dev", "eth0"},
			// The Node's InternalIP is the node's own, as on a real node: the proxies'
			// health-check node ports listen on it.
			[]string{"ip", "-n", ns, "addr", "add", fleet.NodeAddr(i).String() + "/32", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"})
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return cpNS, nodes, nil
}

// runEnv is what every fleet of one Run shares.
type runEnv struct {
	tp           *netns.Topology
	admin        kubernetes.Interface
	apiserverPID int
	kubeconfig   string
	// first is the first generated Service's cluster IP: a node holding it has made its
	// first full sync, which programs every Service at once.
	first netip.Addr
}

// measure starts proxy p in every namespace of nodes, waits for their first syncs, times
// opts.Changes probe Services and stops the proxies, leaving the namespaces' rulesets
// empty for the next fleet.
func (e runEnv) measure(ctx context.Context, opts Options, p Proxy, nodes []string) (res *Result, err error) {
	res = &Result{Proxy: p, Nodes: len(nodes)}
	var procs []*netns.Process
	var mons []*monitor
	defer func() {
		for _, m := range mons {
			m.stop()
		}
		for i, pr := range procs {
			_ = pr.Stop()
			logPath := filepath.Join(opts.WorkDir, fmt.Sprintf("%s-%d-node-%d.log", p, len(nodes), i))
			_ = os.WriteFile(logPath, []byte(pr.Output()), 0o644)
			if out, ferr := e.tp.Exec(nodes[i], "nft", "flush", "ruleset"); ferr != nil {
				err = errors.Join(err, fmt.Errorf("flushing the ruleset of %s: %w: %s", nodes[i], ferr, out))
			}
		}
	}()
	start := time.Now()
	for i, ns := range nodes {
		args, err := e.args(opts, p, i)
		if err != nil {
			return nil, err
		}
		pr, err := e.tp.StartProcess(ns, args...)
		if err != nil {
			return nil, err
		}
		procs = append(procs, pr)
	}
	if err := e.waitReady(ctx, p, nodes, procs, opts.ReadyTimeout); err != nil {
		return nil, err
	}
	res.Ready = time.Since(start)
	opts.Logf("%d %s nodes hold %d Services after %v", len(nodes), p, opts.Services, res.Ready.Round(time.Millisecond))
	for _, ns := range nodes {
		m, err := startMonitor(ctx, e.tp, ns, p.table())
		mons = append(mons, m)
		if err != nil {
			return nil, err
		}
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(opts.Settle):
	}
	before, err := fleet.ReadProc(e.apiserverPID)
	if err != nil {
		return nil, err
	}
	syncsBefore, err := e.syncs(p, nodes)
	if err != nil {
		return nil, err
	}
	monBefore, err := monitorsCPU(mons)
	if err != nil {
		return nil, err
	}
	reqBefore, err := e.requests(ctx)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	for k := range opts.Changes {
		if k > 0 && opts.Gap > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(opts.Gap):
			}
		}
		name := fmt.Sprintf("real-probe-%s-%d-%d-%d", p, len(nodes), opts.Gap.Milliseconds(), k)
		t0 := time.Now()
		ip, err := fleet.CreateProbe(ctx, e.admin, name)
		if err != nil {
			return nil, err
		}
		got, err := waitAll(ctx, mons, ip, t0, opts.ChangeTimeout)
		if err != nil {
			return nil, fmt.Errorf("change %d (%s, %v): %w", k, name, ip, err)
		}
		res.PerNode = append(res.PerNode, got...)
		res.Changes = append(res.Changes, slices.Max(got))
	}
	after, err := fleet.ReadProc(e.apiserverPID)
	if err != nil {
		return nil, err
	}
	res.changeWindow = time.Since(t)
	res.APIServerCPUPerMinute = (after.CPU - before.CPU).Seconds() / res.changeWindow.Minutes()
	syncsAfter, err := e.syncs(p, nodes)
	if err != nil {
		return nil, err
	}
	monAfter, err := monitorsCPU(mons)
	if err != nil {
		return nil, err
	}
	res.MonitorCPU = monAfter - monBefore
	reqAfter, err := e.requests(ctx)
	if err != nil {
		return nil, err
	}
	res.Requests = reqAfter.Sub(reqBefore)
	during := syncsAfter.Sub(syncsBefore)
	res.Syncs, res.SyncTime = float64(during.Count), time.Duration(during.Sum*float64(time.Second))
	for i, pr := range procs {
		select {
		case <-pr.Done():
			return nil, fmt.Errorf("%s on node-%d exited during the changes: %s", p, i, tail(pr.Output(), 20))
		default:
		}
	}
	return res, nil
}

// args is the command line of proxy p on node i: each proxy's defaults but for what a
// network namespace of a test needs (no conntrack sysctl writes, which a namespace may not
// make), with the admin kubeconfig.
func (e runEnv) args(opts Options, p Proxy, i int) ([]string, error) {
	name := fleet.NodeName(i)
	switch p {
	case KubeProxy:
		return []string{opts.KubeProxyBinary, "--proxy-mode=nftables", "--kubeconfig=" + e.kubeconfig,
			"--hostname-override=" + name, "--conntrack-max-per-core=0",
			"--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0", "--v=1"}, nil
	case Shardproxy:
		cfg := fmt.Sprintf(`apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: %s
kubeconfig: %s
instances:
- name: default
  default: true
  slot: 0
`, name, e.kubeconfig)
		path := filepath.Join(opts.WorkDir, fmt.Sprintf("shardproxy-%s.yaml", name))
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			return nil, err
		}
		return []string{opts.ShardproxyBinary, "run", "--config", path}, nil
	}
	return nil, fmt.Errorf("unknown proxy %q", p)
}

// waitReady waits until every node's service-ips map holds the first generated
// Service's cluster IP, polling each node every 250 ms with `nft list map`.
func (e runEnv) waitReady(ctx context.Context, p Proxy, nodes []string, procs []*netns.Process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ready := make([]bool, len(nodes))
	left := len(nodes)
	for {
		for i, ns := range nodes {
			if ready[i] {
				continue
			}
			select {
			case <-procs[i].Done():
				return fmt.Errorf("%s on node-%d exited: %s", p, i, tail(procs[i].Output(), 20))
			default:
			}
			out, err := e.tp.Exec(ns, "nft", "list", "map", "ip", p.table(), "service-ips")
			if err == nil && strings.Contains(out, e.first.String()+" . ") {
				ready[i] = true
				left--
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			i := slices.Index(ready, false)
			return fmt.Errorf("%d of %d %s nodes have not programmed %v after %v; node-%d's log: %s", left, len(nodes), p, e.first, timeout, i, tail(procs[i].Output(), 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// syncs sums, over nodes, proxy p's IPv4 syncs so far (their count and total seconds),
// from each proxy's /metrics on 127.0.0.1:10249 (both proxies' default) inside its
// namespace.
func (e runEnv) syncs(p Proxy, nodes []string) (compare.Histogram, error) {
	var sum compare.Histogram
	for _, ns := range nodes {
		out, err := e.tp.Exec(ns, "curl", "-sS", "--max-time", "10", "http://127.0.0.1:10249/metrics")
		if err != nil {
			return compare.Histogram{}, err
		}
		sc, err := compare.ParseScrape(out)
		if err != nil {
			return compare.Histogram{}, fmt.Errorf("%s's metrics: %w", ns, err)
		}
		h := sc.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", p.syncSeries())
		sum.Count += h.Count
		sum.Sum += h.Sum
	}
	return sum, nil
}

// requests reads the apiserver's request counts from its /metrics.
func (e runEnv) requests(ctx context.Context) (fleet.Counts, error) {
	raw, err := e.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading kube-apiserver's /metrics: %w", err)
	}
	c, err := fleet.ParseAPIServerMetrics(bytes.NewReader(raw))
	return c.Requests, err
}

// monitorsCPU sums the monitors' CPU time so far (ip netns exec and stdbuf exec nft in
// place: the process is nft).
func monitorsCPU(mons []*monitor) (time.Duration, error) {
	var sum time.Duration
	for _, m := range mons {
		st, err := measure.ReadStat(m.cmd.Process.Pid)
		if err != nil {
			return 0, fmt.Errorf("nft monitor in %s: %w", m.ns, err)
		}
		sum += st.CPU
	}
	return sum, nil
}

// waitAll waits until every monitor has seen ip and returns each one's time since t0.
func waitAll(ctx context.Context, mons []*monitor, ip netip.Addr, t0 time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		got := make([]time.Duration, 0, len(mons))
		var missing []string
		for _, m := range mons {
			at, ok := m.seen(ip)
			if !ok {
				missing = append(missing, m.ns)
				continue
			}
			got = append(got, at.Sub(t0))
		}
		if len(missing) == 0 {
			return got, nil
		}
		for _, m := range mons {
			if err := m.failed(); err != nil {
				return nil, err
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d nodes have no %v after %v (%s)", len(missing), len(mons), ip, timeout, strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// elementIP is an IPv4 key of a service-ips element as `nft monitor` prints it
// ("10.97.0.1 . tcp . 80 : goto ...").
var elementIP = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. `)

// monitor follows `nft monitor new elements` in one namespace and records when each
// cluster IP first appeared in table's service-ips map.
type monitor struct {
	ns   string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	first  map[netip.Addr]time.Time
	err    error
	stderr strings.Builder
	// lines counts what the monitor printed, last is the latest line (for errors).
	lines int
	last  string
	// own is set once the monitor printed an element of its handshake.
	own bool
}

// ready says whether the monitor printed an element of its handshake.
func (m *monitor) ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.own
}

// Write keeps the monitor's standard error for the error that ends it.
func (m *monitor) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stderr.Write(p)
}

// startMonitor starts the monitor in ns and returns once it provably listens: it adds
// elements to a set of a table of its own until the monitor prints one, then deletes that
// table.
func startMonitor(ctx context.Context, tp *netns.Topology, ns, table string) (*monitor, error) {
	m := &monitor{ns: ns, done: make(chan struct{}), first: map[netip.Addr]time.Time{}}
	const probeTable = "realfleet-monitor"
	// The set exists before the monitor starts: a monitor of elements alone learns the
	// sets it prints from its first read of the ruleset, not from later events.
	if err := tp.NFT(ns, fmt.Sprintf("add table ip %[1]s\nadd set ip %[1]s s { type ipv4_addr; }\n", probeTable)); err != nil {
		return m, err
	}
	// nft writes to a pipe through a full stdio buffer: stdbuf makes it flush each line as
	// the event arrives, or a line would wait for 4 kB of others and its time with it.
	m.cmd = exec.Command("ip", "netns", "exec", ns, "stdbuf", "-oL", "nft", "monitor", "new", "elements")
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	m.cmd.Stderr = m
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return m, err
	}
	if err := m.cmd.Start(); err != nil {
		return m, fmt.Errorf("starting nft monitor in %s: %w", ns, err)
	}
	prefix := "add element ip " + table + " service-ips "
	go func() {
		defer close(m.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			now := time.Now()
			line := sc.Text()
			m.mu.Lock()
			m.lines++
			m.last = line
			m.mu.Unlock()
			own := strings.HasPrefix(line, "add element ip "+probeTable+" ")
			if !own && !strings.HasPrefix(line, prefix) {
				continue
			}
			m.mu.Lock()
			for _, g := range elementIP.FindAllStringSubmatch(line, -1) {
				a, err := netip.ParseAddr(g[1])
				if err != nil {
					continue
				}
				if _, ok := m.first[a]; !ok {
					m.first[a] = now
				}
			}
			if own {
				m.own = true
			}
			m.mu.Unlock()
		}
		werr := m.cmd.Wait()
		m.mu.Lock()
		m.err = fmt.Errorf("nft monitor in %s ended: %v, %v: %s", ns, sc.Err(), werr, strings.TrimSpace(m.stderr.String()))
		m.mu.Unlock()
	}()
	// The monitor reads the whole ruleset before it listens, and reads it again when the
	// ruleset's generation changed meanwhile: with a proxy's ten thousand chains that takes
	// a while, so the elements of this handshake come slower and slower (each a new one:
	// the monitor prints additions only), never so fast that the read never completes.
	deadline := time.Now().Add(time.Minute)
	wait := 200 * time.Millisecond
	for k := 1; ; k++ {
		if err := tp.NFT(ns, fmt.Sprintf("add element ip %s s { 192.0.2.%d }\n", probeTable, k%250+1)); err != nil {
			return m, err
		}
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(wait):
		}
		if m.ready() {
			break
		}
		if err := m.failed(); err != nil {
			return m, err
		}
		if time.Now().After(deadline) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m, fmt.Errorf("nft monitor in %s did not print an element of its own within a minute (%d lines, the last %q; stderr %q)", ns, m.lines, m.last, m.stderr.String())
		}
		wait = min(2*wait, 2*time.Second)
	}
	return m, tp.NFT(ns, fmt.Sprintf("delete table ip %s\n", probeTable))
}

// seen returns when ip first appeared.
func (m *monitor) seen(ip netip.Addr) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.first[ip]
	return t, ok
}

// failed returns why the monitor ended, or nil while it runs.
func (m *monitor) failed() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *monitor) stop() {
	if m.cmd != nil && m.cmd.Process != nil { // nil: it failed before its process started
		_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
		<-m.done
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Table formats results, one row each: the fleet-wide figures (per change, the last
// node's time) and the per-node ones (test/fleet's pooling).
func Table(results []*Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %-6s %-8s %-8s %-9s %-9s %-9s %-9s %-9s %-8s %-12s %-9s %-8s %s\n",
		"proxy", "nodes", "changes", "ready", "fleet p50", "fleet p99", "fleet max", "node p50", "node p99", "apiCPU/m", "syncs/change", "sync mean", "monCPU/m", "top apiserver requests")
	for _, r := range results {
		f50, f99, fmax := r.Fleet()
		n50, n99, _ := r.Node()
		fmt.Fprintf(&b, "%-11s %-6d %-8d %-8s %-9s %-9s %-9s %-9s %-9s %-8.2f %-12.2f %-9s %-8.2f %s\n", r.Proxy, r.Nodes, len(r.Changes),
			r.Ready.Round(100*time.Millisecond), ms(f50), ms(f99), ms(fmax), ms(n50), ms(n99), r.APIServerCPUPerMinute,
			r.Syncs/float64(max(1, r.Nodes*len(r.Changes))), ms(r.SyncMean()), r.MonitorCPU.Seconds()/r.changeWindow.Minutes(), r.Requests.Top(3, r.changeWindow))
	}
	return b.String()
}

// Ratios formats, for each size with both proxies, shardproxy's fleet-wide p99 over
// kube-proxy's.
func Ratios(results []*Result) string {
	var b strings.Builder
	for _, s := range results {
		if s.Proxy != Shardproxy {
			continue
		}
		for _, k := range results {
			if k.Proxy == KubeProxy && k.Nodes == s.Nodes {
				_, sp, _ := s.Fleet()
				_, kp, _ := k.Fleet()
				fmt.Fprintf(&b, "%d nodes: fleet-wide p99 shardproxy %s / kube-proxy %s = %.2f×\n", s.Nodes, ms(sp), ms(kp), float64(sp)/float64(max(1, kp)))
			}
		}
	}
	return b.String()
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }
