package supervisor

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/selector"
)

// A node running no default instance watches only the EndpointSlices that carry a local
// proxy name's label (watchScope). The EndpointSlice controller copies a Service's labels
// to its slices, but slices written by hand or by another controller often lack them,
// and such a node then serves the Service as if it had no endpoints, with nothing to say
// why. The audit finds those Services: held for sliceAuditGrace without any slice, it
// asks the API server once for the Service's slices (label kubernetes.io/service-name,
// whatever else they carry) and, if there are any, logs and records a Warning event on
// the Service naming the labels they lack. It asks again after sliceAuditRecheck while
// the Service stays without a slice (slices may be written later).
const (
	sliceAuditEvery   = 15 * time.Second
	sliceAuditGrace   = 15 * time.Second
	sliceAuditRecheck = 30 * time.Minute
)

// reasonSlicesUnlabeled is the reason of the audit's Warning event on a Service.
const reasonSlicesUnlabeled = "EndpointSlicesNotWatched"

// sliceAudit is the audit's state, apart from the API (count) and the warning (warn).
type sliceAudit struct {
	// count returns how many EndpointSlices the Service has, labelled or not.
	count func(ctx context.Context, namespace, service string) (int, error)
	// warn reports n slices of svc the node does not see.
	warn func(svc *corev1.Service, n int)
	// bare holds since when each Service has been held without a slice; asked when the
	// API server was last asked about it.
	bare, asked map[types.NamespacedName]time.Time
}

func newSliceAudit(count func(context.Context, string, string) (int, error), warn func(*corev1.Service, int)) *sliceAudit {
	return &sliceAudit{count: count, warn: warn, bare: map[types.NamespacedName]time.Time{}, asked: map[types.NamespacedName]time.Time{}}
}

// check looks at the Services the node holds at now; hasSlices tells whether it holds a
// slice of one. A failed request is tried again at the next check.
func (a *sliceAudit) check(ctx context.Context, now time.Time, held []*corev1.Service, hasSlices func(namespace, name string) bool) {
	seen := map[types.NamespacedName]bool{}
	for _, svc := range held {
		name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		if !hasEndpointSlices(svc) || hasSlices(svc.Namespace, svc.Name) {
			continue
		}
		seen[name] = true
		since, ok := a.bare[name]
		if !ok {
			a.bare[name] = now
			continue
		}
		if now.Sub(since) < sliceAuditGrace {
			continue
		}
		if last, ok := a.asked[name]; ok && now.Sub(last) < sliceAuditRecheck {
			continue
		}
		n, err := a.count(ctx, svc.Namespace, svc.Name)
		if err != nil {
			continue
		}
		a.asked[name] = now
		if n > 0 {
			a.warn(svc, n)
		}
	}
	for name := range a.bare {
		if !seen[name] {
			delete(a.bare, name)
			delete(a.asked, name)
		}
	}
}

// hasEndpointSlices tells whether a Service's endpoints come in slices the node watches:
// not an ExternalName Service, and not a headless one (their slices are left out).
func hasEndpointSlices(svc *corev1.Service) bool {
	return svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != corev1.ClusterIPNone
}

// auditSlices runs the audit every sliceAuditEvery until ctx is done, on a node whose
// watches are scoped (on others every slice is watched).
func (s *Supervisor) auditSlices(ctx context.Context, w *Watches) {
	if len(w.scope) == 1 && w.scope[0] == "" {
		return
	}
	a := newSliceAudit(s.countSlices, s.warnSlicesUnlabeled)
	t := time.NewTicker(sliceAuditEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.check(ctx, time.Now(), w.HeldServices(), func(ns, name string) bool { return len(w.SlicesOf(ns, name)) > 0 })
		}
	}
}

// countSlices asks the API server (its watch cache) for the EndpointSlices of a Service.
func (s *Supervisor) countSlices(ctx context.Context, namespace, service string) (int, error) {
	list, err := s.deps.Client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + service, ResourceVersion: "0"})
	if err != nil {
		s.logger.V(2).Info("Listing the EndpointSlices of a Service held without any", "service", namespace+"/"+service, "err", err)
		return 0, err
	}
	return len(list.Items), nil
}

// warnSlicesUnlabeled logs and records on the Service that n of its slices lack the
// labels this node's watches select on.
func (s *Supervisor) warnSlicesUnlabeled(svc *corev1.Service, n int) {
	var labels []string
	for _, k := range []string{selector.LabelServiceProxyName, selector.LabelShadow} {
		if v, ok := svc.Labels[k]; ok {
			labels = append(labels, k+"="+v)
		}
	}
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	s.logger.Info("EndpointSlices of a Service lack its labels; this node does not watch them and serves the Service without their endpoints",
		"service", name, "slices", n, "labels", labels)
	s.deps.Recorder.Eventf(name, corev1.EventTypeWarning, reasonSlicesUnlabeled,
		"%d EndpointSlice(s) of this Service lack its label %s: node %s runs no default instance and watches only the EndpointSlices that carry it, so it serves the Service without their endpoints (the EndpointSlice controller copies a Service's labels to its slices; slices written otherwise must carry them too)",
		n, strings.Join(labels, " or "), s.cfg.NodeName)
}
