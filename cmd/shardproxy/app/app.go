package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/supervisor"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/servicecidr"
)

// Run runs the command line args of the binary b and returns the exit code: 0,
// exitFailure when the command failed, exitUsage when the command line is wrong.
//
// The first SIGINT or SIGTERM ends the commands' context: `run` stops its instances,
// `migrate move` and `rollback` finish the step in flight or put the batch back. Then
// the signals get their default action again, so a second one ends the process at once
// (as Kubernetes components do).
func Run(args []string, stdout, stderr io.Writer, b Build) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	context.AfterFunc(ctx, stop)
	return exitCode(New(stdout, stderr, b).RunContext(ctx, args), stderr)
}

// configFlag is --config, required by the commands that read a configuration.
func configFlag() *cli.StringFlag {
	return &cli.StringFlag{
		Name: "config", Aliases: []string{"c"}, Required: true,
		Usage: "supervisor configuration file (see supervisor/config/example.yaml)",
	}
}

// New returns the command tree of the binary b, writing to stdout and stderr. Building it
// starts nothing: the docs tests (docs/clicheck) read it to check the command lines the
// documentation names.
func New(stdout, stderr io.Writer, b Build) *cli.App {
	logging := logsapi.NewLoggingConfiguration()
	logFlags := loggingFlags(logging)
	app := &cli.App{
		Name:      "shardproxy",
		Usage:     "run several Kubernetes service proxy instances side by side on one node, on nftables",
		Writer:    stdout,
		ErrWriter: stderr,
		// run turns errors into exit codes; urfave/cli must never exit the process.
		ExitErrHandler: func(*cli.Context, error) {},
		OnUsageError:   onUsageError,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "version", Usage: "print the version and exit (as the version command)"},
		}, logFlags...),
		Action: func(c *cli.Context) error {
			if c.Bool("version") {
				printVersion(c.App.Writer, b)
				return nil
			}
			return commandNotFound(c)
		},
		Description: `Each instance serves the Services labeled service.kubernetes.io/service-proxy-name: <one of
its proxyNames> (one optional default instance serves unlabeled Services) and writes its own
"ip" and "ip6" tables, named <tablePrefix>-<instance>, hooked at priorities no other
instance uses. Start with "shardproxy check --config FILE", then "shardproxy run --config FILE".`,
		Commands: []*cli.Command{
			{
				Name:  "run",
				Usage: "run the supervisor and its instances until SIGTERM/SIGINT (rules stay in place on exit)",
				Flags: []cli.Flag{configFlag()},
				Action: func(c *cli.Context) error {
					return runSupervisor(c.Context, c.String("config"), b.version())
				},
			},
			{
				Name:  "check",
				Usage: "validate the configuration, probe the host, and print each instance's tables and priorities",
				Flags: []cli.Flag{configFlag(), &cli.BoolFlag{Name: "skip-probe", Usage: "do not ask the kernel whether it accepts the rules"}},
				Action: func(c *cli.Context) error {
					return check(c.Context, c.App.Writer, c.App.ErrWriter, c.String("config"), !c.Bool("skip-probe"))
				},
			},
			{
				Name:  "render",
				Usage: "offline: print the nft script an instance would load for Service/EndpointSlice YAML files",
				Flags: []cli.Flag{configFlag(),
					&cli.StringFlag{Name: "instance", Required: true, Usage: "instance name"},
					&cli.StringFlag{Name: "from", Required: true, Usage: "directory (or file) of YAML/JSON Services, EndpointSlices and, for the node-wide address rules, Nodes (this one and the others) and ServiceCIDRs"},
				},
				Action: func(c *cli.Context) error {
					return render(c.App.Writer, c.App.ErrWriter, c.String("config"), c.String("instance"), c.String("from"))
				},
			},
			cleanupCommand(),
			migrateCommand(),
			configCommand(),
			completionCommand(),
			statusCommand(),
			nodeAddressesCommand(b),
			{
				Name:  "version",
				Usage: "print the version",
				Action: func(c *cli.Context) error {
					printVersion(c.App.Writer, b)
					return nil
				},
			},
		},
	}
	setupCommands(app.Commands, logFlags, func() error {
		return logsapi.ValidateAndApplyWithOptions(logging, &logsapi.LoggingOptions{ErrorStream: stderr, InfoStream: stdout}, nil)
	})
	return app
}

