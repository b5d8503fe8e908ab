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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// ClientQPS and ClientBurst are the limits of the CLI's Mover client (a kubeconfig sets
// none), this project's choice over client-go's 5 and 10 (the same numbers kubectl gives
// its discovery client; its main client keeps 5 and 10). A batch's patches then reach the nodes within a second, so each node publishes
// a batch's shadows in about one status write; at QPS 5 its 20 patches arrived over four
// seconds and every node wrote a partial list after each sync (12–13 status writes per
// node and batch in docs/fleet.md, against 2).
const (
	ClientQPS   = 50
	ClientBurst = 300
)

// Mover moves Services between proxies through the shadow marker and the node statuses.
// The marker is a label (selector.LabelShadow: a node running no default instance
// selects its watch on it) and, for supervisors older than the label, the annotation
// (selector.AnnotationShadow); every patch sets or removes both.
type Mover struct {
	Client kubernetes.Interface
	// StatusNamespace holds the node status ConfigMaps.
	StatusNamespace string
	// Out receives progress lines.
	Out io.Writer
	// BatchSize is how many Services move together; 0 means DefaultBatchSize, a
	// negative size is an error.
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
	// LegacyTimeout bounds how long a rollback waits, after handing Services back, for
	// every live node to confirm that their new proxy programmed them (HandedBack in its
	// status: kube-proxy's rules for them are in the node's kernel, or a local instance
	// owns and programmed them); the shadow serves them until then. Default 5m (upstream
	// kube-proxy's first sync of 10,000 Services takes ~30 s here). Past it the shadow
	// stays on the Services that were not confirmed, and the rollback fails.
	LegacyTimeout time.Duration
	// Poll is how often node statuses are read; default 250ms.
	Poll time.Duration
	// Now is the local clock, for deadlines and durations; default time.Now.
	Now func() time.Time
}

// DefaultBatchSize is how many Services move together unless BatchSize says otherwise.
const DefaultBatchSize = 20

