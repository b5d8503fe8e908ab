package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/selector"
)

// Selection chooses Services. Empty fields select everything.
type Selection struct {
	// Namespace limits the selection to one namespace.
	Namespace string
	// LabelSelector is a Kubernetes label selector.
	LabelSelector string
	// Names are "namespace/name", or "name" within Namespace.
	Names []string
}

// Mover moves Services between proxies through the shadow annotation and the node
// statuses.
type Mover struct {
	Client kubernetes.Interface
	// StatusNamespace holds the node status ConfigMaps.
	StatusNamespace string
	// Out receives progress lines.
	Out io.Writer
	// BatchSize is how many Services move together; default 20.
	BatchSize int
	// Timeout bounds the wait for every node to confirm a batch; default 2m.
	Timeout time.Duration
	// StaleAfter: node statuses the API server stored longer ago than this, by its own
	// clock, are ignored (the node is gone); default 3 × HeartbeatInterval.
	StaleAfter time.Duration
	// Clock is the API server's clock, which liveness is judged on; the CLI passes an
	// APIServerClock. Default: LocalClock(Now), right only for an API server on this
	// machine's clock (a fake clientset).
	Clock ServerClock
	// LegacyGrace is how long a rollback keeps the shadow after handing Services back, so
	// the legacy proxy (which reports nothing) has programmed them; default 10s. It counts
	// from the hand-back, which comes only after every node confirmed the shadow.
	LegacyGrace time.Duration
	// Poll is how often node statuses are read; default 250ms.
	Poll time.Duration
	// Now is the local clock, for deadlines and durations; default time.Now.
	Now func() time.Time
}

func (m *Mover) defaults() {
	if m.BatchSize <= 0 {
		m.BatchSize = 20
	}
	if m.Timeout == 0 {
		m.Timeout = 2 * time.Minute
	}
	if m.StaleAfter == 0 {
		m.StaleAfter = 3 * HeartbeatInterval
	}
	if m.LegacyGrace == 0 {
		m.LegacyGrace = 10 * time.Second
	}
	if m.Poll == 0 {
		m.Poll = 250 * time.Millisecond
	}
	if m.Now == nil {
		m.Now = time.Now
	}
	if m.Clock == nil {
		m.Clock = LocalClock(m.Now)
	}
	if m.StatusNamespace == "" {
		m.StatusNamespace = DefaultNamespace
	}
	if m.Out == nil {
		m.Out = io.Discard
	}
}

// Select lists the chosen Services, sorted by namespace and name.
func (m *Mover) Select(ctx context.Context, sel Selection) ([]corev1.Service, error) {
	var out []corev1.Service
	if len(sel.Names) > 0 {
		for _, n := range sel.Names {
			ns, name := sel.Namespace, n
			if i := strings.IndexByte(n, '/'); i >= 0 {
				ns, name = n[:i], n[i+1:]
			}
			if ns == "" {
				return nil, fmt.Errorf("service %q: give it as namespace/name or use --namespace", n)
			}
			svc, err := m.Client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("service %s/%s: %w", ns, name, err)
			}
			out = append(out, *svc)
		}
	} else {
		list, err := m.Client.CoreV1().Services(sel.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.LabelSelector})
		if err != nil {
			return nil, fmt.Errorf("listing Services: %w", err)
		}
		out = list.Items
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Report sums up a move or rollback.
type Report struct {
	Moved   int
	Skipped int
	Batches int
}

