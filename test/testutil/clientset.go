package testutil

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// NewClientset is client-go's fake clientset with watches that behave as the API
// server's in the two ways shardproxy's informers notice:
//   - every event carries an object of its own, as a real client decodes a fresh one:
//     the informers trim what they receive in place (trimForCache), as client-go allows,
//     while the fake's tracker hands a new watch the very objects it stores, which a
//     List elsewhere may be copying at that moment (a data race under -race, seen in CI
//     with several hollow nodes on one fake);
//   - a label-selected watch sees only the objects of its selector, and an object
//     changed out of it arrives as deleted.
//
// Not as the API server: a Modified event of an object outside the selector arrives as
// Deleted even if the watch never sent that object (the fake does not know what it
// sent before; informers ignore the delete of an object they do not hold), and one
// entering the selector arrives as Modified, not Added (informers add it alike). Field
// selectors are not applied (the fake ignores them): a test of a field-selected watch
// needs a real kube-apiserver (test/controlplane).
func NewClientset(objects ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objects...)
	client.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		var sel labels.Selector
		if wa, ok := action.(k8stesting.WatchActionImpl); ok {
			opts, sel = wa.ListOptions, wa.WatchRestrictions.Labels
		}
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if m, ok := e.Object.(metav1.Object); ok && sel != nil && !sel.Matches(labels.Set(m.GetLabels())) {
				if e.Type != watch.Modified {
					return e, false // never in this watch
				}
				e.Type = watch.Deleted
			}
			if e.Object != nil {
				e.Object = e.Object.DeepCopyObject()
			}
			return e, true
		}), nil
	})
	return client
}