func (m *Mover) defaults() {
	if m.BatchSize == 0 {
		m.BatchSize = DefaultBatchSize
	}
	if m.Timeout == 0 {
		m.Timeout = 2 * time.Minute
	}
	if m.StaleAfter == 0 {
		m.StaleAfter = 3 * HeartbeatInterval
	}
	if m.LegacyTimeout == 0 {
		m.LegacyTimeout = 5 * time.Minute
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
// Services stay where they were. A Ready node whose status names an instance serving to
// but went stale holds every batch up (silentNode.blocks); the nodes it does not wait
// for are named first (reportNodes).
func (m *Mover) Move(ctx context.Context, sel Selection, to string) (Report, error) {
	m.defaults()
	var rep Report
	if m.BatchSize < 0 {
		return rep, fmt.Errorf("batch size %d: must be at least 1", m.BatchSize)
	}
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
	if len(todo) > 0 {
		if err := m.reportNodes(ctx, to); err != nil {
			return rep, err
		}
	}
	owner := map[types.NamespacedName]*string{}
	for _, s := range svcs {
		if label, ok := s.Labels[selector.LabelServiceProxyName]; ok {
			owner[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = &label
		}
	}
	confirm := m.shadowConfirmation()
	confirm.unchanged = sameInstance(func(n types.NamespacedName) *string { return owner[n] })
	unshadow := map[string]*string{selector.LabelShadow: nil}
	for i := 0; i < len(todo); i += m.BatchSize {
		if ctx.Err() != nil {
			return rep, fmt.Errorf("interrupted before batch %d: %w", rep.Batches+1, context.Cause(ctx))
		}
		batch := todo[i:min(i+m.BatchSize, len(todo))]
		rep.Batches++
		start := m.Now()
		before, _, err := m.readStatuses(ctx)
		if err != nil {
			return rep, err
		}
		for j, n := range batch {
			if err := m.patch(ctx, n, map[string]*string{selector.LabelShadow: &to}, map[string]*string{selector.AnnotationShadow: &to}); err != nil {
				return rep, m.putBack(ctx, batch[:j], unshadow, fmt.Errorf("batch %d: %w", rep.Batches, err), "stay where they were")
			}
		}
		nodes, err := m.waitConfirmed(ctx, batch, to, before, confirm)
		if err != nil {
			return rep, m.putBack(ctx, batch, unshadow, fmt.Errorf("batch %d: %w", rep.Batches, err), "stay where they were")
		}
		// Every node confirmed the batch: the step in flight is labeling it, and it is
		// finished even when the run is interrupted now (a few patches), so that no batch
		// is left half labeled.
		finish, cancel := settling(ctx)
		for _, n := range batch {
			if err := m.patch(finish, n, map[string]*string{selector.LabelServiceProxyName: &to, selector.LabelShadow: nil},
				map[string]*string{selector.AnnotationShadow: nil}); err != nil {
				cancel()
				return rep, err
			}
		}
		cancel()
		rep.Moved += len(batch)
		fmt.Fprintf(m.Out, "batch %d: %d Services programmed in shadow on %d node(s) (%s) after %v; labeled %s\n",
			rep.Batches, len(batch), len(nodes), strings.Join(nodes, ", "), m.Now().Sub(start).Round(time.Millisecond), to)
	}
	return rep, nil
}

// settleTimeout bounds the patches that finish or undo a step after the run was
// interrupted: they no longer end with its context, only with this.
const settleTimeout = 30 * time.Second

// settling returns the context of patches that must run even though ctx has ended (an
// interrupted run finishing its step or putting its batch back): ctx's values, not its
// cancellation, and settleTimeout.
func settling(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
}

// putBack undoes a batch's step: each Service of svcs gets labels (the shadow's label
// removed, and for a rollback its proxy-name label back) and loses the shadow annotation.
// It returns cause, saying the Services stay where the step found them (where), or also
// naming those it could not put back and how to do it by hand.
func (m *Mover) putBack(ctx context.Context, svcs []types.NamespacedName, labels map[string]*string, cause error, where string) error {
	if len(svcs) == 0 {
		return fmt.Errorf("%w; its Services %s", cause, where)
	}
	settle, cancel := settling(ctx)
	defer cancel()
	var failed []string
	var errs []error
	for _, n := range svcs {
		if err := m.patch(settle, n, labels, map[string]*string{selector.AnnotationShadow: nil}); err != nil {
			failed = append(failed, n.String())
			errs = append(errs, err)
		}
	}
	if len(failed) == 0 {
		fmt.Fprintf(m.Out, "put back %d Services: they %s\n", len(svcs), where)
		return fmt.Errorf("%w; its Services %s", cause, where)
	}
	return fmt.Errorf("%w; putting the batch back failed for %s (%w): they keep the shadow %s and %s; put them back by hand "+
		"(kubectl label service -n NAMESPACE NAME %s- && kubectl annotate service -n NAMESPACE NAME %s-)",
		cause, strings.Join(failed, ", "), errors.Join(errs...), selector.LabelShadow, selector.AnnotationShadow, selector.LabelShadow, selector.AnnotationShadow)
}

// Rollback hands the selected Services labeled from back to the unlabeled (legacy)
// proxy, or to the proxy named by to. Per batch:
//
//  1. The owner steps back (unless one instance serves from and to on every node that
//     reports from: it keeps the Services): the annotation names from, the proxy the
//     label names, so its instances keep programming the Services but only as a shadow
//     and give up what an owner holds, the health-check node ports. Rollback waits
//     until every live node running an instance for from reports them in shadow: the
//     legacy proxy must find those ports free, because kube-proxy tries to bind one only
//     when it syncs, and nothing makes it sync again once it has programmed the Service.
//     If a node does not confirm within Timeout the rollback goes on regardless (with a
//     warning): handing back is never less safe than keeping the Services, whose rules
//     stay either way.
//  2. One patch moves the label (removes it, or sets to); the shadow stays, so the
//     instance keeps serving while the legacy proxy programs them (its rules run first).
//  3. Once every live node running from reports the batch handed back (the new proxy
//     programmed it there, InstanceStatus.HandedBack), the shadow goes; past
//     LegacyTimeout it stays and Rollback fails (see handBack).
func (m *Mover) Rollback(ctx context.Context, sel Selection, from, to string) (Report, error) {
	m.defaults()
	var rep Report
	if m.BatchSize < 0 {
		return rep, fmt.Errorf("batch size %d: must be at least 1", m.BatchSize)
	}
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
	if len(todo) > 0 {
		if err := m.reportNodes(ctx, from); err != nil && ctx.Err() != nil {
			return rep, err
		} else if err != nil {
			fmt.Fprintf(m.Out, "warning: %v\n", err)
		}
	}
	// Putting a batch back gives it to from again, the owner it had.
	restore := map[string]*string{selector.LabelServiceProxyName: &from, selector.LabelShadow: nil}
	for i := 0; i < len(todo); i += m.BatchSize {
		if ctx.Err() != nil {
			return rep, fmt.Errorf("interrupted before batch %d: %w", rep.Batches+1, context.Cause(ctx))
		}
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
		case len(m.liveNodes(before, from, serverNow)) == 0 && !m.anyBlocking(ctx, before, from, serverNow):
			fmt.Fprintf(m.Out, "batch %d: warning: no live node reports an instance serving %q; handing back without confirming it stepped back\n",
				rep.Batches, from)
		case label != nil && oneInstance(before, from, *label):
			// The owner keeps the Services under the other name: stepping back would only
			// release their health-check node ports for a while, for no one.
			stepped = fmt.Sprintf("%s and %s are one instance on every node, nothing to step back; ", from, to)
		default:
			for j, n := range batch {
				if err := m.patch(ctx, n, map[string]*string{selector.LabelShadow: &from}, map[string]*string{selector.AnnotationShadow: &from}); err != nil {
					return rep, m.putBack(ctx, batch[:j], restore, fmt.Errorf("batch %d: %w", rep.Batches, err), "stay with "+from)
				}
			}
			nodes, err := m.waitConfirmed(ctx, batch, from, before, m.shadowConfirmation())
			switch {
			case err == nil:
				stepped = fmt.Sprintf("%s stepped back to a shadow on %d node(s) (%s) after %v; ",
					from, len(nodes), strings.Join(nodes, ", "), m.Now().Sub(start).Round(time.Millisecond))
			case ctx.Err() != nil:
				// Interrupted: the Services go back to their owner as they were.
				return rep, m.putBack(ctx, batch, restore, fmt.Errorf("batch %d: %w", rep.Batches, err), "stay with "+from)
			default:
				// Not confirmed in time (an old or stuck supervisor), or the statuses
				// cannot be read: hand back all the same.
				fmt.Fprintf(m.Out, "batch %d: warning: %v; handing back anyway (a legacy proxy may not bind their health-check node ports before its next sync)\n",
					rep.Batches, err)
			}
		}
		handed, err := m.handBack(ctx, batch, from, label)
		if err != nil && ctx.Err() != nil {
			// Interrupted: the shadow of from kept serving the batch all along, so giving
			// it back to from (label and shadow in one patch) leaves no node without rules;
			// waiting out the hand-back instead could take LegacyTimeout.
			return rep, m.putBack(ctx, batch, restore, fmt.Errorf("batch %d: %s%w", rep.Batches, stepped, err), "stay with "+from)
		}
		if err != nil {
			return rep, fmt.Errorf("batch %d: %s%w", rep.Batches, stepped, err)
		}
		rep.Moved += len(batch)
		fmt.Fprintf(m.Out, "batch %d: %s%d Services handed back to %s; %s\n", rep.Batches, stepped, len(batch), dest, handed)
	}
	return rep, nil
}

// handBack moves a batch's label (to label, or removes it) while the shadow of from
// keeps serving it, waits until every live node running from confirms that the proxy
// the label now names has programmed the batch, and only then removes the shadow. When
// a node does not confirm within LegacyTimeout the shadow stays (it goes on serving, so
// no node is left without rules) and the error says so. It returns what it waited for.
func (m *Mover) handBack(ctx context.Context, batch []types.NamespacedName, from string, label *string) (string, error) {
	start := m.Now()
	before, _, err := m.readStatuses(ctx)
	if err != nil {
		return "", err
	}
	if ctx.Err() != nil {
		return "", fmt.Errorf("interrupted before handing back: %w", context.Cause(ctx))
	}
	// The label moves for the whole batch even when the run is interrupted halfway: a
	// Rollback that is interrupted then puts the whole batch back.
	move, cancel := settling(ctx)
	defer cancel()
	for _, n := range batch {
		if err := m.patch(move, n, map[string]*string{selector.LabelServiceProxyName: label, selector.LabelShadow: &from},
			map[string]*string{selector.AnnotationShadow: &from}); err != nil {
			return "", err
		}
	}
	confirm := m.handedBackConfirmation()
	confirm.unchanged = sameInstance(func(types.NamespacedName) *string { return label })
	nodes, err := m.waitConfirmed(ctx, batch, from, before, confirm)
	var handed string
	switch {
	case errors.Is(err, errNoLiveNode):
		handed = fmt.Sprintf("no live node runs %s to keep them in shadow", from)
	case err != nil && ctx.Err() != nil:
		return "", fmt.Errorf("interrupted while waiting for the nodes to confirm the hand-back: %w", context.Cause(ctx))
	case err != nil:
		return "", fmt.Errorf("%w; the batch keeps the shadow %s=%s (label and annotation), so %s goes on serving it: remove both once the proxy runs there (kubectl label service -n NAMESPACE NAME %s- && kubectl annotate service -n NAMESPACE NAME %s-)",
			err, selector.AnnotationShadow, from, from, selector.LabelShadow, selector.AnnotationShadow)
	default:
		handed = fmt.Sprintf("programmed by it on %d node(s) (%s) after %v, when %s let go", len(nodes), strings.Join(nodes, ", "),
			m.Now().Sub(start).Round(time.Millisecond), from)
	}
	for _, n := range batch {
		if err := m.patch(ctx, n, map[string]*string{selector.LabelShadow: nil}, map[string]*string{selector.AnnotationShadow: nil}); err != nil {
			return "", err
		}
	}
	return handed, nil
}

// errNotConfirmed: the nodes did not confirm a batch (within the Timeout, or none runs
// an instance for the proxy name).
var errNotConfirmed = errors.New("not programmed in shadow")

// errNotHandedBack: the nodes did not confirm, within LegacyTimeout, that the proxy the
// Services were handed back to has programmed them.
var errNotHandedBack = errors.New("not programmed by the proxy they were handed back to")

// errNoLiveNode: no live node runs an instance for the proxy name.
var errNoLiveNode = errors.New("no live node runs an instance serving the proxy name")

// confirmation is what a wait for the nodes looks for in their statuses.
type confirmation struct {
	// listed returns the Services an instance's status confirms.
	listed func(InstanceStatus) []string
	// failed wraps the error of a wait that timed out.
	failed  error
	timeout time.Duration
	// unchanged, if set, reports whether Service n changes nothing on the node of st:
	// the instance inst serving the proxy name waited for is also the one serving the
	// Service's other proxy name (its label before a move, after a hand-back). The router
	// gives an instance no shadow of a Service it owns, so such a node has nothing to
	// report, and nothing to program: it confirms the Service as it is.
	unchanged func(st NodeStatus, inst string, n types.NamespacedName) bool
}

// unchangedOn tells whether every Service of batch is unchanged (c.unchanged) on the
// node of st, whose instance serving proxyName answers for it.
func (c confirmation) unchangedOn(st NodeStatus, proxyName string, batch []types.NamespacedName) bool {
	inst, ok := st.ServesProxyName(proxyName)
	if c.unchanged == nil || !ok {
		return false
	}
	for _, n := range batch {
		if !c.unchanged(st, inst, n) {
			return false
		}
	}
	return true
}

// oneInstance tells whether, on every node whose status names an instance serving proxy
// name a (at least one), that instance serves proxy name b too.
func oneInstance(statuses []publishedStatus, a, b string) bool {
	found := false
	for _, st := range statuses {
		inst, ok := st.ServesProxyName(a)
		if !ok {
			continue
		}
		if !slices.Contains(st.Instances[inst].ProxyNames, b) {
			return false
		}
		found = true
	}
	return found
}

// sameInstance returns a confirmation's unchanged for the proxy name labelOf gives each
// Service (nil: unlabeled, served by the node's default instance).
func sameInstance(labelOf func(types.NamespacedName) *string) func(NodeStatus, string, types.NamespacedName) bool {
	return func(st NodeStatus, inst string, n types.NamespacedName) bool {
		is, ok := st.Instances[inst]
		if !ok {
			return false
		}
		if label := labelOf(n); label != nil {
			return slices.Contains(is.ProxyNames, *label)
		}
		return is.Default
	}
}

// shadowConfirmation: the instance programmed the Services in shadow.
func (m *Mover) shadowConfirmation() confirmation {
	return confirmation{listed: func(is InstanceStatus) []string { return is.Shadow }, failed: errNotConfirmed, timeout: m.Timeout}
}

// handedBackConfirmation: the proxy the Services were handed back to programmed them.
func (m *Mover) handedBackConfirmation() confirmation {
	return confirmation{listed: func(is InstanceStatus) []string { return is.HandedBack }, failed: errNotHandedBack, timeout: m.LegacyTimeout}
}

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

// waitConfirmed waits until every live node running an instance for proxyName confirms
// every Service of the batch (c.listed), and no Ready node whose status went stale is
// left but those on which the batch changes nothing (c.unchanged, by their last status).
// It returns the nodes that confirmed.
//
// before are the statuses read before the batch was annotated. A node whose status
// already listed a Service then (a shadow of an earlier migration step the supervisor has
// not reported gone yet) confirms it only in a status written since: otherwise a stale
// entry could confirm a Service the instance is about to drop and program again.
func (m *Mover) waitConfirmed(ctx context.Context, batch []types.NamespacedName, proxyName string, before []publishedStatus, c confirmation) ([]string, error) {
	deadline := m.Now().Add(c.timeout)
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
		blocking, err := m.silentNodes(ctx, statuses, proxyName, serverNow)
		if err != nil {
			return nil, err
		}
		for _, sn := range blocking {
			switch {
			case !sn.blocks():
			case c.unchangedOn(sn.status, proxyName, batch):
				// An idle node writes its status only when it changes, and a batch that
				// changes nothing there changes none: its last status answers for it.
				nodes = append(nodes, sn.name)
			default:
				missing = append(missing, sn.String())
			}
		}
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
				if c.unchanged != nil && c.unchanged(st.NodeStatus, inst, n) {
					continue
				}
				listed := slices.Contains(c.listed(st.Instances[inst]), n.String())
				stale := seen && prev.version == st.version && slices.Contains(c.listed(prev.Instances[inst]), n.String())
				if !listed || stale {
					missing = append(missing, st.Node+": "+n.String())
				}
			}
		}
		sort.Strings(nodes)
		if len(nodes) == 0 && len(missing) == 0 {
			return nil, fmt.Errorf("%w: %w %q (node statuses in %s)", c.failed, errNoLiveNode, proxyName, m.StatusNamespace)
		}
		if len(missing) == 0 {
			return nodes, nil
		}
		if m.Now().After(deadline) {
			if len(missing) > 10 {
				missing = append(missing[:10], fmt.Sprintf("and %d more", len(missing)-10))
			}
			return nil, fmt.Errorf("%w within %v: %s", c.failed, c.timeout, strings.Join(missing, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
		case <-time.After(m.Poll):
		}
	}
}

// silentNode is a node that ran an instance for a proxy name (its status says so) but
// has not written its status within StaleAfter.
type silentNode struct {
	name  string
	since time.Duration
	// state is the Node object's: "Ready", "NotReady", or "gone" when there is none.
	state string
	// status is the node's last status.
	status NodeStatus
}

// blocks tells whether the node holds up a batch: a Ready node whose supervisor stopped
// reporting may still be running the legacy rules that the label move would take away,
// with nothing of shardproxy's to replace them. A node that is NotReady or gone serves
// nothing either way.
func (n silentNode) blocks() bool { return n.state == "Ready" }

func (n silentNode) String() string {
	return fmt.Sprintf("%s: no status for %v, Node %s", n.name, n.since.Round(time.Second), n.state)
}

// nodeGetsAtMost is how many Nodes silentNodes reads one GET each; for more stale
// statuses it lists the Nodes once. A batch held up by a few stopped supervisors then
// polls a few small GETs rather than every Node of the cluster, and a cluster at rest
// (statuses are written only on change, so most are stale after StaleAfter) costs one
// request rather than one per node (~N/50 s at the CLI's QPS).
const nodeGetsAtMost = 10

// staleStatuses returns the statuses that name an instance for proxyName but are stale
// at serverNow.
func (m *Mover) staleStatuses(statuses []publishedStatus, proxyName string, serverNow time.Time) []publishedStatus {
	var stale []publishedStatus
	for _, st := range statuses {
		if _, ok := st.ServesProxyName(proxyName); ok && !m.live(st, serverNow) {
			stale = append(stale, st)
		}
	}
	return stale
}

// silentNodes returns the nodes whose status names an instance for proxyName but is
// stale at serverNow, with their Node's readiness: one GET per Node for up to
// nodeGetsAtMost of them, else one list of the Nodes.
func (m *Mover) silentNodes(ctx context.Context, statuses []publishedStatus, proxyName string, serverNow time.Time) ([]silentNode, error) {
	stale := m.staleStatuses(statuses, proxyName, serverNow)
	if len(stale) > nodeGetsAtMost {
		nodes, err := m.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing the Nodes, %d of whose shardproxy statuses are stale: %w", len(stale), err)
		}
		return m.silent(stale, nodes.Items, serverNow), nil
	}
	var nodes []corev1.Node
	for _, st := range stale {
		node, err := m.Client.CoreV1().Nodes().Get(ctx, st.Node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("reading Node %s, whose shardproxy status is stale: %w", st.Node, err)
		default:
			nodes = append(nodes, *node)
		}
	}
	return m.silent(stale, nodes, serverNow), nil
}

