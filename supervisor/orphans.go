package supervisor

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
)

// firstFullSyncs closes done once every instance configured at start has completed a
// successful full sync.
type firstFullSyncs struct {
	mu sync.Mutex
	// pending are the instances still to complete one.
	pending map[string]bool
	done    chan struct{}
}

// newFirstFullSyncs waits for the first full syncs of the instances.
func newFirstFullSyncs(instances []config.Instance) *firstFullSyncs {
	f := &firstFullSyncs{pending: map[string]bool{}, done: make(chan struct{})}
	for _, in := range instances {
		f.pending[in.Name] = true
	}
	return f
}

// fullSynced records a successful full sync of inst.
func (f *firstFullSyncs) fullSynced(inst string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pending[inst] {
		return
	}
	delete(f.pending, inst)
	if len(f.pending) == 0 {
		close(f.done)
	}
}

// deleteUnconfiguredTables deletes the tables ("<tablePrefix>-<name>", ip and ip6) of
// instances that are no longer in the configuration. Their base chains would otherwise
// keep DNATing the Services they served when they stopped, at their own priorities, and
// win over the instance that serves those Services now wherever theirs run first.
//
// It runs once, after every configured instance has completed a full sync, so the
// Services the removed instance served are programmed by their new owners first. Only a
// table carrying this supervisor's ownership marker (its comment, tables.OwnerComment of
// the name and of config.SupervisorIdentity) is deleted. Left alone, with a log line: a
// table that merely has the name (another component's under a prefix that matches it,
// or one made by hand), another supervisor's with the same prefix, one whose marker is
// an earlier version's (it names no supervisor: it may be another supervisor's not yet
// upgraded; `shardproxy cleanup --instance` deletes it), and a name that is not a valid
// instance name (a DNS-1123 label).
func (s *Supervisor) deleteUnconfiguredTables(ctx context.Context) {
	me := s.cfg.SupervisorIdentity()
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := s.deps.ListTables(ctx, fam)
		if err != nil {
			s.logger.Error(err, "Listing nftables tables to find those of removed instances", "family", tables.KnftFamily(fam))
			continue
		}
		for _, t := range listed {
			inst, ok := s.unconfiguredTableOf(fam, t, me)
			if !ok {
				continue
			}
			nft, err := s.deps.NFT(fam, t.Name)
			if err == nil {
				err = tables.DeleteTable(ctx, nft)
			}
			if err != nil {
				s.logger.Error(err, "Deleting the table of an instance that is no longer configured",
					"instance", inst, "family", tables.KnftFamily(fam), "table", t.Name)
				s.metrics.CleanupFailed(inst, fam.String())
				continue
			}
			s.logger.Info("Deleted the table of an instance that is no longer configured",
				"instance", inst, "family", tables.KnftFamily(fam), "table", t.Name)
		}
	}
}

// unconfiguredTableOf is the instance whose table t is, if t is this supervisor's (me)
// and the instance is not configured; it logs why a table named like an unconfigured
// instance's is left alone.
func (s *Supervisor) unconfiguredTableOf(fam tables.Family, t tables.ListedTable, me string) (string, bool) {
	named, ok := tables.InstanceOfTable(s.cfg.TablePrefix, t.Name)
	if !ok || len(content.IsDNS1123Label(named)) > 0 {
		return "", false
	}
	if _, configured := s.spec(named); configured {
		return "", false
	}
	inst, owner, ok := t.Owner(s.cfg.TablePrefix)
	logger := s.logger.WithValues("family", tables.KnftFamily(fam), "table", t.Name, "comment", t.Comment)
	switch {
	case !ok:
		logger.Info("Leaving alone a table named like an instance's but without shardproxy's marker",
			"marker", tables.OwnerComment(named, me))
	case owner == "":
		logger.Info("Leaving alone a table with an earlier version's marker, which names no supervisor; "+
			"if it is this supervisor's removed instance's, delete it with shardproxy cleanup --instance", "instance", inst)
	case owner != me:
		logger.Info("Leaving alone another supervisor's table with the same prefix", "instance", inst, "supervisor", owner)
	default:
		return inst, true
	}
	return "", false
}

// takeOverTables makes each instance whose table exists with a marker that is not this
// supervisor's recreate it at its first full sync (a table's comment cannot be changed
// in place): an earlier version's marker, or an identity this supervisor had before
// (another health port). The instance is configured here, so its table is written by
// this supervisor either way.
func (s *Supervisor) takeOverTables(ctx context.Context) {
	me := s.cfg.SupervisorIdentity()
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := s.deps.ListTables(ctx, fam)
		if err != nil {
			s.logger.Error(err, "Listing nftables tables to check their ownership markers", "family", tables.KnftFamily(fam))
			continue
		}
		for _, t := range listed {
			inst, owner, ok := t.Owner(s.cfg.TablePrefix)
			p := s.Instance(inst)
			if !ok || p == nil || owner == me {
				continue
			}
			s.logger.Info("Recreating an instance's table at its first full sync to write this supervisor's marker",
				"instance", inst, "family", tables.KnftFamily(fam), "table", t.Name, "comment", t.Comment,
				"marker", tables.OwnerComment(inst, me))
			p.RecreateTable(fam)
		}
	}
}
