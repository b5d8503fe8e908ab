package main

import (
	"fmt"
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
	selection := []cli.Flag{
		&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file (default: the files of $KUBECONFIG merged, as kubectl does, else ~/.kube/config, else in-cluster)"},
		&cli.StringFlag{Name: "namespace", Aliases: []string{"n"}, Usage: "only Services in this namespace"},
		&cli.StringFlag{Name: "selector", Aliases: []string{"l"}, Usage: "only Services matching this label selector"},
		&cli.StringFlag{Name: "status-namespace", Value: migrate.DefaultNamespace, Usage: "namespace of the supervisors' node status ConfigMaps (statusNamespace in their config)"},
	}
	batch := []cli.Flag{
		&cli.IntFlag{Name: "batch-size", Value: 20, Usage: "Services moved together"},
		&cli.DurationFlag{Name: "timeout", Value: 2 * time.Minute, Usage: "how long every node gets to confirm a batch is programmed in shadow"},
	}
	mover := func(c *cli.Context) (*migrate.Mover, migrate.Selection, error) {
		rc, err := operatorRESTConfig(c.String("kubeconfig"))
		if err != nil {
			return nil, migrate.Selection{}, err
		}
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
Services are chosen by --namespace, --selector or names (namespace/name) as arguments.`,
		Subcommands: []*cli.Command{
			{
				Name:      "plan",
				Usage:     "list the chosen Services, who serves them, and what behaves differently under shardproxy",
				ArgsUsage: "[namespace/name ...]",
				Flags:     selection,
				Action: func(c *cli.Context) error {
					m, sel, err := mover(c)
					if err != nil {
						return err
					}
					rows, err := m.Plan(c.Context, sel)
					if err != nil {
						return err
					}
					return migrate.WritePlan(c.App.Writer, rows)
				},
			},
			{
				Name:      "move",
				Usage:     "hand the chosen Services to the instances serving proxy name --to, batch by batch",
				ArgsUsage: "[namespace/name ...]",
				Flags:     append(append([]cli.Flag{&cli.StringFlag{Name: "to", Required: true, Usage: "the proxy name (label value) an instance serves"}}, selection...), batch...),
				Action: func(c *cli.Context) error {
					m, sel, err := mover(c)
					if err != nil {
						return err
					}
					rep, err := m.Move(c.Context, sel, c.String("to"))
					fmt.Fprintf(c.App.Writer, "moved %d Services in %d batches (%d already there)\n", rep.Moved, rep.Batches, rep.Skipped)
					return err
				},
			},
			{
				Name:      "rollback",
				Usage:     "hand the chosen Services labeled --from back to the legacy proxy (unlabeled), or to --to",
				ArgsUsage: "[namespace/name ...]",
				Flags: append(append([]cli.Flag{
					&cli.StringFlag{Name: "from", Required: true, Usage: "the proxy name (label value) the Services carry now"},
					&cli.StringFlag{Name: "to", Usage: "the proxy name to give them (default: remove the label, for the legacy proxy)"},
					&cli.DurationFlag{Name: "legacy-timeout", Value: 5 * time.Minute, Usage: "how long the instance keeps serving in shadow, at most, while waiting for every node to report that the legacy proxy programmed them"},
				}, selection...), batch...),
				Action: func(c *cli.Context) error {
					m, sel, err := mover(c)
					if err != nil {
						return err
					}
					rep, err := m.Rollback(c.Context, sel, c.String("from"), c.String("to"))
					fmt.Fprintf(c.App.Writer, "rolled back %d Services in %d batches (%d not labeled %s)\n", rep.Moved, rep.Batches, rep.Skipped, c.String("from"))
					return err
				},
			},
		},
	}
}