// silent returns the silent nodes of the stale statuses, each with the readiness of its
// Node among nodes: "gone" when it has none there.
func (m *Mover) silent(stale []publishedStatus, nodes []corev1.Node, serverNow time.Time) []silentNode {
	byName := make(map[string]*corev1.Node, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	out := make([]silentNode, 0, len(stale))
	for _, st := range stale {
		sn := silentNode{name: st.Node, since: serverNow.Sub(st.written), state: "gone", status: st.NodeStatus}
		if node, ok := byName[st.Node]; ok {
			sn.state = "NotReady"
			if nodeReady(node) {
				sn.state = "Ready"
			}
		}
		if st.written.IsZero() {
			sn.since = m.StaleAfter
		}
		out = append(out, sn)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// anyBlocking tells whether a silent node holds up a batch (an error reading Nodes counts
// as yes: the wait then names it).
func (m *Mover) anyBlocking(ctx context.Context, statuses []publishedStatus, proxyName string, serverNow time.Time) bool {
	silent, err := m.silentNodes(ctx, statuses, proxyName, serverNow)
	return err != nil || slices.ContainsFunc(silent, silentNode.blocks)
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// reportNodes prints, before a move or rollback, the nodes it does not wait for: those
// whose status is stale while their Node is NotReady or gone (they serve nothing), and
// the Nodes that never published a status (not running shardproxy, or never started).
// A stale status of a Ready node is not among them: it holds up every batch.
func (m *Mover) reportNodes(ctx context.Context, proxyName string) error {
	statuses, serverNow, err := m.readStatuses(ctx)
	if err != nil {
		return err
	}
	// One list answers both questions: which silent nodes are Ready, and which Nodes
	// never published a status.
	nodes, listErr := m.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	stale := m.staleStatuses(statuses, proxyName, serverNow)
	if listErr != nil && len(stale) > 0 {
		return fmt.Errorf("listing the Nodes, %d of whose shardproxy statuses are stale: %w", len(stale), listErr)
	}
	if listErr != nil {
		fmt.Fprintf(m.Out, "warning: cannot list Nodes to name those without a shardproxy status: %v\n", listErr)
		return nil
	}
	for _, sn := range m.silent(stale, nodes.Items, serverNow) {
		if !sn.blocks() {
			fmt.Fprintf(m.Out, "not waiting for %s\n", sn)
		}
	}
	published := map[string]bool{}
	for _, st := range statuses {
		published[st.Node] = true
	}
	var never []string
	for _, n := range nodes.Items {
		if !published[n.Name] {
			never = append(never, n.Name)
		}
	}
	if len(never) > 0 {
		sort.Strings(never)
		fmt.Fprintf(m.Out, "not waiting for %d Node(s) without a shardproxy status in %s (not running it, or it never started): %s\n",
			len(never), m.StatusNamespace, strings.Join(never, ", "))
	}
	return nil
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
