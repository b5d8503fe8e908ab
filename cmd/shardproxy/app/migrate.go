package app

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/shardproxy/shardproxy/migrate"
)

// operatorRESTConfig loads an operator's client configuration as kubectl does: the file
// given, else $KUBECONFIG (a list of files, merged by clientcmd's rules: the first file
// to set a value wins), else ~/.kube/config, else the in-cluster configuration.
func operatorRESTConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading a kubeconfig: %w", err)
	}
	return rc, nil
}

// migrateCommand is `shardproxy migrate plan|move|rollback`, run by an operator with a
// kubeconfig (not on a node).
func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "move Services between a legacy kube-proxy and shardproxy instances with no failed connection",
		Description: `A move first has the target instance program the chosen Services in shadow (label and annotation
shardproxy.io/shadow; an instance's rules run after a legacy kube-proxy's, so the legacy
rules still win), waits until every node running the target reports them programmed
(its shardproxy-node-<node> ConfigMap), and only then sets the label
service.kubernetes.io/service-proxy-name, which makes the legacy proxy let go. A rollback
first has the owning instance step back to a shadow (it keeps the rules but gives up the
health-check node port), waits until every node reports it, then moves the label back;
the shadow stays until every node reports that the proxy now named programmed the
Services (kube-proxy's iptables or nftables rules for them on the node), for up to --legacy-timeout,
past which it stays and the rollback fails. Nodes whose status went stale block a batch
while their Node is Ready; others, and Nodes without a status, are named.
Services are chosen by --namespace, --selector or names (namespace/name) as arguments.

A move or rollback holds the Lease shardproxy-migrate in --status-namespace while it runs:
a second run is refused and told who holds it. SIGINT or SIGTERM (Ctrl-C) finishes the
step in flight (labeling a batch every node confirmed) or puts the batch back where it
was, without a shadow; a second signal stops at once.`,
		Subcommands: []*cli.Command{migratePlanCommand(), migrateMoveCommand(), migrateRollbackCommand()},
	}
}

// selectionFlags choose the Services of a migrate subcommand, and reach the cluster.
func selectionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file (default: the files of $KUBECONFIG merged, as kubectl does, else ~/.kube/config, else in-cluster)"},
		&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "only Services in this namespace"},
		&cli.StringFlag{Name: "selector", Aliases: []string{"l"}, Usage: "only Services matching this label selector"},
		&cli.StringFlag{Name: "status-namespace", Value: migrate.DefaultNamespace, Usage: "namespace of the supervisors' node status ConfigMaps (statusNamespace in their config)"},
	}
}

// batchFlags are how move and rollback pace their batches.
func batchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "batch-size", Value: migrate.DefaultBatchSize, Usage: "Services moved together (at least 1)"},
		&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "how long every node gets to confirm a batch is programmed in shadow"},
	}
}

// migratePlanCommand is `migrate plan`.
func migratePlanCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "list the chosen Services, who serves them, and what behaves differently under shardproxy",
		ArgsUsage: "[namespace/name ...]",
		Flags:     append(selectionFlags(), outputFlag()),
		Action: func(c *cli.Context) error {
			format, err := outputFormat(c)
			if err != nil {
				return err
			}
			m, sel, err := newMover(c)
			if err != nil {
				return err
			}
			rows, err := m.Plan(c.Context, sel)
			if err != nil {
				return err
			}
			return writeOutput(c.App.Writer, format, map[string]any{"services": rows}, func() error { return migrate.WritePlan(c.App.Writer, rows) })
		},
	}
}

// migrateMoveCommand is `migrate move`.
func migrateMoveCommand() *cli.Command {
	return &cli.Command{
		Name:      "move",
		Usage:     "hand the chosen Services to the instances serving proxy name --to, batch by batch",
		ArgsUsage: "[namespace/name ...]",
		Flags:     append(append([]cli.Flag{&cli.StringFlag{Name: "to", Required: true, Usage: "the proxy name (label value) an instance serves"}}, selectionFlags()...), batchFlags()...),
		Action: func(c *cli.Context) error {
			m, sel, err := newMover(c)
			if err != nil {
				return err
			}
			return exclusive(c, m, func(ctx context.Context) error {
				rep, err := m.Move(ctx, sel, c.String("to"))
				fmt.Fprintf(c.App.Writer, "moved %d Services in %d batches (%d already there)\n", rep.Moved, rep.Batches, rep.Skipped)
				return err
			})
		},
	}
}

