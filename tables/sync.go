package tables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"sigs.k8s.io/knftables"
)

// ServiceName identifies a Service (namespace and name).
type ServiceName struct {
	Namespace, Name string
}

// String returns "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Stats describes one sync.
type Stats struct {
	// Full is true for a full sync.
	Full bool
	// Operations is the number of operations in the transaction.
	Operations int
	// Added and Deleted count set and map elements.
	Added, Deleted int
	// Conflicts lists entries (address . protocol . port) a Service port wanted but
	// another one already serves; the first one keeps them.
	Conflicts []string
	// Elapsed is the wall time of the sync, including the transaction.
	Elapsed time.Duration
	// Direct is true for a partial sync applied by the direct Applier (SetDirect) rather
	// than nft.
	Direct bool
}

// ErrNeedFullSync is returned by Partial when the table state is unknown (before the
// first full sync or after a failed sync).
var ErrNeedFullSync = errors.New("a full sync is needed first")

// Syncer keeps one instance's table of one family in step with its Services. Each sync
// is a pipeline: the ledger compiles the changed Services into element ids and chains
// and records what changed; the change becomes a Diff (plain data); an Applier writes
// the Diff in one transaction. The ledger remembers what was written, so a partial sync
// costs what changed, never what exists. It is not safe for concurrent use.
type Syncer struct {
	cfg  Config
	nft  knftables.Interface
	c    *compiler
	prio Priorities

	ledger *ledger
	// synced is true while the ledger matches the kernel.
	synced bool
	// recreate asks the next full sync to delete the table first (after a failed full
	// sync, e.g. an incompatible table left by another version or another slot).
	recreate bool

	// apply applies every Diff; direct, if set, applies those that fit it (fitsNetlink).
	apply  *NFTApplier
	direct Applier
}

// NewSyncer returns a Syncer for cfg, writing through nft (bound to cfg's family and
// table), one element per command; see SetElementsPerCommand and SetDirect.
func NewSyncer(cfg Config, nft knftables.Interface) (*Syncer, error) {
	prio, err := PrioritiesFor(cfg.Slot)
	if err != nil {
		return nil, err
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masquerade bit %d is out of range [0, 31]", cfg.MasqueradeBit)
	}
	s := &Syncer{cfg: cfg, nft: nft, prio: prio}
	s.SetElementsPerCommand(1)
	s.c = newCompiler(&s.cfg)
	s.ledger = newLedger(s.c, 0)
	return s, nil
}

// SetElementsPerCommand sets how many elements of a set one command of a streamed nft
// script carries: the nft binary takes MaxElementsPerCommand, several times faster than
// one each. A knftables transaction (knftables' Fake) carries one whatever it is.
func (s *Syncer) SetElementsPerCommand(n int) {
	s.apply = NewNFTApplier(s.nft, KnftFamily(s.cfg.Family), s.cfg.TableName(), n)
}

// SetDirect makes the Diffs that need no rule text, and are small enough, go through a
// instead of nft (a NetlinkWriter; nil: everything through nft).
func (s *Syncer) SetDirect(a Applier) { s.direct = a }