// statusCommand is `status`: this node's supervisor, or with --cluster every instance
// across the nodes.
func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "print the running supervisor's per-instance status (from its /status endpoint), or with --cluster every instance across the nodes",
		Description: `Without --cluster: the supervisor on this node, from its /status endpoint (loopback only).
With --cluster: every node's status ConfigMap in --status-namespace, the Nodes and the
Services (paged lists, with an operator's kubeconfig), summed up per instance: nodes
running it, how many report it healthy, failing or stale (and why, node by node), the
Services that are its to serve, and the oldest last sync its nodes report (to within
5 minutes on healthy nodes). A status is stale when the API server stored it more than
10 minutes ago, by the server's clock.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "address", Usage: "the supervisor's healthz address (default: the configuration's healthzBindAddress on loopback)"},
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Value: defaultPodConfig, Usage: "the supervisor's configuration, for its healthzBindAddress (the DaemonSet's path; if it does not exist and --config is not given, " + config.DefaultHealthzBindAddress + ")"},
			&cli.BoolFlag{Name: "cluster", Usage: "every instance across the nodes, from their status ConfigMaps (needs a kubeconfig)"},
			&cli.StringFlag{Name: "instance", Usage: "only this instance"},
			&cli.StringFlag{Name: "kubeconfig", Usage: "with --cluster: kubeconfig file (default: the files of $KUBECONFIG merged, as kubectl does, else ~/.kube/config, else in-cluster)"},
			&cli.StringFlag{Name: "status-namespace", Value: migrate.DefaultNamespace, Usage: "with --cluster: namespace of the supervisors' node status ConfigMaps (statusNamespace in their config)"},
			outputFlag(),
		},
		Action: func(c *cli.Context) error {
			format, err := outputFormat(c)
			if err != nil {
				return err
			}
			if c.Bool("cluster") {
				return clusterStatus(c.Context, c.App.Writer, c.String("kubeconfig"), c.String("status-namespace"), c.String("instance"), format)
			}
			addr, err := statusAddress(c.String("address"), c.String("config"), c.IsSet("config"))
			if err != nil {
				return err
			}
			return status(c.Context, c.App.Writer, addr, c.String("instance"), format)
		},
	}
}

// runSupervisor runs the supervisor of the binary's version until ctx ends (Run's first
// SIGTERM or SIGINT).
func runSupervisor(ctx context.Context, path, version string) error {
	logger := klog.Background()
	logger.Info("Starting shardproxy", "version", version)
	logger.V(2).Info("Reading the configuration", "path", path)
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading supervisor config: %w", err)
	}
	cfg, err := config.Parse(data, path)
	if err != nil {
		return err
	}
	rc, err := restConfig(cfg.Kubeconfig, cfg.ClientConnection)
	if err != nil {
		return err
	}
	// The client's requests are counted as kube-proxy's rest_client_* series.
	m := metrics.New()
	rc.Wrap(m.InstrumentTransport)
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating API client: %w", err)
	}
	gcPercent := supervisor.TuneGC(os.Getenv, debug.SetGCPercent)
	s, err := supervisor.New(cfg, supervisor.Deps{Client: client, Version: version, Direct: netlinkFaults(os.Getenv), Metrics: m,
		FullSync: supervisor.NewGCTarget(gcPercent, debug.SetGCPercent), ConfigFile: path, ConfigData: data})
	if err != nil {
		return err
	}
	logger.Info("Configuration loaded", "node", cfg.NodeName, "instances", len(cfg.Instances), "gcPercent", gcPercent)
	return s.Run(ctx)
}

// restConfig is the supervisor's API client configuration: the kubeconfig (else
// in-cluster), paced and encoded as clientConnection says.
func restConfig(kubeconfig string, cc config.ClientConnection) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no kubeconfig in the configuration and not running in a cluster: %w", err)
		}
	} else if rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return withClientConnection(rc, cc), nil
}

// withClientConnection paces and encodes rc as cc says and returns it: the one place a
// node component's API client (the supervisor's, the node address writer's) takes its
// settings from a ClientConnection.
func withClientConnection(rc *rest.Config, cc config.ClientConnection) *rest.Config {
	rc.QPS, rc.Burst = cc.QPS, int(cc.Burst)
	rc.ContentType, rc.AcceptContentTypes = cc.ContentType, cc.AcceptContentTypes
	return rc
}

func check(ctx context.Context, w, ew io.Writer, path string, probe bool) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: configuration is valid (node %q, %d instances)\n\n", path, cfg.NodeName, len(cfg.Instances))
	for _, warning := range checkWarnings(cfg) {
		fmt.Fprintln(ew, "warning:", warning)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tSERVES\tTABLES\tSLOT\tFIREWALL\tDNAT\tFILTER\tSNAT")
	for _, inst := range cfg.Instances {
		p, err := tables.PrioritiesFor(*inst.Slot)
		if err != nil {
			return err
		}
		serves := strings.Join(inst.ProxyNames, ",")
		if inst.Default {
			serves = strings.Trim("<unlabeled>,"+serves, ",")
		}
		name := inst.TableName(cfg.TablePrefix)
		fmt.Fprintf(tw, "%s\t%s\tip %s, ip6 %s\t%d\t%d\t%d\t%d\t%d\n", inst.Name, serves, name, name, *inst.Slot, p.Firewall, p.DNAT, p.Filter, p.SNAT)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\n"+nodeTableLine(cfg))
	if !probe {
		return nil
	}
	if err := tables.Probe(ctx, tables.NewNFT); err != nil {
		return fmt.Errorf("host probe: %w", err)
	}
	fmt.Fprintln(w, "\nhost probe: nft and the kernel accept every rule shape (IPv4 and IPv6)")
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := tables.ListTables(ctx, fam)
		if err != nil {
			return fmt.Errorf("host probe: %w", err)
		}
		for _, warning := range tableOwnerWarnings(cfg, fam, listed) {
			fmt.Fprintln(ew, "warning:", warning)
		}
	}
	return nil
}

// tableOwnerWarnings names the tables under cfg's prefix that this supervisor's orphan
// cleanup leaves alone although they carry shardproxy's marker: another supervisor's
// with the same prefix (its instances' tables would collide with any of the same name),
// and those of an earlier version, whose marker names no supervisor.
func tableOwnerWarnings(cfg *config.Config, fam tables.Family, listed []tables.ListedTable) []string {
	me := cfg.SupervisorIdentity()
	var out []string
	for _, t := range listed {
		inst, owner, ok := t.Owner(cfg.TablePrefix)
		switch {
		case !ok || owner == me:
		case owner == "":
			out = append(out, fmt.Sprintf("table %s %s (instance %q) has an earlier version's ownership marker, which names no supervisor: "+
				"the running supervisor rewrites it if the instance is configured, else leaves it; `shardproxy cleanup --instance %s` deletes it",
				tables.KnftFamily(fam), t.Name, inst, inst))
		default:
			out = append(out, fmt.Sprintf("table %s %s (instance %q) belongs to another supervisor, %s, with the same tablePrefix %q: "+
				"this one leaves it alone; give each supervisor its own prefix", tables.KnftFamily(fam), t.Name, inst, owner, cfg.TablePrefix))
		}
	}
	return out
}

// nodeTableLine says what `check` shows of the supervisor's node-wide table.
func nodeTableLine(cfg *config.Config) string {
	name := servicecidr.TableName(cfg.TablePrefix)
	if !*cfg.ServiceCIDRDrop {
		return fmt.Sprintf("node table: off (serviceCIDRDrop: false); ip %s and ip6 %s are deleted if present", name, name)
	}
	return fmt.Sprintf("node table: ip %s, ip6 %s: drops new connections still addressed into a ServiceCIDR "+
		"(forward and output hooks, filter priority %d; only while the API server serves ServiceCIDRs)", name, name, servicecidr.Priority)
}

// checkWarnings lists what a valid configuration exposes that it probably should not.
func checkWarnings(cfg *config.Config) []string {
	var warnings []string
	if cfg.EnableProfiling && !loopbackOnly(cfg.MetricsBindAddress) {
		warnings = append(warnings, fmt.Sprintf("enableProfiling serves pprof (heap, goroutine stacks, command line, CPU profiles on demand) "+
			"without authentication on metricsBindAddress %s, which is not a loopback address: anyone who can reach it can read "+
			"them and make the supervisor spend CPU; bind metricsBindAddress to 127.0.0.1 or turn enableProfiling off", cfg.MetricsBindAddress))
	}
	return warnings
}

// loopbackOnly reports whether a listener on hostport (ip:port, as validated) is reachable
// only from the node itself; an empty or unspecified host listens on every address.
func loopbackOnly(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// defaultPodConfig is where the DaemonSet mounts the configuration, so that `shardproxy
// status` in the pod finds the address the supervisor serves on, not kube-proxy's.
const defaultPodConfig = "/etc/shardproxy/config.yaml"

