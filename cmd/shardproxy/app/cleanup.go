package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/servicecidr"
)

// cleanupCommand deletes shardproxy's tables, or what a gone kube-proxy left.
func cleanupCommand() *cli.Command {
	return &cli.Command{
		Name:  "cleanup",
		Usage: "delete shardproxy's tables (all instances of the configuration, or one), or with --legacy the rules a gone kube-proxy left; never touches other tables",
		Description: `With --config (and optionally --instance): delete those instances' ip and ip6 tables.
--instance may name an instance that is no longer in the configuration (or give no
--config): its tables <prefix>-<instance> are deleted if they exist, the prefix taken from
--table-prefix, else the configuration, else "shardproxy"; it fails if there is none.
With --legacy iptables|ipvs instead: remove what an upstream kube-proxy in that mode left
on this node once it is gone: its KUBE-* iptables chains and the jumps to them (never
kubelet's or other components' chains, nor any nftables table that is not iptables'), and
for ipvs also its IPVS virtual services, kube-ipvs0 and ipsets. It refuses while a
kube-proxy still runs in this network namespace (run it on the host, or with hostPID)
unless --force. --legacy cannot be combined with --config or --instance: run cleanup twice.
With --all instead of --instance: every table of this node that carries shardproxy's
ownership marker under the prefix (--table-prefix, else the configuration's, else
"shardproxy"), whatever the configuration says: what an uninstall runs on each node
(deploy/cleanup). A table named like ours without the marker is left alone and listed.`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "supervisor configuration file: delete its instances' tables (with --instance or --all it only gives the prefix, and may be left out; not with --legacy)"},
			&cli.StringFlag{Name: "instance", Usage: "only this instance (may be one no longer in the configuration)"},
			&cli.BoolFlag{Name: "all", Usage: "every table carrying shardproxy's ownership marker under the prefix, configured or not (for an uninstall)"},
			&cli.StringFlag{Name: "table-prefix", Usage: "with --instance or --all: the prefix of the tables (default: the configuration's tablePrefix, else " + config.DefaultTablePrefix + ")"},
			&cli.StringFlag{Name: "legacy", Usage: "iptables or ipvs: clean up after a gone kube-proxy in that mode"},
			&cli.BoolFlag{Name: "force", Usage: "with --legacy: go on although a kube-proxy is still running"},
			&cli.BoolFlag{Name: "dry-run", Usage: "with --legacy: only print what would be removed"},
			&cli.StringFlag{Name: "kube-proxy-metrics-address", Value: legacy.DefaultKubeProxyMetricsAddress, Usage: `with --legacy: where a running kube-proxy answers /proxyMode ("-": do not ask)`},
		},
		Action: func(c *cli.Context) error {
			if c.IsSet("legacy") {
				if c.IsSet("config") || c.IsSet("instance") || c.IsSet("table-prefix") || c.IsSet("all") {
					return errors.New("--legacy cleans up after kube-proxy only: it cannot be combined with --config or --instance or --table-prefix (run cleanup twice)")
				}
				mode, err := legacy.ParseMode(c.String("legacy"))
				if err != nil {
					return err
				}
				return legacy.Cleanup(c.Context, legacy.Options{
					Mode: mode, Force: c.Bool("force"), DryRun: c.Bool("dry-run"), Out: c.App.Writer,
					KubeProxyMetricsAddress: c.String("kube-proxy-metrics-address"),
				})
			}
			for _, f := range []string{"force", "dry-run"} {
				if c.IsSet(f) {
					return fmt.Errorf("--%s only applies to --legacy", f)
				}
			}
			opts := cleanupOptions{config: c.String("config"), instance: c.String("instance"), tablePrefix: c.String("table-prefix")}
			if c.Bool("all") {
				if c.IsSet("instance") {
					return errors.New("--all and --instance exclude each other")
				}
				return cleanupAll(c.Context, c.App.Writer, opts)
			}
			if !c.IsSet("config") && !c.IsSet("instance") {
				return errors.New(`cleanup needs --config (shardproxy's tables), --all, or --legacy iptables|ipvs (a gone kube-proxy's rules)`)
			}
			if c.IsSet("table-prefix") && !c.IsSet("instance") {
				return errors.New("--table-prefix only applies to --instance or --all")
			}
			return cleanup(c.Context, c.App.Writer, opts)
		},
	}
}

// cleanupOptions say which of shardproxy's tables cleanup deletes.
type cleanupOptions struct {
	// config is the configuration file; empty when only instance is given.
	config string
	// instance limits the cleanup to one instance, configured or not.
	instance string
	// tablePrefix overrides the configuration's (or the default) table prefix.
	tablePrefix string
}

// cleanupPrefix is the table prefix of opts (--table-prefix, else the configuration's,
// else the default) and the configured instances.
func cleanupPrefix(opts cleanupOptions) (string, []config.Instance, error) {
	prefix := config.DefaultTablePrefix
	var instances []config.Instance
	if opts.config != "" {
		cfg, err := config.Load(opts.config)
		if err != nil {
			return "", nil, err
		}
		prefix = cfg.TablePrefix
		instances = cfg.Instances
	}
	if opts.tablePrefix != "" {
		prefix = opts.tablePrefix
	}
	return prefix, instances, nil
}

