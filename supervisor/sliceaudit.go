package supervisor

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"slices"
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
// why. The audit finds those Services: one held without any slice for sliceAuditGrace,
// plus a spread of up to sliceAuditSpread that differs per node and Service (so that the
// nodes of a large cluster do not all ask at once), is asked about with one LIST of its
// slices by kubernetes.io/service-name, whatever else they carry, from the API server's
// watch cache. If there are any, the node logs it and records a Warning event on the
// Service naming the label they lack. The grace is long enough for the controller to copy
// a relabelled Service's labels during a migration.
//
// A Service is asked about again when it changes (new labels may be the reason), but its
// writer decides how often that is, and every scoped node of the cluster asks. So the
// asking is bounded whatever tenants write: a node asks about one Service at most once
// per sliceAuditRecheck (plus its spread), however many versions it went through, and
// at most sliceAuditBudget times per check in all, the Services that have waited longest
// first. One node thus makes at most sliceAuditBudget LISTs per sliceAuditEvery (well
// inside the client's shared rate limit, so the audit never holds up the supervisor's
// other calls), and a cluster of N nodes at most N per sliceAuditRecheck about any one
// Service, where it made N per version.
const (
	sliceAuditEvery   = 15 * time.Second
	sliceAuditGrace   = time.Minute
	sliceAuditSpread  = time.Minute
	sliceAuditRecheck = 10 * time.Minute
	sliceAuditBudget  = 4
	sliceAuditTimeout = 10 * time.Second
)

// reasonSlicesNotWatched is the reason of the audit's Warning event on a Service.
const reasonSlicesNotWatched = "EndpointSlicesNotWatched"

// sliceAudit is the audit's state, apart from the API (count) and the warning (warn).
type sliceAudit struct {
	// count returns how many EndpointSlices the Service has, labelled or not.
	count func(ctx context.Context, namespace, service string) (int, error)
	// warn reports n slices of svc the node does not see.
	warn func(svc *corev1.Service, n int)
	// node spreads the nodes' requests (sliceAuditSpread).
	node string
	// bare holds since when each Service has been held without a slice; asked the
	// version of the Service the API server was last asked about, and when.
	bare  map[types.NamespacedName]time.Time
	asked map[types.NamespacedName]auditAnswer
}

// auditAnswer is the version of a Service the API server answered about, and when.
type auditAnswer struct {
	version string
	at      time.Time
}

func newSliceAudit(node string, count func(context.Context, string, string) (int, error), warn func(*corev1.Service, int)) *sliceAudit {
	return &sliceAudit{count: count, warn: warn, node: node,
		bare: map[types.NamespacedName]time.Time{}, asked: map[types.NamespacedName]auditAnswer{}}
}

// check looks at the Services the node holds at now; hasSlices tells whether it holds a
// slice of one. It asks about at most sliceAuditBudget of the Services due, those due
// longest first; the others, and a failed request, wait for the next check.
func (a *sliceAudit) check(ctx context.Context, now time.Time, held []*corev1.Service, hasSlices func(namespace, name string) bool) {
	type due struct {
		svc  *corev1.Service
		name types.NamespacedName
		at   time.Time
	}
	var queue []due
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
		at := since.Add(sliceAuditGrace + a.spread(name))
		if last, ok := a.asked[name]; ok {
			if last.version == svc.ResourceVersion {
				continue
			}
			if again := last.at.Add(sliceAuditRecheck + a.spread(name)); again.After(at) {
				at = again
			}
		}
		if now.Before(at) {
			continue
		}
		queue = append(queue, due{svc: svc, name: name, at: at})
	}
	for name := range a.bare {
		if !seen[name] {
			delete(a.bare, name)
			delete(a.asked, name)
		}
	}
	slices.SortFunc(queue, func(x, y due) int {
		return cmp.Or(x.at.Compare(y.at), cmp.Compare(x.name.Namespace, y.name.Namespace), cmp.Compare(x.name.Name, y.name.Name))
	})
	for _, d := range queue[:min(len(queue), sliceAuditBudget)] {
		n, err := a.count(ctx, d.svc.Namespace, d.svc.Name)
		if err != nil {
			continue
		}
		a.asked[d.name] = auditAnswer{version: d.svc.ResourceVersion, at: now}
		if n > 0 {
			a.warn(d.svc, n)
		}
	}
}

// spread is this node's delay for a Service, in [0, sliceAuditSpread).
func (a *sliceAudit) spread(name types.NamespacedName) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%s", a.node, name.Namespace, name.Name)
	return time.Duration(h.Sum64() % uint64(sliceAuditSpread))
}

// hasEndpointSlices tells whether a Service's endpoints come in slices the node watches:
// not an ExternalName Service, and not a headless one (their slices are left out).
func hasEndpointSlices(svc *corev1.Service) bool {
	return svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != corev1.ClusterIPNone
}

// auditSlices runs the audit every sliceAuditEvery until ctx is done, on a node whose
// watches are scoped (on others every slice is watched).
func (s *Supervisor) auditSlices(ctx context.Context, w *Watches) {
	if !w.Scoped() {
		return
	}
	a := newSliceAudit(s.cfg.NodeName, s.countSlices, s.warnSlicesNotWatched)
	runEvery(ctx, sliceAuditEvery, func() {
		a.check(ctx, time.Now(), w.HeldServices(), func(ns, name string) bool { return len(w.SlicesOf(ns, name)) > 0 })
	})
}

// countSlices asks the API server (its watch cache) for the EndpointSlices of a Service.
func (s *Supervisor) countSlices(ctx context.Context, namespace, service string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, sliceAuditTimeout)
	defer cancel()
	list, err := s.deps.Client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + service, ResourceVersion: "0"})
	if err != nil {
		err = fmt.Errorf("listing the EndpointSlices of Service %s/%s: %w", namespace, service, err)
		s.logger.V(2).Info("Slice audit", "err", err)
		return 0, err
	}
	return len(list.Items), nil
}

// warnSlicesNotWatched logs and records on the Service that n of its slices lack the
// labels this node's watches select on.
func (s *Supervisor) warnSlicesNotWatched(svc *corev1.Service, n int) {
	var labels []string
	for _, k := range []string{selector.LabelServiceProxyName, selector.LabelShadow} {
		if v, ok := svc.Labels[k]; ok {
			labels = append(labels, k+"="+v)
		}
	}
	name := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	s.logger.Info("EndpointSlices of a Service lack its labels; this node does not watch them and serves the Service without their endpoints",
		"service", name, "slices", n, "labels", labels)
	s.deps.Recorder.Eventf(name, corev1.EventTypeWarning, reasonSlicesNotWatched,
		"%d EndpointSlice(s) of this Service lack its label %s: node %s runs no default instance and watches only the EndpointSlices that carry it, so it serves the Service without their endpoints (the EndpointSlice controller copies a Service's labels to its slices; slices written otherwise must carry them too)",
		n, strings.Join(labels, " or "), s.cfg.NodeName)
}
