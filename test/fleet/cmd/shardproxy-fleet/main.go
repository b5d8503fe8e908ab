// Command shardproxy-fleet runs hollow shardproxy nodes (test/fleet) at several sizes
// against one local kube-apiserver and etcd holding the bench's mix of Services, with
// reserveOtherNodeAddresses on and off, and prints what they cost the API server.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/fleet"
)

func main() { os.Exit(run()) }

type options struct {
	nodes        []int
	services     int
	endpoints    int
	settle       time.Duration
	steady       time.Duration
	statusPeriod time.Duration
	changes      int
	churn        time.Duration
	fanoutKB     []int
	fanoutW      int
	fanoutU      int
	reserve      string
	proxies      []fleet.Proxy
	migrate      int
	migrateTO    time.Duration
	blockTO      time.Duration
	moverQPS     float64
	moverBurst   int
	migrateIdle  time.Duration
}

func run() int {
	var o options
	var nodes string
	fs := flag.NewFlagSet("shardproxy-fleet", flag.ContinueOnError)
	fs.StringVar(&nodes, "nodes", "100,300", "hollow node counts, comma-separated")
	fs.IntVar(&o.services, "services", 1000, "Services (the bench's mix)")
	fs.IntVar(&o.endpoints, "endpoints", 10, "endpoints per Service")
	fs.DurationVar(&o.settle, "settle", 15*time.Second, "wait after the first syncs before the steady window")
	fs.DurationVar(&o.steady, "steady", time.Minute, "steady-state window per run")
	fs.DurationVar(&o.statusPeriod, "status-period", 30*time.Second, "each Node's status heartbeat period (kubelet: 5m, compressed)")
	fs.IntVar(&o.changes, "changes", 5, "Service changes timed until every node has them")
	fs.DurationVar(&o.churn, "churn", 0, "during the steady window, one Node change per this interval: a Node (no proxy behind it) joins with an InternalIP, leaves at the next change, and so on (an autoscaler's churn); 0: none")
	fs.StringVar(&o.reserve, "reserve", "on,off", "reserveOtherNodeAddresses settings to run (shardproxy): on (a watch of every Node), off, published (on, from the list one node address writer in this process publishes, as its Deployment would)")
	fs.IntVar(&o.migrate, "migrate", 100, "shardproxy: Services moved (migrate move) to a second instance (team-a) across every node after the steady window, rolled back, and moved again with one node stopped; 0: no migrate step (and no second instance)")
	fs.DurationVar(&o.migrateTO, "migrate-timeout", 2*time.Minute, "the move's and rollback's --timeout (every node's confirmation of a batch)")
	fs.Float64Var(&o.moverQPS, "mover-qps", 0, "the mover's client QPS (0: the CLI's, migrate.ClientQPS)")
	fs.IntVar(&o.moverBurst, "mover-burst", 0, "the mover's client burst (0: the CLI's, migrate.ClientBurst)")
	fs.DurationVar(&o.migrateIdle, "migrate-idle", 0, "leave the fleet idle this long before the move, so that node statuses are as old as at rest (>90s: the mover reads each such node's Node)")
	fs.DurationVar(&o.blockTO, "block-timeout", 30*time.Second, "the --timeout of the move one stopped node blocks")
	fanout := fs.String("fanout-kb", "", "instead of fleets: measure the apiserver's CPU per byte sent to watchers, one ConfigMap of each of these sizes (kB, comma-separated) updated -fanout-updates times with -fanout-watchers watching it")
	fs.IntVar(&o.fanoutW, "fanout-watchers", 50, "-fanout-kb: watchers, each on a connection of its own")
	fs.IntVar(&o.fanoutU, "fanout-updates", 20, "-fanout-kb: updates per size")
	proxies := fs.String("proxies", "shardproxy,kube-proxy", "proxies to run at each size: shardproxy, kube-proxy (kubemark's hollow proxy), kube-proxy+node (that and the own-Node watch kubemark's lacks)")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	_ = klogFlags.Set("v", "0")
	_ = klogFlags.Set("stderrthreshold", "ERROR")
	_ = klogFlags.Set("logtostderr", "false")
	_ = klogFlags.Set("alsologtostderr", "false")
	klog.SetOutput(discard{})
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	for f := range strings.SplitSeq(nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "-nodes %q: want positive integers\n", nodes)
			return 2
		}
		o.nodes = append(o.nodes, n)
	}
	if *fanout != "" {
		for f := range strings.SplitSeq(*fanout, ",") {
			kb, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || kb <= 0 {
				fmt.Fprintf(os.Stderr, "-fanout-kb %q: want positive integers\n", *fanout)
				return 2
			}
			o.fanoutKB = append(o.fanoutKB, kb)
		}
	}
	for r := range strings.SplitSeq(o.reserve, ",") {
		if r != "on" && r != "off" && r != "published" {
			fmt.Fprintf(os.Stderr, "-reserve %q: want on, off, published\n", o.reserve)
			return 2
		}
	}
	for p := range strings.SplitSeq(*proxies, ",") {
		switch p := fleet.Proxy(strings.TrimSpace(p)); p {
		case fleet.Shardproxy, fleet.KubeProxy, fleet.KubeProxyNodeWatch:
			o.proxies = append(o.proxies, p)
		default:
			fmt.Fprintf(os.Stderr, "-proxies %q: want shardproxy, kube-proxy, kube-proxy+node\n", *proxies)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := measure(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "shardproxy-fleet: %v\n", err)
		return 1
	}
	return 0
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func measure(ctx context.Context, o options) error {
	cp, stopCP, err := controlplane.StartProcess(ctx, controlplane.Options{
		ServiceCIDRs:       gen.ServiceCIDRs,
		ExtraAPIServerArgs: []string{"--service-node-port-range=" + gen.NodePortRange},
		Progress:           logf,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := stopCP(); err != nil {
			logf("stopping the control plane: %v", err)
		}
	}()
	if len(o.fanoutKB) > 0 {
		pids, admin := cp.PIDs(), cp.Client()
		return measureFanout(ctx, o, fleet.Env{Admin: admin, NodeConfig: func() *rest.Config { return cp.RESTConfig() },
			APIServerPID: pids[len(pids)-1], APIServerMetrics: apiserverMetrics(admin)})
	}
	var kubemark *fleet.KubemarkOptions
	if slices.ContainsFunc(o.proxies, fleet.Proxy.Kubemark) {
		bin, err := controlplane.KubemarkBinary(ctx, os.Stderr)
		if err != nil {
			return err
		}
		logDir := filepath.Join(cp.Dir, "kubemark")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			return err
		}
		kubemark = &fleet.KubemarkOptions{Binary: bin, Kubeconfig: cp.Kubeconfig, LogDir: logDir}
	}
	pids := cp.PIDs()
	admin := cp.Client()
	c := gen.Generate(o.services, o.endpoints)
	fleet.MarkForMigration(c, o.migrate)
	start := time.Now()
	maxNodes := 0
	for _, n := range o.nodes {
		maxNodes = max(maxNodes, n)
	}
	if err := fleet.Prepare(ctx, admin, maxNodes, c, 8); err != nil {
		return err
	}
	logf("created %d Nodes and %d Services × %d endpoints in %v", maxNodes, o.services, o.endpoints, time.Since(start).Round(time.Second))
	env := fleet.Env{
		Admin:            admin,
		Kubemark:         kubemark,
		NodeConfig:       func() *rest.Config { return cp.RESTConfig() },
		APIServerPID:     pids[len(pids)-1],
		APIServerMetrics: apiserverMetrics(admin),
	}
	var results []*fleet.Result
	for _, n := range o.nodes {
		for _, p := range o.proxies {
			reserves := strings.Split(o.reserve, ",")
			if p.Kubemark() {
				reserves = []string{"-"} // kube-proxy has no such setting
			}
			for _, r := range reserves {
				res, err := fleet.Measure(ctx, env, fleet.Options{
					Proxy: p, Nodes: n, ReserveOtherNodeAddresses: r == "on" || r == "published", OtherNodeAddresses: otherNodeAddresses(r), Settle: o.settle, Steady: o.steady, StatusPeriod: o.statusPeriod,
					Changes: o.changes, Churn: o.churn, QPS: 5, Burst: 10, ReadyTimeout: 5 * time.Minute, Logf: logf,
					Migrate: o.migrate, MigrateTimeout: o.migrateTO, BlockTimeout: o.blockTO, MoverQPS: float32(o.moverQPS), MoverBurst: o.moverBurst,
					MigrateIdle: o.migrateIdle,
				}, o.services)
				if err != nil {
					if res != nil {
						// The migrate step failed: its fleet's other figures stand.
						results = append(results, res)
					}
					fmt.Print(fleet.Table(results))
					fmt.Print(fleet.Fit(results))
					fmt.Print(fleet.MigrationTable(results))
					return fmt.Errorf("%d %s nodes, reserve %s: %w", n, p, r, err)
				}
				results = append(results, res)
				logf("load average %s\n%s%s", loadavg(), fleet.Table([]*fleet.Result{res}), fleet.MigrationTable([]*fleet.Result{res}))
			}
		}
	}
	churn := "no Node churn"
	if o.churn > 0 {
		churn = fmt.Sprintf("a Node joins or leaves every %v", o.churn)
	}
	fmt.Printf("%d Services × %d endpoints (bench mix); each Node heartbeat every %v; %s; steady window %v; %d Service creations timed\n",
		o.services, o.endpoints, o.statusPeriod, churn, o.steady, o.changes)
	fmt.Print(fleet.Table(results))
	fmt.Print(fleet.Fit(results))
	if o.migrate > 0 && slices.Contains(o.proxies, fleet.Shardproxy) {
		limits := fmt.Sprintf("the CLI's limits, QPS %d, burst %d", migrate.ClientQPS, migrate.ClientBurst)
		if o.moverQPS > 0 || o.moverBurst > 0 {
			limits = fmt.Sprintf("QPS %g, burst %d (0: the CLI's)", o.moverQPS, o.moverBurst)
		}
		fmt.Printf("\nmigrate step: %d Services moved to %s across every node (mover: the CLI's Mover and Lease, %s; --timeout %v), rolled back, moved again with the last node stopped (--timeout %v)\n",
			o.migrate, fleet.MigrationTarget, limits, o.migrateTO, o.blockTO)
		fmt.Print(fleet.MigrationTable(results))
		fmt.Print(fleet.MigrationFit(results))
	}
	fmt.Printf("load average at the end: %s\n", loadavg())
	return nil
}

// apiserverMetrics reads kube-apiserver's /metrics with admin's client.
func apiserverMetrics(admin kubernetes.Interface) func(context.Context) (fleet.APIServerCounters, error) {
	return func(ctx context.Context) (fleet.APIServerCounters, error) {
		raw, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return fleet.APIServerCounters{}, fmt.Errorf("reading kube-apiserver /metrics: %w", err)
		}
		return fleet.ParseAPIServerMetrics(strings.NewReader(string(raw)))
	}
}

// measureFanout runs -fanout-kb: no fleet, the apiserver's cost per watcher event and
// per byte sent to watchers.
func measureFanout(ctx context.Context, o options, env fleet.Env) error {
	sizes := make([]int, len(o.fanoutKB))
	for i, kb := range o.fanoutKB {
		sizes[i] = kb << 10
	}
	rs, err := fleet.MeasureFanout(ctx, env, "default", o.fanoutW, o.fanoutU, sizes)
	fmt.Print(fleet.FanoutTable(rs))
	fmt.Printf("load average at the end: %s\n", loadavg())
	return err
}

// loadavg is /proc/loadavg's first three fields: the machine is shared, and the figures
// are read against it.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error()
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// otherNodeAddresses is the otherNodeAddresses of a -reserve setting.
func otherNodeAddresses(reserve string) string {
	if reserve == "published" {
		return config.OtherNodeAddressesPublished
	}
	return config.OtherNodeAddressesWatch
}
