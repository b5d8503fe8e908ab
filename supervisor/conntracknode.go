package supervisor

import (
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
)

// conntrackNode is the node as conntrack cleanup reads it: the answers of localServices
// it needs, in the conntrack package's terms. Which flows are kept or stale is decided
// there (conntrack.Sweeper).
type conntrackNode struct {
	services localServices
}

var _ conntrack.Node = conntrackNode{}

// EndpointSlicesOf lists a Service's EndpointSlices as the watch holds them now.
func (n conntrackNode) EndpointSlicesOf(name types.NamespacedName) []*discoveryv1.EndpointSlice {
	return n.services.endpointSlicesOf(name.Namespace, name.Name)
}

// ServedElsewhere returns, for each of names another local instance than inst programs
// now, by label or as a migration shadow, that instance's programmed model (nil if it
// has not programmed it yet), read per Service.
func (n conntrackNode) ServedElsewhere(inst string, names []types.NamespacedName) map[types.NamespacedName]*instance.ServiceModel {
	out := map[types.NamespacedName]*instance.ServiceModel{}
	for _, name := range names {
		owner, known := n.services.serviceOwner(name)
		if !known {
			continue
		}
		var others []string
		if owner != "" && owner != inst {
			others = append(others, owner)
		}
		for shadow, shadowed := range n.services.serviceShadows() {
			if shadow != inst && slices.Contains(shadowed, name) {
				others = append(others, shadow)
			}
		}
		if len(others) == 0 {
			continue
		}
		out[name] = nil
		for _, other := range others {
			if m := n.services.appliedModel(other, name); m != nil {
				out[name] = m
				break
			}
		}
	}
	return out
}
