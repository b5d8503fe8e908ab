// Package compare is `make bench-compare` (issue 6): the same generated Services and
// EndpointSlices in a real kube-apiserver, served once by upstream kube-proxy in nftables
// mode and once by one shardproxy instance, each measured from its own /metrics (the
// same kube-proxy metric names): the first full sync, partial syncs for one changed
// endpoint, network programming latency (the EndpointSlice's
// endpoints.kubernetes.io/last-change-trigger-time until programmed) and peak RSS.
//
// Each scale gets a fresh environment (test/e2e/env: etcd and kube-apiserver in a
// namespace of their own, a node namespace). The two proxies run there one after the
// other, never together, so neither competes with the other for the two cores; between
// them kube-proxy is stopped and its tables deleted, so shardproxy starts on a node as
// clean as kube-proxy had.
package compare

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/test/bench"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// Options configure a run.
type Options struct {
	// Scales are the numbers of Services to measure.
	Scales []int
	// Endpoints per Service (one EndpointSlice each).
	Endpoints int
	// IPv6Percent of the generated Services are IPv6 (single-stack): both proxies then
	// program both families, and each change is read in its Service's family.
	IPv6Percent int
	// Clients is the number of parallel requests creating the objects.
	Clients int
	// Seed is how the objects get into the cluster: "api" creates them through the
	// apiserver, "etcd" writes them into etcd (seedEtcd), for scales whose creation
	// through the apiserver of a busy machine would take hours.
	Seed string
	// Samples is the number of one-endpoint changes measured per proxy.
	Samples int
	// MinSyncPeriod is both proxies' minimum time between syncs (kube-proxy's default
	// is 1s); samples are spaced further apart so each change syncs on its own.
	MinSyncPeriod time.Duration
	// SyncTimeout bounds the wait for a proxy's first sync and for each sample.
	SyncTimeout time.Duration
	// RepoRoot is the repository (deploy/ RBAC, building shardproxy).
	RepoRoot string
	// KubeProxy is the upstream kube-proxy binary.
	KubeProxy string
	// Out is the JSON report's path.
	Out string
	// Keep keeps each scale's work directory (logs) instead of deleting it.
	Keep bool
	// Only measures one proxy ("kube-proxy" or "shardproxy"); empty measures both.
	Only string
	// HeapProfileDir, when set, receives shardproxy's heap profile after its first full
	// sync at each scale, taken after a collection (heap-N.pprof; `go tool pprof
	// -sample_index=inuse_space`).
	HeapProfileDir string
	// ChurnRate is the endpoint changes per second of the churn phase (issue 13 item 4),
	// made after the samples for ChurnDuration (0: no churn phase).
	ChurnRate     float64
	ChurnDuration time.Duration
	// Plot, when set, receives an SVG of first full sync and peak RSS against Services
	// for both proxies.
	Plot string
	// Also are other checkouts of shardproxy (e.g. main before a change) measured after
	// RepoRoot's build, on the same objects in the same environment, so a before/after
	// comparison does not depend on two runs' machine states.
	Also []string
	// ServePercent, when set, also measures a node whose instance serves that share of
	// the Services (issue 13 item 2): after both proxies (and Also) have served every
	// Service unlabelled, the share is labelled for an instance serving
	// gen.ServedProxyName and the rest for a proxy the node does not run, and shardproxy
	// is measured with that instance (ScaleResult.Served); then the rest is deleted and
	// shardproxy is measured again in a cluster holding only the share
	// (ScaleResult.ServedOnly).
	ServePercent int
}

