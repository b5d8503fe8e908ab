package supervisor

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Recorder records Kubernetes events about Services.
type Recorder interface {
	Eventf(service types.NamespacedName, eventType, reason, messageFmt string, args ...any)
}

// eventRecorder sends events through the API, from component "shardproxy" on this node.
type eventRecorder struct {
	rec  record.EventRecorder
	node string
}

func newEventRecorder(client kubernetes.Interface, node string) *eventRecorder {
	b := record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{})
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &eventRecorder{rec: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "shardproxy", Host: node}), node: node}
}

// eventRecorder records the node-wide servers' failures on this Node.
var _ NodeRecorder = (*eventRecorder)(nil)

// NodeEventf records an event on this Node, referenced as upstream kube-proxy does (its
// UID is the node name).
func (r *eventRecorder) NodeEventf(eventType, reason, messageFmt string, args ...any) {
	ref := &corev1.ObjectReference{Kind: "Node", Name: r.node, UID: types.UID(r.node)}
	r.rec.Eventf(ref, eventType, reason, messageFmt, args...)
}

func (r *eventRecorder) Eventf(svc types.NamespacedName, eventType, reason, messageFmt string, args ...any) {
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name}
	r.rec.Eventf(ref, eventType, reason, messageFmt, args...)
}
