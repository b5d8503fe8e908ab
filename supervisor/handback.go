package supervisor

import (
	"context"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/legacy"
	"github.com/shardproxy/shardproxy/selector"
)

// LegacyRules reads which Services a legacy kube-proxy on this node has programmed, by
// "namespace/name" (legacy.ProgrammedServices).
type LegacyRules func(ctx context.Context) (map[string]legacy.ServiceRules, error)

// hostLegacyRules reads kube-proxy's rules on this node, in iptables or nftables mode.
func hostLegacyRules(ctx context.Context) (map[string]legacy.ServiceRules, error) {
	return legacy.ProgrammedServices(ctx, legacy.RealExec{})
}

// legacyReadTimeout bounds one reading of kube-proxy's rules for the node status.
const legacyReadTimeout = 10 * time.Second

// legacyReadEvery spaces the readings of kube-proxy's rules: the node status is polled
// every 500 ms, and reading a large kube-proxy ruleset (iptables-save, or nft -j in
// nftables mode) takes a second and tens of megabytes.
const legacyReadEvery = 2 * time.Second

// legacyCache keeps the last reading of kube-proxy's rules.
type legacyCache struct {
	mu    sync.Mutex
	at    time.Time
	rules map[string]legacy.ServiceRules
}

// handedBack returns, of the Services instances hold in shadow, those their label's
// proxy has programmed on this node, for migrate's rollback (InstanceStatus.HandedBack):
// a local owner that programmed it, or, when no local instance owns it, kube-proxy's
// rules for it. Those rules are read only while some shadow has no local owner (a
// migration or rollback is under way), once per call.
func (s *Supervisor) handedBack(d *selector.Dispatcher, shadows map[string][]types.NamespacedName) map[types.NamespacedName]bool {
	out := map[types.NamespacedName]bool{}
	var legacyRules map[string]legacy.ServiceRules
	read := false
	for _, names := range shadows {
		for _, n := range names {
			owner, programmed := d.OwnerProgrammed(n)
			if owner != "" {
				out[n] = programmed
				continue
			}
			if !read {
				read = true
				legacyRules = s.readLegacyRules()
			}
			out[n] = legacyProgrammed(legacyRules[n.String()], s.endpointSlicesOf(n.Namespace, n.Name))
		}
	}
	return out
}

func (s *Supervisor) readLegacyRules() map[string]legacy.ServiceRules {
	c := &s.legacy
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); c.at.IsZero() || now.Sub(c.at) >= legacyReadEvery {
		c.rules, c.at = s.readLegacyRulesNow(), now
	}
	return c.rules
}

func (s *Supervisor) readLegacyRulesNow() map[string]legacy.ServiceRules {
	ctx, cancel := context.WithTimeout(context.Background(), legacyReadTimeout)
	defer cancel()
	rules, err := s.deps.LegacyRules(ctx)
	if err != nil {
		s.logger.V(2).Info("Cannot read all of a legacy kube-proxy's rules; Services are reported handed back to it from what could be read", "err", err)
	}
	return rules
}

// legacyProgrammed tells whether kube-proxy's rules serve a Service as they should: its
// endpoints when it has ready ones, else its "no endpoints" reject. (kube-proxy sees a
// handed-back Service before its EndpointSlices, which the EndpointSlice controller
// relabels after it: until then it rejects, and the shadow must stay.)
func legacyProgrammed(rules legacy.ServiceRules, slices []*discoveryv1.EndpointSlice) bool {
	for _, sl := range slices {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				return rules.Endpoints
			}
		}
	}
	return rules.Endpoints || rules.NoEndpoints
}
