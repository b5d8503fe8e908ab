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
// Services the removed instance served are programmed by their new owners first. A name
// that is not a valid instance name (a DNS-1123 label) is never ours and is left alone.
func (s *Supervisor) deleteUnconfiguredTables(ctx context.Context) {
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		names, err := s.deps.ListTables(ctx, fam)
		if err != nil {
			s.logger.Error(err, "Listing nftables tables to find those of removed instances", "family", tables.KnftFamily(fam))
			continue
		}
		for _, table := range names {
			inst, ok := tables.InstanceOfTable(s.cfg.TablePrefix, table)
			if !ok || len(content.IsDNS1123Label(inst)) > 0 {
				continue
			}
			if _, configured := s.specs[inst]; configured {
				continue
			}
			nft, err := s.deps.NFT(fam, table)
			if err == nil {
				err = tables.DeleteTable(ctx, nft)
			}
			if err != nil {
				s.logger.Error(err, "Deleting the table of an instance that is no longer configured",
					"instance", inst, "family", tables.KnftFamily(fam), "table", table)
				s.metrics.CleanupFailed(inst)
				continue
			}
			s.logger.Info("Deleted the table of an instance that is no longer configured",
				"instance", inst, "family", tables.KnftFamily(fam), "table", table)
		}
	}
}