// Close releases what the direct Applier holds open (a NetlinkWriter's socket); the
// Syncer stays usable and the Applier reopens on its next use.
func (s *Syncer) Close() error {
	if c, ok := s.direct.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// RecreateOnNextFull makes the next full sync delete the table first, in the same
// transaction: for a table whose ownership marker (a table's comment cannot be changed in
// place) is not this Syncer's.
func (s *Syncer) RecreateOnNextFull() { s.recreate = true }

// Family returns the family the Syncer writes.
func (s *Syncer) Family() Family { return s.cfg.Family }

// NeedsFull reports whether the next sync must be a full one.
func (s *Syncer) NeedsFull() bool { return !s.synced }

// Full replaces the whole table with the given Services in one atomic transaction.
// Nothing that works is removed before the replacement is in place, and the clients
// remembered for ClientIP affinity survive.
func (s *Syncer) Full(ctx context.Context, services map[ServiceName][]*ServicePort) (Stats, error) {
	start := time.Now()
	in, err := s.listExisting(ctx)
	if err != nil {
		return Stats{Full: true}, err
	}
	d, stats, err := s.fullDiff(services, in)
	if err != nil {
		return stats, err
	}
	if err := s.apply.Apply(ctx, d); err != nil {
		s.recreate = true
		return stats, fmt.Errorf("full sync of table %s %s: %w", s.c.ip, s.cfg.TableName(), err)
	}
	s.recreate = false
	s.synced = true
	stats.Elapsed = time.Since(start)
	return stats, nil
}

// Check asks the kernel whether it would accept a full sync of services, without
// changing anything.
func (s *Syncer) Check(ctx context.Context, services map[ServiceName][]*ServicePort) error {
	d, _, err := s.fullDiff(services, existing{known: s.recreate})
	if err != nil {
		return err
	}
	return s.apply.Check(ctx, d)
}

// fullDiff rebuilds the ledger from services and returns the Diff that writes all of it.
// The ledger no longer matches the kernel until that Diff is applied.
func (s *Syncer) fullDiff(services map[ServiceName][]*ServicePort, in existing) (*Diff, Stats, error) {
	stats := Stats{Full: true}
	s.synced = false
	s.ledger = newLedger(s.c, max(len(s.ledger.entryOwner), 2*len(services)))
	log := newChangeLog(false)
	for _, n := range byClaim(services) {
		s.ledger.acquire(log, n, services[n])
	}
	// Oldest first, no one is evicted; settle keeps that an invariant, not a hope.
	s.ledger.settle(log)
	stats.Conflicts = log.conflicts
	d, err := s.ledger.diffOfAll(s.c.skeleton(s.prio), in, log, s.recreate)
	if err != nil {
		return nil, stats, err
	}
	stats.Added, stats.Operations = len(d.AddElements), d.Len()
	return d, stats, nil
}

// listExisting lists the chains and sets in the kernel, for a full sync to delete the
// pick and affinity objects nothing needs any more; listing names is cheap next to
// listing the whole table, and only a full sync does it. A table about to be recreated
// holds nothing worth listing.
func (s *Syncer) listExisting(ctx context.Context) (existing, error) {
	in := existing{known: true}
	if s.recreate {
		return in, nil
	}
	var err error
	in.chains, err = s.nft.List(ctx, "chains")
	if err != nil && !notFound(err) {
		return in, fmt.Errorf("listing chains of %s: %w", s.cfg.TableName(), err)
	}
	// A table without chains is missing (or empty): nothing of ours to find. Listing
	// its sets over netlink would fail with an error that does not say "not found".
	if len(in.chains) > 0 {
		in.sets, err = s.nft.List(ctx, "sets")
		if err != nil && !notFound(err) {
			return in, fmt.Errorf("listing sets of %s: %w", s.cfg.TableName(), err)
		}
	}
	return in, nil
}

// Partial applies the changes of the given Services: each one's ports become exactly
// the ports given (none: the Service is gone). Its cost depends only on those Services.
func (s *Syncer) Partial(ctx context.Context, changes map[ServiceName][]*ServicePort) (Stats, error) {
	start := time.Now()
	stats := Stats{}
	if !s.synced {
		return stats, ErrNeedFullSync
	}
	// Not synced until the Diff is applied: a sync that fails or panics half way leaves
	// a ledger that may not match the kernel, and only a full sync can repair that.
	s.synced = false
	log := newChangeLog(true)
	s.ledger.replace(log, changes)
	stats.Conflicts = log.conflicts
	d, err := s.ledger.diffOfChange(log)
	if err != nil {
		return stats, err
	}
	stats.Added, stats.Deleted, stats.Operations = len(d.AddElements), len(d.DeleteElements), d.Len()
	var a Applier = s.apply
	if s.direct != nil && fitsNetlink(d) {
		// Nothing needs rule text: straight to the kernel, without nft's cost per table.
		a, stats.Direct = s.direct, true
	}
	if err := a.Apply(ctx, d); err != nil {
		return stats, fmt.Errorf("partial sync of table %s %s: %w", s.c.ip, s.cfg.TableName(), err)
	}
	s.synced = true
	stats.Elapsed = time.Since(start)
	return stats, nil
}

// TableExists reports whether the table is still in the kernel. With a NetlinkWriter as
// the direct applier (as the supervisor opens its instances) it asks the kernel for the
// base chain alone, and lists only when that fails; over netlink (knftables.UseNetlink)
// listing reads the names of every chain of the family; through the nft binary it lists
// the whole table (seconds at 10,000 Services).
func (s *Syncer) TableExists(ctx context.Context) (bool, error) {
	// The direct writer asks for our base chain alone: listing every chain of the family
	// every 2 s was ~11 MB of garbage at 100,000 Services (README, "Performance").
	if c, ok := s.direct.(chainAsker); ok && c.HasChain(chainNATPrerouting) == nil {
		return true, nil
	}
	chains, err := s.nft.List(ctx, "chains")
	if notFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Listing over netlink answers an empty list, not "not found", for a missing table;
	// a table without our base chain is not ours to trust either.
	return slices.Contains(chains, chainNATPrerouting), nil
}

// chainAsker is a direct Applier that can ask the kernel for one chain of its table
// (NetlinkWriter); nil means the chain is there.
type chainAsker interface {
	HasChain(name string) error
}

// notFound reports whether err says the table (or object) does not exist: nft's own
// error, or ENOENT where netlink keeps it (google/nftables flattens some of its errors to
// text, so callers over netlink must not rely on this alone).
func notFound(err error) bool {
	return knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT)
}

// Reconfigure replaces the node-dependent settings (addresses, pod CIDRs); the next
// sync is a full one. The family, table and slot cannot change.
func (s *Syncer) Reconfigure(cfg Config) error {
	if cfg.Family != s.cfg.Family || cfg.TableName() != s.cfg.TableName() || cfg.Slot != s.cfg.Slot {
		return fmt.Errorf("table %s: family, name and slot cannot change while running", s.cfg.TableName())
	}
	s.cfg = cfg
	s.c = newCompiler(&s.cfg)
	s.ledger.c = s.c
	s.synced = false
	return nil
}
