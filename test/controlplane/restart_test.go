package controlplane

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// TestRestartAndCompact stops kube-apiserver and starts it again (requests fail while it
// is down; the data and the clients survive), then compacts etcd past a resource version
// and checks that a watch resuming from it expires ("too old resource version"), as the
// soak's fault injection relies on. The watch cache is off so that watches are served
// from etcd, where compaction is what expires them.
func TestRestartAndCompact(t *testing.T) {
	cp := StartWith(t, Options{ExtraAPIServerArgs: []string{"--watch-cache=false"}})
	ctx := t.Context()
	svcs := cp.Client().CoreV1().Services("default")
	newService := func(name string) *corev1.Service {
		t.Helper()
		svc, err := svcs.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating Service %s: %v", name, err)
		}
		return svc
	}
	before := newService("before")

	if err := cp.StopAPIServer(); err != nil {
		t.Fatalf("stopping kube-apiserver: %v", err)
	}
	if _, err := svcs.Get(ctx, "before", metav1.GetOptions{}); err == nil {
		t.Fatal("a request succeeded while kube-apiserver was stopped")
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartAPIServer(ctx); err == nil {
		t.Error("starting a running kube-apiserver succeeded")
	}
	if _, err := svcs.Get(ctx, "before", metav1.GetOptions{}); err != nil {
		t.Fatalf("the Service created before the restart: %v", err)
	}

	newService("after")
	rev, err := cp.Compact(ctx)
	if err != nil {
		t.Fatalf("compacting etcd: %v", err)
	}
	t.Logf("compacted etcd at revision %d", rev)
	w, err := svcs.Watch(ctx, metav1.ListOptions{ResourceVersion: before.ResourceVersion})
	if err != nil {
		if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			t.Fatalf("watch from a compacted resource version: %v, want 410 Gone", err)
		}
		return
	}
	defer w.Stop()
	ev, ok := <-w.ResultChan()
	if !ok || ev.Type != watch.Error {
		t.Fatalf("watch from compacted resource version %s: first event %v (open %v), want an error", before.ResourceVersion, ev.Type, ok)
	}
	if st, ok := ev.Object.(*metav1.Status); !ok || st.Code != 410 {
		t.Errorf("watch error %+v, want 410 too old resource version", ev.Object)
	}
}
