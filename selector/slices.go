package selector

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServiceOf returns the Service an EndpointSlice belongs to: the one its
// kubernetes.io/service-name label names, in the slice's namespace. A slice without the
// label (or with it empty) belongs to no Service: ok is false and the name is zero. It is
// the one place the rule is written; the dispatcher, the watch's index, the instances'
// trackers, the change counters and the offline renderer all go through it.
func ServiceOf(slice *discoveryv1.EndpointSlice) (name types.NamespacedName, ok bool) {
	svc := slice.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: slice.Namespace, Name: svc}, true
}
