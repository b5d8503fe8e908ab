package supervisor

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestServiceEventsCarryTheServiceUID: `kubectl describe service` lists only the events
// whose involvedObject.uid is the Service's, so a Warning a tenant must see (here
// ServiceRejected, for a Service in a namespace its instance does not accept) has to
// carry it. Through the supervisor's own recorder to the (fake) API.
func TestServiceEventsCarryTheServiceUID(t *testing.T) {
	setUID := &k8stesting.SimpleReactor{Verb: "create", Resource: "services",
		Reaction: func(action k8stesting.Action) (bool, runtime.Object, error) {
			if svc, ok := action.(k8stesting.CreateAction).GetObject().(*corev1.Service); ok {
				svc.UID = types.UID("uid-of-" + svc.Name) // as the API server assigns one
			}
			return false, nil, nil
		}}
	f := startSupervisorWith(t, fixtureOptions{apiEvents: true, reactors: []k8stesting.Reactor{setUID}})
	f.createService("x", "intruder", "team-b", "172.30.0.5") // team-b only accepts namespace b

	var ev corev1.Event
	testutil.Eventually(t, waitTimeout, "a ServiceRejected event in the API", func() bool {
		list, err := f.client.CoreV1().Events("x").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == "ServiceRejected" {
				ev = e
				return true
			}
		}
		return false
	})
	want := corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: "x", Name: "intruder", UID: "uid-of-intruder"}
	if ev.InvolvedObject != want {
		t.Errorf("the event's involvedObject is %+v, want %+v", ev.InvolvedObject, want)
	}
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != "shardproxy" {
		t.Errorf("event type %q from %q, want a Warning from shardproxy", ev.Type, ev.Source.Component)
	}
}
