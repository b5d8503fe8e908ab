package instance

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/shardproxy/shardproxy/tables"
)

// LoadBalancingAnnotation lets a Service ask for another load-balancing mode than its
// instance's, among the modes the instance allows.
const LoadBalancingAnnotation = "shardproxy.io/load-balancing"

// LoadBalancing is an instance's load-balancing settings.
type LoadBalancing struct {
	// Mode is the instance's mode, for every Service that does not ask for another;
	// "" is random.
	Mode tables.LBMode
	// Allowed are the modes a Service may ask for with LoadBalancingAnnotation (the
	// instance's own mode needs no listing). Empty allows none: Services are tenants,
	// and the guard is closed unless the instance opens it.
	Allowed []tables.LBMode
}

// TableConfig is cfg with the table settings these load-balancing settings decide:
// the rotation chains where a Service may be consistentHash, which needs them to
// spread clients evenly (tables.Config.ConsistentHash).
func (lb LoadBalancing) TableConfig(cfg tables.Config) tables.Config {
	cfg.ConsistentHash = lb.MayUse(tables.LBConsistentHash)
	return cfg
}

// MayUse reports whether a Service of the instance may end up in mode m: the
// instance's mode (random for "") or one its Services may ask for.
func (lb LoadBalancing) MayUse(m tables.LBMode) bool {
	return lb.Mode.OrRandom() == m || slices.Contains(lb.Allowed, m)
}

// Build is Build with these settings: a Service's LoadBalancingAnnotation is honoured
// where allowed, and otherwise reported as a problem (a Warning event) while the
// Service gets the instance's mode.
func (lb LoadBalancing) Build(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeInfo) *ServiceModel {
	return build(svc, slices, node, lb)
}

// modeOf returns the mode svc gets and, when its annotation is refused, why.
func (lb LoadBalancing) modeOf(svc *corev1.Service) (tables.LBMode, string) {
	mode := lb.Mode.OrRandom()
	v, ok := svc.Annotations[LoadBalancingAnnotation]
	if !ok || v == "" {
		return mode, ""
	}
	want, err := tables.ParseLBMode(v)
	if err != nil {
		return mode, fmt.Sprintf("annotation %s: %v; using the instance's mode %s", LoadBalancingAnnotation, err, mode)
	}
	if want != mode && !slices.Contains(lb.Allowed, want) {
		return mode, fmt.Sprintf("annotation %s: %s is not allowed by this instance (allowed: %v); using the instance's mode %s",
			LoadBalancingAnnotation, want, lb.Allowed, mode)
	}
	return want, ""
}
