package supervisor

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/shardproxy/shardproxy/tables"
)

// firstFullSyncs closes done once every instance has completed a successful full sync.
type firstFullSyncs struct {
	mu sync.Mutex
	// pending counts the instances still to complete one; set before they start.
	pending int
	synced  map[string]bool
	done    chan struct{}
}

// fullSynced records a successful full sync of inst.
func (f *firstFullSyncs) fullSynced(inst string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.synced[inst] || f.pending <= 0 {
		return
	}
	if f.synced == nil {
		f.synced = map[string]bool{}
	}
	f.synced[inst] = true
	if f.pending--; f.pending == 0 {
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
// table carrying shardproxy's ownership marker (its comment, tables.OwnerComment of the
// name) is deleted: a table that merely has the name, another component's under a prefix
// that matches it or one made by hand, is left alone with a log line, as is a name that
// is not a valid instance name (a DNS-1123 label).
func (s *Supervisor) deleteUnconfiguredTables(ctx context.Context) {
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		listed, err := s.deps.ListTables(ctx, fam)
		if err != nil {
			s.logger.Error(err, "Listing nftables tables to find those of removed instances", "family", tables.KnftFamily(fam))
			continue
		}
		for _, t := range listed {
			inst, ok := t.OwnedInstance(s.cfg.TablePrefix)
			if !ok {
				if named, ok := tables.InstanceOfTable(s.cfg.TablePrefix, t.Name); ok {
					if _, configured := s.specs[named]; !configured {
						s.logger.Info("Leaving alone a table named like an instance's but without shardproxy's marker",
							"family", tables.KnftFamily(fam), "table", t.Name, "comment", t.Comment, "marker", tables.OwnerComment(named))
					}
				}
				continue
			}
			if len(content.IsDNS1123Label(inst)) > 0 {
				continue
			}
			if _, configured := s.specs[inst]; configured {
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