// Main runs bench-compare and returns the exit code.
func Main(args []string) int {
	o, err := parseOptions(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := Run(ctx, o, os.Stderr)
	if rep != nil {
		PrintTable(os.Stdout, rep)
		if werr := rep.WriteJSON(o.Out); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Printf("\nJSON: %s\n", o.Out)
		}
		if o.Plot != "" {
			if werr := rep.WritePlot(o.Plot); werr != nil {
				err = errors.Join(err, werr)
			} else {
				fmt.Printf("plot: %s\n", o.Plot)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		return 1
	}
	return 0
}

func parseOptions(args []string) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("shardproxy-bench-compare", flag.ContinueOnError)
	scales := fs.String("scales", "1000,10000", "comma-separated numbers of Services")
	fs.IntVar(&o.Endpoints, "endpoints", 10, "endpoints per Service")
	fs.IntVar(&o.IPv6Percent, "ipv6-percent", 0, "share of the generated Services that are IPv6, 0-100")
	fs.IntVar(&o.Clients, "clients", 16, "parallel requests creating, labelling and deleting the objects")
	fs.StringVar(&o.Seed, "seed", "api", `how the objects are created: "api" (through the apiserver) or "etcd" (written into etcd, served by the apiserver from its watch; measured changes still go through the apiserver)`)
	fs.IntVar(&o.Samples, "samples", 7, "one-endpoint changes measured per proxy")
	fs.DurationVar(&o.MinSyncPeriod, "min-sync-period", time.Second, "both proxies' minimum sync period")
	fs.DurationVar(&o.SyncTimeout, "sync-timeout", 10*time.Minute, "longest wait for a first sync or one change")
	fs.StringVar(&o.RepoRoot, "repo", ".", "the shardproxy repository")
	fs.StringVar(&o.KubeProxy, "kube-proxy", "", "upstream kube-proxy binary (default: hack/build-apiserver.sh --print-path kube-proxy)")
	fs.StringVar(&o.Out, "out", "_output/bench/compare.json", "JSON report path")
	fs.BoolVar(&o.Keep, "keep", false, "keep each scale's work directory (logs)")
	fs.StringVar(&o.Only, "only", "", `measure only "kube-proxy" or "shardproxy" (no ratios)`)
	fs.StringVar(&o.HeapProfileDir, "heap-profile-dir", "", "write shardproxy's heap profile after its first full sync here (heap-N.pprof)")
	fs.Float64Var(&o.ChurnRate, "churn-rate", 20, "endpoint changes per second in the churn phase")
	fs.DurationVar(&o.ChurnDuration, "churn-duration", time.Minute, "how long the churn phase lasts, per proxy (0: none)")
	fs.StringVar(&o.Plot, "plot", "", "write an SVG plot (first full sync and peak RSS against Services) here")
	fs.IntVar(&o.ServePercent, "serve-percent", 0, "then label this share of the Services for an instance of shardproxy and the rest for another proxy, measure it, and measure a cluster of that share alone (0: not measured)")
	also := fs.String("also", "", "comma-separated other shardproxy checkouts to measure after -repo's, on the same objects (e.g. a worktree of main)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for f := range strings.SplitSeq(*scales, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return o, fmt.Errorf("-scales %q: %q is not a positive number", *scales, f)
		}
		o.Scales = append(o.Scales, n)
	}
	for d := range strings.SplitSeq(*also, ",") {
		if d = strings.TrimSpace(d); d != "" {
			o.Also = append(o.Also, d)
		}
	}
	if o.Only != "" && o.Only != "kube-proxy" && o.Only != "shardproxy" {
		return o, fmt.Errorf("-only %q: want kube-proxy or shardproxy", o.Only)
	}
	if o.ServePercent < 0 || o.ServePercent > 100 {
		return o, fmt.Errorf("-serve-percent %d: want 0..100", o.ServePercent)
	}
	if o.Seed != "api" && o.Seed != "etcd" {
		return o, fmt.Errorf("-seed %q: want api or etcd", o.Seed)
	}
	if o.IPv6Percent < 0 || o.IPv6Percent > 100 {
		return o, fmt.Errorf("-ipv6-percent %d: want 0..100", o.IPv6Percent)
	}
	if o.Endpoints < 1 || o.Samples < 1 || o.MinSyncPeriod <= 0 || o.Clients < 1 {
		return o, errors.New("-endpoints, -samples, -min-sync-period and -clients must be positive")
	}
	if o.ChurnDuration < 0 || (o.ChurnDuration > 0 && o.ChurnRate <= 0) {
		return o, errors.New("-churn-duration must not be negative, and -churn-rate must be positive with a churn phase")
	}
	return o, nil
}

