package app

import (
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
)

// nodeAddressesCommand is `shardproxy node-addresses`: the writer of the published node
// address list (otherNodeAddresses: published), run as a Deployment of one or more
// replicas that elect a leader.
func nodeAddressesCommand() *cli.Command {
	return &cli.Command{
		Name:  "node-addresses",
		Usage: "publish every Node's addresses in one ConfigMap for the supervisors with otherNodeAddresses: published (leader-elected; run beside the DaemonSet)",
		Description: `Watches every Node and writes their IP addresses, one line per Node, to the ConfigMap
--name in --namespace, only when an address changes (after --debounce), so that each
supervisor with otherNodeAddresses: published watches that one object instead of every
Node. Several replicas elect one writer with the Lease --lease-name in --namespace; a
new leader writes the whole list at once. Needs: nodes list and watch; configmaps get,
create and update, and leases get, create and update, in --namespace.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file (default: in-cluster, else the files of $KUBECONFIG merged, as kubectl does, else ~/.kube/config)"},
			&cli.StringFlag{Name: "namespace", Value: config.DefaultStatusNamespace, Usage: "namespace of the ConfigMap and the Lease (the supervisors' statusNamespace)"},
			&cli.StringFlag{Name: "name", Value: nodeaddrs.DefaultName, Usage: "the ConfigMap's name (the supervisors read " + nodeaddrs.DefaultName + ")"},
			&cli.StringFlag{Name: "lease-name", Value: nodeaddrs.DefaultLeaseName, Usage: "the Lease the replicas elect their writer with"},
			&cli.StringFlag{Name: "identity", Usage: "this replica's name in the Lease (default: $POD_NAME, else the host name and pid)"},
			&cli.DurationFlag{Name: "debounce", Value: nodeaddrs.DefaultDebounce, Usage: "wait after an address change for more before writing"},
		},
		Action: func(c *cli.Context) error {
			rc, err := operatorRESTConfig(c.String("kubeconfig"))
			if err != nil {
				return err
			}
			rc.QPS, rc.Burst = 5, 10
			rc.ContentType = config.ContentTypeProtobuf
			rc.AcceptContentTypes = config.ContentTypeProtobuf + "," + config.ContentTypeJSON
			rc.UserAgent = "shardproxy-node-addresses"
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
			w := &nodeaddrs.Writer{Client: client, Namespace: c.String("namespace"), Name: c.String("name"),
				Debounce: c.Duration("debounce"), Logger: klog.Background()}
			klog.Background().Info("Starting the node address writer", "identity", identity,
				"configMap", w.Namespace+"/"+w.Name, "debounce", w.Debounce.Round(time.Millisecond))
			return nodeaddrs.RunElected(c.Context, w, nodeaddrs.Election{Identity: identity, LeaseName: c.String("lease-name")})
		},
	}
}
