package servicecidr

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
)

// Options are a Keeper's settings and side-effect seams.
type Options struct {
	// TablePrefix names the node table (TableName).
	TablePrefix string
	// NFT opens one table of the host.
	NFT func(fam tables.Family, table string) (knftables.Interface, error)
	// ListTables lists the host's tables of one family, to notice the node table was
	// deleted from outside.
	ListTables func(ctx context.Context, fam tables.Family) ([]tables.ListedTable, error)
	// CIDRs returns the cluster's ServiceCIDRs now.
	CIDRs func() []netip.Prefix
	// Logger logs what the keeper does.
	Logger klog.Logger
}

// Keeper keeps the node table of both families in line with the cluster's ServiceCIDRs:
// it rewrites a family's table when its CIDRs change, when it was deleted from outside,
// and after a failed write.
type Keeper struct {
	opts    Options
	changed chan struct{}
	// written holds what each family's table was last written with; a family is absent
	// until written, and again after a failed write. Only Run's goroutine uses it.
	written map[tables.Family][]netip.Prefix
}

// NewKeeper returns a Keeper; nothing is written before Run.
func NewKeeper(opts Options) *Keeper {
	return &Keeper{opts: opts, changed: make(chan struct{}, 1), written: map[tables.Family][]netip.Prefix{}}
}

// Changed tells the keeper the ServiceCIDRs changed. It never blocks: watch handlers
// call it.
func (k *Keeper) Changed() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// Run writes the tables, then keeps them current until ctx ends, checking every
// checkEvery that they still exist. The tables stay when it returns: a supervisor
// restarting keeps dropping.
func (k *Keeper) Run(ctx context.Context, checkEvery time.Duration) {
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	k.Sync(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.changed:
		case <-t.C:
		}
		k.Sync(ctx)
	}
}

// Sync brings both families' tables up to date once, logging failures (the next Sync
// retries them).
func (k *Keeper) Sync(ctx context.Context) {
	want := Collapse(k.opts.CIDRs())
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		famWant := slices.DeleteFunc(slices.Clone(want), func(p netip.Prefix) bool { return !fam.Contains(p.Addr()) })
		logger := k.opts.Logger.WithValues("family", tables.KnftFamily(fam), "table", TableName(k.opts.TablePrefix))
		if last, ok := k.written[fam]; ok && slices.Equal(last, famWant) {
			exists, err := k.exists(ctx, fam)
			if err != nil {
				logger.Error(err, "Checking the node table")
			}
			if exists || err != nil {
				continue
			}
			logger.Info("The node table was deleted from outside; writing it again")
		}
		delete(k.written, fam)
		nft, err := k.opts.NFT(fam, TableName(k.opts.TablePrefix))
		if err == nil {
			err = Write(ctx, nft, fam, famWant)
		}
		if err != nil {
			logger.Error(err, "Writing the drop of untranslated Service CIDR traffic")
			continue
		}
		k.written[fam] = famWant
		logger.V(2).Info("Dropping untranslated traffic to the Service CIDRs", "cidrs", famWant)
	}
}

func (k *Keeper) exists(ctx context.Context, fam tables.Family) (bool, error) {
	listed, err := k.opts.ListTables(ctx, fam)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(listed, func(t tables.ListedTable) bool { return Owned(t, k.opts.TablePrefix) }), nil
}

// Remove deletes the node table of prefix in both families, where it exists and carries
// the ownership marker; a table with the name but not the marker is someone else's and
// left alone (its name is returned in the error). It reports the families it deleted.
func Remove(ctx context.Context, prefix string,
	open func(fam tables.Family, table string) (knftables.Interface, error),
	list func(ctx context.Context, fam tables.Family) ([]tables.ListedTable, error),
) ([]tables.Family, error) {
	var deleted []tables.Family
	var errs []error
	name := TableName(prefix)
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := list(ctx, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s tables: %w", tables.KnftFamily(fam), err))
			continue
		}
		i := slices.IndexFunc(listed, func(t tables.ListedTable) bool { return t.Name == name })
		if i < 0 {
			continue
		}
		if !Owned(listed[i], prefix) {
			errs = append(errs, fmt.Errorf("table %s %s is not shardproxy's (its comment is %q, not %q): not deleting it",
				tables.KnftFamily(fam), name, listed[i].Comment, OwnerComment))
			continue
		}
		nft, err := open(fam, name)
		if err == nil {
			err = tables.DeleteTable(ctx, nft)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", tables.KnftFamily(fam), name, err))
			continue
		}
		deleted = append(deleted, fam)
	}
	return deleted, errors.Join(errs...)
}