// migrateRollbackCommand is `migrate rollback`.
func migrateRollbackCommand() *cli.Command {
	return &cli.Command{
		Name:      "rollback",
		Usage:     "hand the chosen Services labeled --from back to the legacy proxy (unlabeled), or to --to",
		ArgsUsage: "[namespace/name ...]",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "from", Required: true, Usage: "the proxy name (label value) the Services carry now"},
			&cli.StringFlag{Name: "to", Usage: "the proxy name to give them (default: remove the label, for the legacy proxy)"},
			&cli.DurationFlag{Name: "legacy-timeout", Value: 5 * time.Minute, Usage: "how long the instance keeps serving in shadow, at most, while waiting for every node to report that the legacy proxy programmed them"},
		}, selectionFlags()...), batchFlags()...),
		Action: func(c *cli.Context) error {
			m, sel, err := newMover(c)
			if err != nil {
				return err
			}
			return exclusive(c, m, func(ctx context.Context) error {
				rep, err := m.Rollback(ctx, sel, c.String("from"), c.String("to"))
				fmt.Fprintf(c.App.Writer, "rolled back %d Services in %d batches (%d not labeled %s)\n", rep.Moved, rep.Batches, rep.Skipped, c.String("from"))
				return err
			})
		},
	}
}

// newMover returns the Mover and the Selection of a migrate subcommand's command line.
func newMover(c *cli.Context) (*migrate.Mover, migrate.Selection, error) {
	if c.IsSet("batch-size") && c.Int("batch-size") < 1 {
		return nil, migrate.Selection{}, newUsageError(c, fmt.Errorf("--batch-size %d: must be at least 1", c.Int("batch-size")))
	}
	rc, err := operatorRESTConfig(c.String("kubeconfig"))
	if err != nil {
		return nil, migrate.Selection{}, err
	}
	rc.QPS, rc.Burst = migrate.ClientQPS, migrate.ClientBurst // a kubeconfig sets none
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, migrate.Selection{}, err
	}
	// Node liveness is judged on the API server's clock, never on this machine's.
	clock, err := migrate.NewAPIServerClock(rc)
	if err != nil {
		return nil, migrate.Selection{}, err
	}
	m := &migrate.Mover{Client: client, Clock: clock, StatusNamespace: c.String("status-namespace"), Out: c.App.Writer,
		BatchSize: c.Int("batch-size"), Timeout: c.Duration("timeout"), LegacyTimeout: c.Duration("legacy-timeout")}
	return m, migrate.Selection{Namespace: c.String("namespace"), LabelSelector: c.String("selector"), Names: c.Args().Slice()}, nil
}

// exclusive runs a move or rollback holding the migrate Lease, and says on stderr what
// an interruption does.
func exclusive(c *cli.Context, m *migrate.Mover, do func(ctx context.Context) error) error {
	lock := &migrate.Lock{Client: m.Client, Namespace: m.StatusNamespace, Clock: m.Clock, Holder: leaseHolder(c)}
	ctx, release, err := lock.Acquire(c.Context)
	if err != nil {
		return err
	}
	defer release()
	stop := context.AfterFunc(c.Context, func() {
		fmt.Fprintln(c.App.ErrWriter, "interrupted: finishing the step in flight or putting the batch back; interrupt again to stop at once, leaving the batch as it is")
	})
	defer stop()
	return do(ctx)
}

// leaseHolder names this run in the migrate Lease, for the run it keeps out: who runs it,
// where, and the command line.
func leaseHolder(c *cli.Context) string {
	who := os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	host, _ := os.Hostname()
	cmd := strings.Join(append([]string{c.App.Name}, os.Args[1:]...), " ")
	if len(cmd) > 200 {
		cmd = cmd[:200] + "..."
	}
	return fmt.Sprintf("%s@%s pid %d: %s", who, host, os.Getpid(), cmd)
}
