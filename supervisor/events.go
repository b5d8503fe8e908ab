package supervisor

import (
	"sync/atomic"

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
	broadcaster record.EventBroadcaster
	rec         record.EventRecorder
	node        string
	// uidOf finds a Service's UID in the watches (set once they exist): `kubectl describe
	// service` lists only the events whose involvedObject.uid is the Service's.
	uidOf atomic.Pointer[func(types.NamespacedName) types.UID]
}

func newEventRecorder(client kubernetes.Interface, node string) *eventRecorder {
	b := record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{})
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &eventRecorder{broadcaster: b, rec: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "shardproxy", Host: node}), node: node}
}

// setServiceUIDs makes Eventf reference each Service by its UID, as uidOf finds it.
func (r *eventRecorder) setServiceUIDs(uidOf func(types.NamespacedName) types.UID) {
	r.uidOf.Store(&uidOf)
}

// shutdown stops the broadcaster's goroutines once the supervisor is done.
func (r *eventRecorder) shutdown() { r.broadcaster.Shutdown() }

// eventRecorder records the node-wide servers' failures on this Node.
var _ NodeRecorder = (*eventRecorder)(nil)

// NodeEventf records an event on this Node, referenced as upstream kube-proxy does (its
// UID is the node name, which is what `kubectl describe node` searches for).
func (r *eventRecorder) NodeEventf(eventType, reason, messageFmt string, args ...any) {
	ref := &corev1.ObjectReference{Kind: "Node", Name: r.node, UID: types.UID(r.node)}
	r.rec.Eventf(ref, eventType, reason, messageFmt, args...)
}

// Eventf records an event on a Service, with its UID when the watches hold it (a
// Service already gone gets the event without one, found by `kubectl get events`).
func (r *eventRecorder) Eventf(svc types.NamespacedName, eventType, reason, messageFmt string, args ...any) {
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name}
	if uidOf := r.uidOf.Load(); uidOf != nil {
		ref.UID = (*uidOf)(svc)
	}
	r.rec.Eventf(ref, eventType, reason, messageFmt, args...)
}