// Run measures every scale. It returns the report so far with the first error.
func Run(ctx context.Context, o Options, log io.Writer) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench-compare needs root (network namespaces, nft)")
	}
	root, err := filepath.Abs(o.RepoRoot)
	if err != nil {
		return nil, err
	}
	o.RepoRoot = root
	if o.KubeProxy == "" {
		out, err := exec.Command(filepath.Join(root, "hack", "build-apiserver.sh"), "--print-path", "kube-proxy").Output()
		if err != nil {
			return nil, fmt.Errorf("finding kube-proxy: %w", err)
		}
		o.KubeProxy = strings.TrimSpace(string(out))
	}
	if _, err := os.Stat(o.KubeProxy); err != nil {
		return nil, fmt.Errorf("kube-proxy binary: %w (run hack/build-apiserver.sh --kube-proxy)", err)
	}
	r := &runner{o: o, log: log}
	if r.binary, err = buildShardproxy(root); err != nil {
		return nil, err
	}
	defer os.RemoveAll(filepath.Dir(r.binary))
	for _, dir := range o.Also {
		bin, err := buildShardproxy(dir)
		if err != nil {
			return nil, fmt.Errorf("-also %s: %w", dir, err)
		}
		defer os.RemoveAll(filepath.Dir(bin))
		r.also = append(r.also, bin)
	}
	rep := &Report{Started: time.Now(), Endpoints: o.Endpoints, IPv6Percent: o.IPv6Percent, Samples: o.Samples,
		MinSyncPeriod: o.MinSyncPeriod.String(), Machine: bench.DescribeMachine()}
	for _, n := range o.Scales {
		res, err := r.scale(ctx, n)
		if res != nil {
			rep.Scales = append(rep.Scales, *res)
		}
		if err != nil {
			return rep, fmt.Errorf("%d Services: %w", n, err)
		}
	}
	return rep, nil
}

type runner struct {
	o      Options
	log    io.Writer
	binary string
	// also are the binaries built from Options.Also, in order.
	also []string
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, "%s bench-compare: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// buildShardproxy builds the shardproxy of the checkout repo into a temporary directory.
func buildShardproxy(repo string) (string, error) {
	dir, err := os.MkdirTemp("", "shardproxy-compare-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "shardproxy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/shardproxy")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building shardproxy: %w: %s", err, out)
	}
	return bin, nil
}

// The instance shardproxy runs: the default one, or with Options.ServePercent one
// serving gen.ServedProxyName in gen.Namespace.
const (
	defaultInstance = "default"
	servedInstance  = "served"
)

// shardproxyInstances is the one instance shardproxy runs: local detection over the
// generated pod ranges, as kube-proxy's --cluster-cidr, and the generated load-balancer
// IPs accepted, as kube-proxy serves them.
func shardproxyInstances(minSync time.Duration, served bool) string {
	selects := "default: true"
	if served {
		selects = fmt.Sprintf("proxyNames: [%s]", gen.ServedProxyName)
	}
	return fmt.Sprintf(`
- name: %s
  %s
  slot: 0
  minSyncPeriod: %s
  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [%s, %s]}
  tenant: {namespaces: [%s], loadBalancerCIDRs: [%s, %s]}
`, instanceName(served), selects, minSync, gen.PodCIDR, gen.PodCIDR6, gen.Namespace, gen.LoadBalancerRange, gen.LoadBalancerRange6)
}

func instanceName(served bool) string {
	if served {
		return servedInstance
	}
	return defaultInstance
}