// statusAddress is where `shardproxy status` asks: addr if given, else the
// configuration's healthzBindAddress (its default when unset) with an unspecified host
// made loopback, since /status answers loopback clients only. A configuration file that
// was not asked for explicitly may be missing (run off the pod): then kube-proxy's port.
func statusAddress(addr, path string, explicit bool) (string, error) {
	if addr != "" {
		return addr, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return loopbackFor(config.DefaultHealthzBindAddress), nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the healthz address from the configuration: %w", err)
	}
	cfg, err := config.Decode(data, path)
	if err != nil {
		return "", err
	}
	if cfg.HealthzBindAddress == "" {
		return loopbackFor(config.DefaultHealthzBindAddress), nil
	}
	return loopbackFor(cfg.HealthzBindAddress), nil
}

// loopbackFor turns a bind address on every address (0.0.0.0, ::, or no host) into the
// matching loopback address; a specific address stays.
func loopbackFor(bind string) string {
	host, port, err := net.SplitHostPort(bind)
	if err != nil {
		return bind
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// clusterStatus prints every instance across the nodes (ReadClusterStatus).
func clusterStatus(ctx context.Context, w io.Writer, kubeconfig, namespace, instance, format string) error {
	rc, err := operatorRESTConfig(kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	clock, err := migrate.NewAPIServerClock(rc)
	if err != nil {
		return err
	}
	cs, err := migrate.ReadClusterStatus(ctx, client, namespace, clock, instance)
	if err != nil {
		return err
	}
	return writeOutput(w, format, cs, func() error { return migrate.WriteClusterStatus(w, cs) })
}

func status(ctx context.Context, w io.Writer, addr, instance, format string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("reading status from %s (is the supervisor running?): %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("reading status from %s: %s: %s (the supervisor answers /status only on loopback: "+
			"run this on the node, with --address 127.0.0.1:<healthz port>)", addr, resp.Status, strings.TrimSpace(string(body)))
	}
	var st healthcheck.StatusResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return fmt.Errorf("decoding status: %w", err)
	}
	if instance != "" {
		i, ok := st.Instances[instance]
		if !ok {
			return fmt.Errorf("the supervisor at %s runs no instance %q", addr, instance)
		}
		st.Instances = map[string]healthcheck.InstanceStatus{instance: i}
	}
	return writeOutput(w, format, st, func() error { return printStatus(w, st) })
}

func printStatus(w io.Writer, st healthcheck.StatusResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tUP\tHEALTHY\tSERVICES\tENDPOINTS\tLAST SYNC\tLAST ERROR\tSTALE")
	names := make([]string, 0, len(st.Instances))
	for n := range st.Instances {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		i := st.Instances[n]
		last := "-"
		if !i.LastUpdated.IsZero() {
			last = i.LastUpdated.Format(time.RFC3339)
		}
		stale := "-"
		if i.Stale != "" {
			stale = i.Stale
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%d\t%s\t%s\t%s\n", n, i.Up, i.Healthy, i.Services, i.Endpoints, last, i.LastError, stale)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case st.NodeDeleting:
		fmt.Fprintln(w, "\nnode: being deleted; /healthz answers 503 (nodeEligible false) so that load balancers drain it")
	case st.NodeToBeDeleted:
		fmt.Fprintln(w, "\nnode: tainted "+healthcheck.ToBeDeletedTaint+"; /healthz answers 503 (nodeEligible false) so that load balancers drain it")
	}
	if c := st.Config; c != nil {
		fmt.Fprintf(w, "\nconfiguration %s, applied %s\n", c.Hash, c.Applied.Format(time.RFC3339))
		if c.Refused != "" {
			fmt.Fprintf(w, "newest file refused: %s\n", c.Refused)
		}
	}
	return nil
}

func render(w, ew io.Writer, path, inst, from string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	objects, err := readObjects(from)
	if err != nil {
		return err
	}
	script, problems, err := supervisor.Render(cfg, inst, objects)
	if err != nil {
		return err
	}
	for _, p := range problems {
		fmt.Fprintln(ew, "warning:", p)
	}
	_, err = io.WriteString(w, script)
	return err
}

// readObjects reads Services, EndpointSlices, Nodes and ServiceCIDRs from YAML/JSON
// files; other kinds are skipped.
func readObjects(from string) (supervisor.RenderInput, error) {
	var files []string
	if st, err := os.Stat(from); err != nil {
		return supervisor.RenderInput{}, err
	} else if st.IsDir() {
		for _, pat := range []string{"*.yaml", "*.yml", "*.json"} {
			m, _ := filepath.Glob(filepath.Join(from, pat))
			files = append(files, m...)
		}
		sort.Strings(files)
	} else {
		files = []string{from}
	}
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	_ = discoveryv1.AddToScheme(scheme)
	_ = networkingv1.AddToScheme(scheme)
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	var in supervisor.RenderInput
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return supervisor.RenderInput{}, err
		}
		r := utilyaml.NewYAMLReader(newBufReader(fh))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				fh.Close()
				return supervisor.RenderInput{}, fmt.Errorf("%s: %w", f, err)
			}
			if strings.TrimSpace(string(doc)) == "" {
				continue
			}
			obj, _, err := decoder.Decode(doc, nil, nil)
			if err != nil {
				fh.Close()
				return supervisor.RenderInput{}, fmt.Errorf("%s: document %d: %w", f, i+1, err)
			}
			switch o := obj.(type) {
			case *corev1.Service:
				in.Services = append(in.Services, o)
			case *discoveryv1.EndpointSlice:
				in.Slices = append(in.Slices, o)
			case *corev1.Node:
				in.Nodes = append(in.Nodes, o)
			case *networkingv1.ServiceCIDR:
				in.ServiceCIDRs = append(in.ServiceCIDRs, o)
			}
		}
		fh.Close()
	}
	return in, nil
}