// cleanupAll deletes every ip and ip6 table carrying shardproxy's ownership marker
// under the prefix, instances' and the supervisor's node table (an uninstall: the configuration may be gone or out of date), and
// lists the tables under the prefix without it, which are someone else's and stay. It
// succeeds when there is nothing to delete, so that it can run again.
func cleanupAll(ctx context.Context, w io.Writer, opts cleanupOptions) error {
	prefix, _, err := cleanupPrefix(opts)
	if err != nil {
		return err
	}
	deleted := 0
	var errs []error
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := tables.ListTables(ctx, fam)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, t := range listed {
			if _, named := tables.InstanceOfTable(prefix, t.Name); !named {
				continue
			}
			if _, owned := t.OwnedInstance(prefix); !owned {
				fmt.Fprintf(w, "left table %s %s: not shardproxy's (comment %q)\n", tables.KnftFamily(fam), t.Name, t.Comment)
				continue
			}
			if err := deleteTable(ctx, fam, t.Name); err != nil {
				errs = append(errs, fmt.Errorf("table %s %s: %w", tables.KnftFamily(fam), t.Name, err))
				continue
			}
			deleted++
			fmt.Fprintf(w, "deleted table %s %s\n", tables.KnftFamily(fam), t.Name)
		}
	}
	// The supervisor's node table, named and marked on its own (tables/servicecidr).
	nodeDeleted, err := servicecidr.Remove(ctx, prefix, tables.NewNFT, tables.ListTables)
	for _, fam := range nodeDeleted {
		deleted++
		fmt.Fprintf(w, "deleted table %s %s\n", tables.KnftFamily(fam), servicecidr.TableName(prefix))
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("node table: %w", err))
	}
	fmt.Fprintf(w, "%d shardproxy tables deleted (prefix %s)\n", deleted, prefix)
	return errors.Join(errs...)
}

func cleanup(ctx context.Context, w io.Writer, opts cleanupOptions) error {
	prefix, instances, err := cleanupPrefix(opts)
	if err != nil {
		return err
	}
	found := false
	var errs []error
	for _, inst := range instances {
		if opts.instance != "" && inst.Name != opts.instance {
			continue
		}
		found = true
		for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
			if err := deleteTable(ctx, fam, inst.TableName(prefix)); err != nil {
				errs = append(errs, fmt.Errorf("instance %s %s: %w", inst.Name, fam, err))
				continue
			}
			fmt.Fprintf(w, "deleted table %s %s (if it existed)\n", tables.KnftFamily(fam), inst.TableName(prefix))
		}
	}
	if !found {
		return cleanupUnconfigured(ctx, w, opts, prefix)
	}
	if opts.instance == "" {
		// The whole configuration: the supervisor's node table goes with its instances.
		deleted, err := servicecidr.Remove(ctx, prefix, tables.NewNFT, tables.ListTables)
		for _, fam := range deleted {
			fmt.Fprintf(w, "deleted table %s %s\n", tables.KnftFamily(fam), servicecidr.TableName(prefix))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node table: %w", err))
		}
	}
	return errors.Join(errs...)
}

// cleanupUnconfigured deletes the tables of an instance that is not in the configuration
// (one removed from it, typically). As the name comes from nowhere but the command line,
// it must name tables that exist: a typo fails rather than pretending to clean up. Only
// tables carrying shardproxy's ownership marker (tables.OwnerComment) are deleted: one
// that only has the name is another component's, and refused.
func cleanupUnconfigured(ctx context.Context, w io.Writer, opts cleanupOptions, prefix string) error {
	name := opts.instance
	table := tables.TableName(prefix, name)
	what := fmt.Sprintf("instance %q", name)
	if opts.config != "" {
		what = fmt.Sprintf("no instance %q in %s", name, opts.config)
	}
	if msgs := content.IsDNS1123Label(name); len(msgs) > 0 {
		return fmt.Errorf("%s: not a valid instance name: %s", what, strings.Join(msgs, "; "))
	}
	if len(table) > config.MaxTableNameLength {
		return fmt.Errorf("%s: its table name %s is longer than %d characters", what, table, config.MaxTableNameLength)
	}
	deleted := 0
	var errs []error
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := tables.ListTables(ctx, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: looking for its tables: %w", what, err))
			continue
		}
		i := slices.IndexFunc(listed, func(t tables.ListedTable) bool { return t.Name == table })
		if i < 0 {
			continue
		}
		if _, ok := listed[i].OwnedInstance(prefix); !ok {
			errs = append(errs, fmt.Errorf("%s: table %s %s is not shardproxy's (its comment is %q, not %q): not deleting it",
				what, tables.KnftFamily(fam), table, listed[i].Comment, tables.OwnerComment(name, "<supervisor>")))
			continue
		}
		if err := deleteTable(ctx, fam, table); err != nil {
			errs = append(errs, fmt.Errorf("instance %s %s: %w", name, fam, err))
			continue
		}
		deleted++
		fmt.Fprintf(w, "deleted table %s %s\n", tables.KnftFamily(fam), table)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if deleted == 0 {
		return fmt.Errorf("%s: no table ip or ip6 %s on this node, nothing to delete", what, table)
	}
	return nil
}

// deleteTable deletes one table (nothing when it does not exist).
func deleteTable(ctx context.Context, fam tables.Family, name string) error {
	nft, err := tables.NewNFT(fam, name)
	if err != nil {
		return err
	}
	return tables.DeleteTable(ctx, nft)
}