func (r *runner) scale(ctx context.Context, n int) (*ScaleResult, error) {
	work, err := os.MkdirTemp("", fmt.Sprintf("shardproxy-compare-%d-", n))
	if err != nil {
		return nil, err
	}
	if r.o.Keep {
		r.logf("work directory (kept): %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	r.logf("%d Services × %d endpoints: starting the control plane and the node", n, r.o.Endpoints)
	e, err := env.Start(ctx, env.Options{
		RepoRoot: r.o.RepoRoot, Binary: r.binary, WorkDir: work, NoSupervisor: true,
		Instances:          shardproxyInstances(r.o.MinSyncPeriod, false),
		ExtraConfig:        "enableProfiling: true",
		NoLabelMirror:      true,
		ServiceCIDRs:       gen.ServiceCIDRs,
		ExtraAPIServerArgs: []string{"--service-node-port-range=" + gen.NodePortRange},
		Logf:               r.logf,
	})
	if e != nil {
		defer e.Close()
	}
	if err != nil {
		return nil, err
	}
	client, err := fastClient(e)
	if err != nil {
		return nil, err
	}
	res := &ScaleResult{Services: n, Endpoints: n * r.o.Endpoints, ServePercent: r.o.ServePercent}
	c := gen.GenerateFamilies(n, r.o.Endpoints, r.o.IPv6Percent)
	start := time.Now()
	if err := r.create(ctx, e, client, c); err != nil {
		return res, err
	}
	res.CreateSeconds = time.Since(start).Seconds()
	r.logf("created %d Services and EndpointSlices in %.1fs", n, res.CreateSeconds)

	m := &measurer{r: r, e: e, client: client, cluster: c}
	if r.o.Only != "shardproxy" {
		if res.Upstream, err = m.measure(ctx, upstreamDaemon(e, r.o.KubeProxy, r.o.MinSyncPeriod)); err != nil {
			return res, err
		}
	}
	// kube-proxy leaves its tables behind on SIGTERM; delete them so shardproxy starts on
	// a clean node.
	for _, fam := range []string{"ip", "ip6"} {
		if out, err := e.TP.Exec(e.TP.Node, "nft", "delete", "table", fam, "kube-proxy"); err != nil {
			r.logf("deleting kube-proxy's %s table: %v: %s", fam, err, out)
		}
	}
	if r.o.Only != "kube-proxy" {
		if err := m.measureOurs(ctx, res); err != nil {
			return res, err
		}
	}
	res.fillRatios()
	return res, nil
}

// The names of shardproxy's measurements of Options.ServePercent: serving the share in
// a cluster holding every Service, and in a cluster holding only the share.
const (
	servedName     = "shardproxy, share served"
	servedOnlyName = "shardproxy, share only"
)

// create puts c's objects into the cluster as Options.Seed says.
func (r *runner) create(ctx context.Context, e *env.Env, client kubernetes.Interface, c *gen.Cluster) error {
	if r.o.Seed == "api" {
		return load(ctx, client, c, r.o.Clients)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gen.Namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := seedEtcd(ctx, newEtcdSeeder(e.CP.RESTConfig().Dial), c, r.o.Clients); err != nil {
		return err
	}
	r.logf("wrote %d Services and EndpointSlices into etcd; waiting for the apiserver to serve them", len(c.Services))
	wctx, cancel := context.WithTimeout(ctx, r.o.SyncTimeout)
	defer cancel()
	return waitServed(wctx, client, len(c.Services))
}

// upstreamDaemon is kube-proxy on the node of e.
func upstreamDaemon(e *env.Env, binary string, minSync time.Duration) *daemon {
	kp := e.NewKubeProxy(binary, "kube-proxy", kubeProxyArgs(e, minSync)...)
	return &daemon{
		name: "kube-proxy", series: Series{"ip_family": "IPv4"},
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", env.KubeProxyMetricsPort),
		start:      kp.Start, pid: kp.Pid, stop: func() error { return kp.Stop(syscall.SIGTERM) },
		logTail: func() string { return kp.LogTail(30) },
	}
}

// measureOurs measures shardproxy and the -also builds serving every Service, then,
// with Options.ServePercent, shardproxy serving that share.
func (m *measurer) measureOurs(ctx context.Context, res *ScaleResult) error {
	ours := &daemon{
		name: "shardproxy", series: Series{"proxy_instance": defaultInstance, "ip_family": "IPv4"}, // the family kube-proxy is read in
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", env.MetricsPort),
		heapURL:    fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1", env.MetricsPort),
		start:      m.e.StartSupervisor, pid: m.e.SupervisorPid, stop: func() error { return m.e.StopSupervisor(syscall.SIGTERM) },
		logTail: func() string { return tail(m.e.SupervisorLog(), 30) },
	}
	var err error
	if res.Shardproxy, err = m.measure(ctx, ours); err != nil {
		return err
	}
	if err := m.measureAlso(ctx, res, ours); err != nil {
		return err
	}
	if m.r.o.ServePercent > 0 {
		return m.measureServed(ctx, res, ours)
	}
	return nil
}

// measureServed labels the Services for the served share and the other proxy,
// measures shardproxy running an instance for the served share, deletes the others and
// measures it again.
func (m *measurer) measureServed(ctx context.Context, res *ScaleResult, ours *daemon) error {
	start := time.Now()
	m.served = m.cluster.LabelServed(m.r.o.ServePercent)
	if err := relabel(ctx, m.client, m.cluster, m.r.o.Clients); err != nil {
		return err
	}
	m.r.logf("labelled %d of %d Services %s, the rest %s, in %.1fs", len(m.served), len(m.cluster.Services),
		gen.ServedProxyName, gen.OtherProxyName, time.Since(start).Seconds())
	if err := m.resetNode(shardproxyInstances(m.r.o.MinSyncPeriod, true)); err != nil {
		return err
	}
	d := *ours
	d.name, d.profileTag = servedName, "served"
	d.series = Series{"proxy_instance": servedInstance, "ip_family": "IPv4"}
	served, err := m.measure(ctx, &d)
	if err != nil {
		return err
	}
	res.Served = &served

	start = time.Now()
	if err := deleteUnserved(ctx, m.client, m.cluster, m.served, m.r.o.Clients); err != nil {
		return err
	}
	m.r.logf("deleted the %d Services not served in %.1fs", len(m.cluster.Services)-len(m.served), time.Since(start).Seconds())
	if err := m.resetNode(""); err != nil {
		return err
	}
	d.name, d.profileTag = servedOnlyName, "served-only"
	only, err := m.measure(ctx, &d)
	if err != nil {
		return err
	}
	res.ServedOnly = &only
	return nil
}

// resetNode deletes the tables the last shardproxy left and, when instances is set,
// makes them the supervisor's instances for its next start.
func (m *measurer) resetNode(instances string) error {
	if out, err := m.e.CLI("cleanup", "--all"); err != nil {
		return fmt.Errorf("cleaning up: %w: %s", err, out)
	}
	if instances == "" {
		return nil
	}
	cfg, err := os.ReadFile(m.e.ConfigPath)
	if err != nil {
		return err
	}
	head, _, ok := strings.Cut(string(cfg), "\ninstances:")
	if !ok {
		return fmt.Errorf("%s has no instances", m.e.ConfigPath)
	}
	return os.WriteFile(m.e.ConfigPath, []byte(head+"\ninstances:\n"+strings.TrimLeft(instances, "\n")), 0o644)
}

// measureAlso measures each -also build as ours is measured, one after the other, each
// on a node its predecessor's tables are gone from.
func (m *measurer) measureAlso(ctx context.Context, res *ScaleResult, ours *daemon) error {
	for i, bin := range m.r.also {
		// The supervisor leaves its tables on SIGTERM (traffic keeps flowing).
		if err := m.resetNode(""); err != nil {
			return fmt.Errorf("before %s: %w", m.r.o.Also[i], err)
		}
		m.e.Binary = bin
		d := *ours
		d.name = "shardproxy@" + m.r.o.Also[i]
		d.profileTag = filepath.Base(m.r.o.Also[i])
		pr, err := m.measure(ctx, &d)
		if err != nil {
			return err
		}
		res.Also = append(res.Also, pr)
	}
	m.e.Binary = m.r.binary
	return nil
}

// kubeProxyArgs run upstream kube-proxy in nftables mode on node-1 with the admin
// kubeconfig, local detection over the generated pod range, and NodePorts on the node's
// primary IP (as a shardproxy instance's default).
func kubeProxyArgs(e *env.Env, minSync time.Duration) []string {
	return []string{
		"--proxy-mode=nftables",
		"--kubeconfig=" + e.CP.Kubeconfig,
		"--hostname-override=" + env.NodeName,
		"--cluster-cidr=" + gen.PodCIDR.String() + "," + gen.PodCIDR6.String(),
		fmt.Sprintf("--healthz-bind-address=0.0.0.0:%d", env.KubeProxyHealthzPort),
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", env.KubeProxyMetricsPort),
		"--nodeport-addresses=primary",
		// The node namespace shares the host's conntrack table size, which a namespace
		// may not set.
		"--conntrack-max-per-core=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--iptables-min-sync-period=" + minSync.String(), // kube-proxy's min sync period in every mode but IPVS
		"--v=1",
	}
}

// fastClient is an admin client without client-side throttling, speaking protobuf (the
// apiserver decodes it for a fraction of JSON's CPU), for creating up to hundreds of
// thousands of objects.
func fastClient(e *env.Env) (kubernetes.Interface, error) {
	cfg := e.CP.RESTConfig()
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(cfg)
}

// retried runs do until it succeeds, fails for good, or has failed transiently (the
// apiserver timed out or was too busy, as it is when the machine is loaded while tens
// of thousands of objects are created) attempts times.
func retried(ctx context.Context, do func() error) error {
	return retriedEvery(ctx, time.Second, do)
}

// retriedEvery is retried with pauses of pause, 2·pause, … between attempts.
func retriedEvery(ctx context.Context, pause time.Duration, do func() error) error {
	const attempts = 5
	var err error
	for i := range attempts {
		if err = do(); err == nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(i+1) * pause):
		}
	}
	return fmt.Errorf("after %d attempts: %w", attempts, err)
}

// transient says whether a request may succeed when sent again.
func transient(err error) bool {
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsConflict(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
}

// load creates the generated Services (with their load-balancer status) and
// EndpointSlices, with NodePorts left to the apiserver, and endpoints of the
// generator's own node on node-1.
func load(ctx context.Context, client kubernetes.Interface, c *gen.Cluster, clients int) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gen.Namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return parallel(ctx, len(c.Services), clients, func(i int) error {
		if err := createService(ctx, client, c.Services[i]); err != nil {
			return err
		}
		slice := c.Slices[i].DeepCopy()
		slice.ResourceVersion = ""
		onThisNode(slice.Endpoints)
		err := createRetried(ctx, func() error {
			_, err := client.DiscoveryV1().EndpointSlices(gen.Namespace).Create(ctx, slice, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("creating EndpointSlice %s: %w", slice.Name, err)
		}
		return nil
	})
}

// createRetried runs create, retried while the apiserver is too busy; an object that
// already exists counts as created (an earlier attempt that timed out had created it).
func createRetried(ctx context.Context, create func() error) error {
	return retried(ctx, func() error {
		if err := create(); !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
}

// createService creates svc, NodePorts left to the apiserver, then sets its
// load-balancer status, each step retried while the apiserver is too busy.
func createService(ctx context.Context, client kubernetes.Interface, gsvc *corev1.Service) error {
	svc := gsvc.DeepCopy()
	svc.ResourceVersion = ""
	status := svc.Status
	svc.Status = corev1.ServiceStatus{}
	svc.Spec.HealthCheckNodePort = 0
	for k := range svc.Spec.Ports {
		svc.Spec.Ports[k].NodePort = 0
	}
	services := client.CoreV1().Services(gen.Namespace)
	err := createRetried(ctx, func() error {
		_, err := services.Create(ctx, svc, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("creating Service %s: %w", svc.Name, err)
	}
	if len(status.LoadBalancer.Ingress) == 0 {
		return nil
	}
	err = retried(ctx, func() error {
		cur, err := services.Get(ctx, svc.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = status
		_, err = services.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("setting Service %s's load-balancer status: %w", svc.Name, err)
	}
	return nil
}

// relabel writes each Service's and slice's service-proxy-name label as c holds it
// (gen.Cluster.LabelServed), as the EndpointSlice controller would copy it to the slice.
func relabel(ctx context.Context, client kubernetes.Interface, c *gen.Cluster, clients int) error {
	return parallel(ctx, len(c.Services), clients, func(i int) error {
		name := c.Services[i].Labels[gen.LabelServiceProxyName]
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, gen.LabelServiceProxyName, name)
		if _, err := client.CoreV1().Services(gen.Namespace).Patch(ctx, c.Services[i].Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling Service %s: %w", c.Services[i].Name, err)
		}
		if _, err := client.DiscoveryV1().EndpointSlices(gen.Namespace).Patch(ctx, c.Slices[i].Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling EndpointSlice %s: %w", c.Slices[i].Name, err)
		}
		return nil
	})
}

// deleteUnserved deletes the Services (and slices) of c not in served.
func deleteUnserved(ctx context.Context, client kubernetes.Interface, c *gen.Cluster, served []int, clients int) error {
	keep := make(map[int]bool, len(served))
	for _, i := range served {
		keep[i] = true
	}
	return parallel(ctx, len(c.Services), clients, func(i int) error {
		if keep[i] {
			return nil
		}
		if err := client.CoreV1().Services(gen.Namespace).Delete(ctx, c.Services[i].Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting Service %s: %w", c.Services[i].Name, err)
		}
		if err := client.DiscoveryV1().EndpointSlices(gen.Namespace).Delete(ctx, c.Slices[i].Name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("deleting EndpointSlice %s: %w", c.Slices[i].Name, err)
		}
		return nil
	})
}

// onThisNode moves the generator's local endpoints (gen.NodeName) to the node the
// proxies run as.
func onThisNode(eps []discoveryv1.Endpoint) {
	for k := range eps {
		if eps[k].NodeName != nil && *eps[k].NodeName == gen.NodeName {
			name := env.NodeName
			eps[k].NodeName = &name
		}
	}
}

// parallel runs do(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, do func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range next {
				if err := do(i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	for range workers {
		<-done
	}
	return context.Cause(ctx)
}

// median returns the median of v (0 when empty).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
