package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
)

// nodeAddressesCommand is `shardproxy node-addresses`: the writer of the published node
// address list (otherNodeAddresses: published), run as a Deployment of one or more
// replicas that elect a leader.
func nodeAddressesCommand(b Build) *cli.Command {
	return &cli.Command{
		Name:  "node-addresses",
		Usage: "publish every Node's addresses in one ConfigMap for the supervisors with otherNodeAddresses: published (leader-elected; run beside the DaemonSet)",
		Description: `Watches every Node and writes their IP addresses, one line per Node, to the ConfigMap
--name in --namespace, only when an address changes (after --debounce), so that each
supervisor with otherNodeAddresses: published watches that one object instead of every
Node. Several replicas elect one writer with the Lease --lease-name in --namespace; a
new leader writes the whole list at once. Needs: nodes list and watch; configmaps get,
create and update, and list and watch it (to write it back when it is deleted or edited),
and leases get, create and update, in --namespace.

--max-egress bounds the API server's egress for the list: each write is sent whole to
every supervisor that reads it (about one per Node), so a write follows the one before
by at least Nodes × list bytes / --max-egress (at 50Mi: ~2 s at 1,000 Nodes, ~51 s at
5,000). A change after a quiet period is written after --debounce alone; under
sustained churn the next write waits for the budget and carries every change gathered
meanwhile. 0 turns the budget off.

--bind-address serves /healthz (200 while standing by or publishing; 503 while leading
and unable to publish, or to watch the Nodes or the ConfigMap, for longer than
--sync-timeout; a list too large to write is logged and counted, not 503) and
/metrics. A leader whose first lists are not in within --sync-timeout, or whose writer
returns, releases the Lease (a standby takes over) and exits non-zero.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file (default: in-cluster, else the files of $KUBECONFIG merged, as kubectl does, else ~/.kube/config)"},
			&cli.StringFlag{Name: "namespace", Value: config.DefaultStatusNamespace, Usage: "namespace of the ConfigMap and the Lease (the supervisors' statusNamespace)"},
			&cli.StringFlag{Name: "name", Value: nodeaddrs.DefaultName, Usage: "the ConfigMap's name (the supervisors read " + nodeaddrs.DefaultName + ")"},
			&cli.StringFlag{Name: "lease-name", Value: nodeaddrs.DefaultLeaseName, Usage: "the Lease the replicas elect their writer with"},
			&cli.StringFlag{Name: "identity", Usage: "this replica's name in the Lease (default: $POD_NAME, else the host name and pid)"},
			&cli.DurationFlag{Name: "debounce", Value: nodeaddrs.DefaultDebounce, Usage: "wait after an address change for more before writing"},
			&cli.StringFlag{Name: "max-egress", Value: "50Mi", Usage: "budget of the list's fan-out, in bytes a second, as a Kubernetes quantity (50Mi, 10M) or a plain number; 0: none"},
			&cli.DurationFlag{Name: "sync-timeout", Value: nodeaddrs.DefaultSyncTimeout, Usage: "bound on the leader's first list of the Nodes and the ConfigMap; past it the writer releases the Lease and exits"},
			&cli.StringFlag{Name: "bind-address", Value: DefaultNodeAddressesBindAddress, Usage: "address of /healthz and /metrics (empty: none)"},
		},
		Action: func(c *cli.Context) error {
			rc, err := nodeAddressesRESTConfig(c.String("kubeconfig"))
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return fmt.Errorf("creating API client: %w", err)
			}
			identity := c.String("identity")
			if identity == "" {
				identity = os.Getenv("POD_NAME")
			}
			if identity == "" {
				host, _ := os.Hostname()
				identity = fmt.Sprintf("%s-%d", host, os.Getpid())
			}
			maxEgress, err := parseMaxEgress(c.String("max-egress"))
			if err != nil {
				return err
			}
			w := &nodeaddrs.Writer{Client: client, Namespace: c.String("namespace"), Name: c.String("name"),
				Debounce: c.Duration("debounce"), MaxEgress: maxEgress, SyncTimeout: c.Duration("sync-timeout"),
				Logger: klog.Background()}
			if w.Name == "" {
				w.Name = nodeaddrs.DefaultName
			}
			m := metrics.NewNodeAddressWriter(w.Namespace + "/" + w.Name)
			m.SetBuildInfo(b.version())
			w.Recorder = m
			ctx, stop := context.WithCancel(c.Context)
			defer stop()
			served := make(chan error, 1)
			if addr := c.String("bind-address"); addr != "" {
				l, err := net.Listen("tcp", addr)
				if err != nil {
					return fmt.Errorf("listening on --bind-address %s: %w", addr, err)
				}
				go func() { served <- serveNodeAddresses(ctx, l, w, m) }()
			} else {
				close(served)
			}
			klog.Background().Info("Starting the node address writer", "identity", identity,
				"configMap", w.Namespace+"/"+w.Name, "debounce", w.Debounce.Round(time.Millisecond), "maxEgress", w.MaxEgress, "bindAddress", c.String("bind-address"))
			err = nodeaddrs.RunElected(ctx, w, nodeaddrs.Election{Identity: identity, LeaseName: c.String("lease-name")})
			stop()
			return errors.Join(err, <-served)
		},
	}
}

// parseMaxEgress reads --max-egress: a Kubernetes quantity of bytes a second ("50Mi",
// "10M", "52428800"), whole and not negative.
func parseMaxEgress(s string) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("--max-egress %q: %w", s, err)
	}
	v, ok := q.AsInt64()
	if !ok || v < 0 {
		return 0, fmt.Errorf("--max-egress %q: want a whole number of bytes a second, 0 or more", s)
	}
	return v, nil
}

// nodeAddressesRESTConfig is the node address writer's API client configuration: the
// kubeconfig found as kubectl finds it (the writer runs as a Deployment, in-cluster, or
// by hand), with the supervisor's defaulted clientConnection (kube-proxy's QPS, burst
// and protobuf).
func nodeAddressesRESTConfig(kubeconfig string) (*rest.Config, error) {
	rc, err := operatorRESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	var cc config.ClientConnection
	cc.Default()
	rc = withClientConnection(rc, cc)
	rc.UserAgent = nodeAddressesUserAgent
	return rc, nil
}

// nodeAddressesUserAgent names the writer in the API server's audit log and metrics.
const nodeAddressesUserAgent = "shardproxy-node-addresses"

// DefaultNodeAddressesBindAddress is where `shardproxy node-addresses` serves /healthz
// and /metrics: every address of its pod (it runs in the pod's network, not the host's),
// for the kubelet's probes and Prometheus.
const DefaultNodeAddressesBindAddress = "0.0.0.0:10256"

// serveNodeAddresses serves the writer's /healthz and m's /metrics on l until ctx ends.
func serveNodeAddresses(ctx context.Context, l net.Listener, w *nodeaddrs.Writer, m *metrics.NodeAddressWriter) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		rw.Header().Set("X-Content-Type-Options", "nosniff")
		if err := w.Healthy(); err != nil {
			rw.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(rw, "unhealthy: %v\n", err)
			return
		}
		fmt.Fprintln(rw, "ok")
	})
	mux.Handle("/metrics", m.Handler())
	if err := healthcheck.Serve(ctx, l, mux); err != nil {
		return fmt.Errorf("serving /healthz and /metrics on %s: %w", l.Addr(), err)
	}
	return nil
}