// Move hands the selected Services to the instances serving proxy name to. Per batch:
// annotate them for shadow programming; wait until every live node whose supervisor runs
// an instance serving to reports them all programmed (in a status written after the
// annotation, when an earlier one already listed them); then, in one patch, set the label
// and drop the annotation. On a timeout the batch's annotations are removed and the
// Services stay where they were.
func (m *Mover) Move(ctx context.Context, sel Selection, to string) (Report, error) {
	m.defaults()
	var rep Report
	svcs, err := m.Select(ctx, sel)
	if err != nil {
		return rep, err
	}
	var todo []types.NamespacedName
	for _, s := range svcs {
		if s.Labels[selector.LabelServiceProxyName] == to {
			rep.Skipped++
			continue
		}
		todo = append(todo, types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
	}
	for i := 0; i < len(todo); i += m.BatchSize {
		batch := todo[i:min(i+m.BatchSize, len(todo))]
		rep.Batches++
		start := m.Now()
		before, _, err := m.readStatuses(ctx)
		if err != nil {
			return rep, err
		}
		for _, n := range batch {
			if err := m.patch(ctx, n, nil, map[string]*string{selector.AnnotationShadow: &to}); err != nil {
				return rep, err
			}
		}
		nodes, err := m.waitProgrammed(ctx, batch, to, before)
		if err != nil {
			for _, n := range batch {
				_ = m.patch(context.WithoutCancel(ctx), n, nil, map[string]*string{selector.AnnotationShadow: nil})
			}
			return rep, fmt.Errorf("batch %d: %w; its Services stay where they were", rep.Batches, err)
		}
		for _, n := range batch {
			if err := m.patch(ctx, n, map[string]*string{selector.LabelServiceProxyName: &to},
				map[string]*string{selector.AnnotationShadow: nil}); err != nil {
				return rep, err
			}
		}
		rep.Moved += len(batch)
		fmt.Fprintf(m.Out, "batch %d: %d Services programmed in shadow on %d node(s) (%s) after %v; labeled %s\n",
			rep.Batches, len(batch), len(nodes), strings.Join(nodes, ", "), m.Now().Sub(start).Round(time.Millisecond), to)
	}
	return rep, nil
}

// Rollback hands the selected Services labeled from back to the unlabeled (legacy)
// proxy, or to the proxy named by to. Per batch:
//
//  1. The owner steps back: the annotation names from, the proxy the label names, so its
//     instances keep programming the Services but only as a shadow and give up what an
//     owner holds, the health-check node ports. Rollback waits until every live node
//     running an instance for from reports them in shadow: the legacy proxy must find
//     those ports free, because kube-proxy tries to bind one only when it syncs, and
//     nothing makes it sync again once it has programmed the Service. If a node does not
//     confirm within Timeout the rollback goes on regardless (with a warning): handing
//     back is never less safe than keeping the Services, whose rules stay either way.
//  2. One patch moves the label (removes it, or sets to); the shadow stays, so the
//     instance keeps serving while the legacy proxy programs them (its rules run first).
//  3. After LegacyGrace the shadow goes.
func (m *Mover) Rollback(ctx context.Context, sel Selection, from, to string) (Report, error) {
	m.defaults()
	var rep Report
	svcs, err := m.Select(ctx, sel)
	if err != nil {
		return rep, err
	}
	var todo []types.NamespacedName
	for _, s := range svcs {
		if s.Labels[selector.LabelServiceProxyName] != from {
			rep.Skipped++
			continue
		}
		todo = append(todo, types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
	}
	var label *string
	if to != "" {
		label = &to
	}
	dest := "the unlabeled proxy"
	if to != "" {
		dest = to
	}
	for i := 0; i < len(todo); i += m.BatchSize {
		batch := todo[i:min(i+m.BatchSize, len(todo))]
		rep.Batches++
		start := m.Now()
		stepped := ""
		before, serverNow, err := m.readStatuses(ctx)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			fmt.Fprintf(m.Out, "batch %d: warning: %v; handing back without confirming %s stepped back\n", rep.Batches, err, from)
		case len(m.liveNodes(before, from, serverNow)) == 0:
			fmt.Fprintf(m.Out, "batch %d: warning: no live node reports an instance serving %q; handing back without confirming it stepped back\n",
				rep.Batches, from)
		default:
			for _, n := range batch {
				if err := m.patch(ctx, n, nil, map[string]*string{selector.AnnotationShadow: &from}); err != nil {
					return rep, err
				}
			}
			nodes, err := m.waitProgrammed(ctx, batch, from, before)
			switch {
			case err == nil:
				stepped = fmt.Sprintf("%s stepped back to a shadow on %d node(s) (%s) after %v; ",
					from, len(nodes), strings.Join(nodes, ", "), m.Now().Sub(start).Round(time.Millisecond))
			case ctx.Err() != nil:
				// Interrupted: the Services go back to their owner as they were.
				for _, n := range batch {
					_ = m.patch(context.WithoutCancel(ctx), n, nil, map[string]*string{selector.AnnotationShadow: nil})
				}
				return rep, fmt.Errorf("batch %d: %w; its Services stay with %s", rep.Batches, err, from)
			default:
				// Not confirmed in time (an old or stuck supervisor), or the statuses
				// cannot be read: hand back all the same.
				fmt.Fprintf(m.Out, "batch %d: warning: %v; handing back anyway (a legacy proxy may not bind their health-check node ports before its next sync)\n",
					rep.Batches, err)
			}
		}
		for _, n := range batch {
			if err := m.patch(ctx, n, map[string]*string{selector.LabelServiceProxyName: label},
				map[string]*string{selector.AnnotationShadow: &from}); err != nil {
				return rep, err
			}
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(m.LegacyGrace):
		}
		for _, n := range batch {
			if err := m.patch(ctx, n, nil, map[string]*string{selector.AnnotationShadow: nil}); err != nil {
				return rep, err
			}
		}
		rep.Moved += len(batch)
		fmt.Fprintf(m.Out, "batch %d: %s%d Services handed back to %s; %s kept them in shadow for %v\n",
			rep.Batches, stepped, len(batch), dest, from, m.LegacyGrace)
	}
	return rep, nil
}

// errNotConfirmed: the nodes did not confirm a batch (within the Timeout, or none runs
// an instance for the proxy name).
var errNotConfirmed = errors.New("not programmed in shadow")

// readStatuses lists the node statuses and then asks the API server for its time, so
// that every status was written no later than the time returned.
func (m *Mover) readStatuses(ctx context.Context) ([]publishedStatus, time.Time, error) {
	statuses, err := readPublished(ctx, m.Client, m.StatusNamespace)
	if err != nil {
		return nil, time.Time{}, err
	}
	now, err := m.Clock.ServerNow(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	return statuses, now, nil
}

// live tells whether the API server stored st within StaleAfter of serverNow. Neither
// the node's clock (the heartbeat) nor this machine's takes part.
func (m *Mover) live(st publishedStatus, serverNow time.Time) bool {
	return !st.written.IsZero() && serverNow.Sub(st.written) <= m.StaleAfter
}

// liveNodes returns the nodes of statuses that are live at serverNow and run an
// instance serving proxyName.
func (m *Mover) liveNodes(statuses []publishedStatus, proxyName string, serverNow time.Time) []string {
	var nodes []string
	for _, st := range statuses {
		if !m.live(st, serverNow) {
			continue
		}
		if _, ok := st.ServesProxyName(proxyName); ok {
			nodes = append(nodes, st.Node)
		}
	}
	sort.Strings(nodes)
	return nodes
}

// waitProgrammed waits until every live node running an instance for proxyName reports
// every Service of the batch in shadow. It returns the nodes that confirmed.
//
// before are the statuses read before the batch was annotated. A node whose status
// already listed a Service then (a shadow of an earlier migration step the supervisor has
// not reported gone yet) confirms it only in a status written since: otherwise a stale
// entry could confirm a Service the instance is about to drop and program again.
func (m *Mover) waitProgrammed(ctx context.Context, batch []types.NamespacedName, proxyName string, before []publishedStatus) ([]string, error) {
	deadline := m.Now().Add(m.Timeout)
	earlier := map[string]publishedStatus{}
	for _, st := range before {
		earlier[st.Node] = st
	}
	var missing []string
	for {
		statuses, serverNow, err := m.readStatuses(ctx)
		if err != nil {
			return nil, err
		}
		var nodes []string
		missing = missing[:0]
		for _, st := range statuses {
			if !m.live(st, serverNow) {
				continue
			}
			inst, ok := st.ServesProxyName(proxyName)
			if !ok {
				continue
			}
			nodes = append(nodes, st.Node)
			prev, seen := earlier[st.Node]
			for _, n := range batch {
				listed := slices.Contains(st.Instances[inst].Shadow, n.String())
				stale := seen && prev.version == st.version && slices.Contains(prev.Instances[inst].Shadow, n.String())
				if !listed || stale {
					missing = append(missing, st.Node+": "+n.String())
				}
			}
		}
		sort.Strings(nodes)
		if len(nodes) == 0 {
			return nil, fmt.Errorf("%w: no live node runs an instance serving proxy name %q (node statuses in %s)", errNotConfirmed, proxyName, m.StatusNamespace)
		}
		if len(missing) == 0 {
			return nodes, nil
		}
		if m.Now().After(deadline) {
			if len(missing) > 10 {
				missing = append(missing[:10], fmt.Sprintf("and %d more", len(missing)-10))
			}
			return nil, fmt.Errorf("%w within %v: %s", errNotConfirmed, m.Timeout, strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(m.Poll):
		}
	}
}

// patch sets (or with nil, removes) labels and annotations with one merge patch.
func (m *Mover) patch(ctx context.Context, n types.NamespacedName, labels, annotations map[string]*string) error {
	meta := map[string]any{}
	if labels != nil {
		meta["labels"] = labels
	}
	if annotations != nil {
		meta["annotations"] = annotations
	}
	body, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	if _, err := m.Client.CoreV1().Services(n.Namespace).Patch(ctx, n.Name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patching Service %s: %w", n, err)
	}
	return nil
}
