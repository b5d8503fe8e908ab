package supervisor

import (
	"context"
	"net/netip"
	"time"

	"github.com/shardproxy/shardproxy/tables/servicecidr"
)

// serviceCIDRDropCheck is how often the node table's existence is checked (a netlink
// listing of table names), so one deleted from outside is back within seconds.
const serviceCIDRDropCheck = 5 * time.Second

// newServiceCIDRDrop returns the keeper of the node-wide drop of untranslated
// ServiceCIDR traffic, or nil when it is off: turned off in the configuration, or the
// API server serves no ServiceCIDRs (nothing to feed it).
func (s *Supervisor) newServiceCIDRDrop(apiServed bool) *servicecidr.Keeper {
	if !*s.cfg.ServiceCIDRDrop {
		return nil
	}
	if !apiServed {
		s.logger.Info("Not dropping untranslated Service CIDR traffic: the ServiceCIDR API is not served")
		return nil
	}
	return servicecidr.NewKeeper(servicecidr.Options{
		TablePrefix: s.cfg.TablePrefix,
		NFT:         s.deps.NFT,
		ListTables:  s.deps.ListTables,
		CIDRs:       s.serviceCIDRs,
		Logger:      s.logger.WithName("service-cidr-drop"),
	})
}

// serviceCIDRs are the cluster's ServiceCIDRs as the watch holds them.
func (s *Supervisor) serviceCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, c := range s.watches.ServiceCIDRs() {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// runServiceCIDRDrop keeps the node table current until ctx ends, or, when the drop is
// off, deletes the node table an earlier run left (only if it carries the marker).
func (s *Supervisor) runServiceCIDRDrop(ctx context.Context, k *servicecidr.Keeper) {
	if k != nil {
		k.Run(ctx, serviceCIDRDropCheck)
		return
	}
	deleted, err := servicecidr.Remove(ctx, s.cfg.TablePrefix, s.deps.NFT, s.deps.ListTables)
	if err != nil {
		s.logger.Error(err, "Removing the node table of the Service CIDR drop, which is off")
	}
	if len(deleted) > 0 {
		s.logger.Info("Removed the node table of the Service CIDR drop, which is off", "table", servicecidr.TableName(s.cfg.TablePrefix), "families", deleted)
	}
}
