package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/shardproxy/shardproxy/migrate"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// MigrationTarget is the proxy name, and the name of the instance serving it, that the
// migrate step moves Services to: every hollow node of a fleet with Options.Migrate runs
// it beside its default instance.
const MigrationTarget = "team-a"

// LabelMigrate marks the Services the migrate step moves (MarkForMigration): the step
// selects them with a label selector, one list, as an operator moving a set would.
const LabelMigrate = "fleet.shardproxy.io/migrate"

// MarkForMigration labels the first n Services of c (before Prepare creates them) for
// the migrate step.
func MarkForMigration(c *gen.Cluster, n int) {
	for i := range min(n, len(c.Services)) {
		if c.Services[i].Labels == nil {
			c.Services[i].Labels = map[string]string{}
		}
		c.Services[i].Labels[LabelMigrate] = "true"
	}
}

// MigrationStep is what one `migrate move` or `rollback` cost and did.
type MigrationStep struct {
	// Name is "move", "rollback" or "blocked move".
	Name string
	// Took is the Mover's run, from the Lease taken to its return.
	Took time.Duration
	// Report is the Mover's.
	Report migrate.Report
	// Confirmed is the fewest nodes any wait of the step named as confirming (every
	// batch's output lists them): N when every node confirmed every batch.
	Confirmed int
	// Err is the step's error (only the blocked move has one).
	Err string
	// Mover are the Mover's own requests by "verb resource", counted in its transport
	// (its Lease and clock included).
	Mover Counts
	// Nodes are the hollow nodes' requests over the step.
	Nodes Counts
	// StatusWrites are the nodes' status writes over the step by what each changed
	// (statusWatch): "shadow", "handedBack", "health", "holdings", "heartbeat".
	StatusWrites Counts
	// Server are the apiserver's counters over the step (zero without its metrics);
	// APIServerCPU its CPU time over the step (0 without its pid).
	Server       APIServerCounters
	APIServerCPU time.Duration
}

// Migration is the migrate step of one fleet: a move of the marked Services to
// MigrationTarget across every node, its rollback, and a move that one stopped node
// blocks.
type Migration struct {
	// Services is how many Services each step selects.
	Services int
	// Move, Rollback and Blocked are the three steps.
	Move, Rollback, Blocked MigrationStep
	// Stopped is the node whose supervisor was stopped before Blocked.
	Stopped string
	// Named are the nodes Blocked's error names.
	Named []string
}

// writeVerbs are the verbs of requests that write.
var writeVerbs = []string{"create", "update", "patch", "delete"}

// Writes sums the counts of write verbs ("create …", "update …", "patch …", "delete …").
func (c Counts) Writes() float64 {
	var t float64
	for k, v := range c {
		verb, _, _ := strings.Cut(k, " ")
		if slices.Contains(writeVerbs, strings.ToLower(verb)) {
			t += v
		}
	}
	return t
}

// runMigration is the migrate step (Options.Migrate) of a running shardproxy fleet:
// `migrate move` of the Services marked by MarkForMigration to MigrationTarget, then
// `migrate rollback`, each with a Mover and a Lease built as the CLI builds them (its
// own client from the admin's configuration, the CLI's limits migrate.ClientQPS and
// ClientBurst, the API server's clock) and waiting for every node's confirmation; then it stops the last
// node's supervisor and moves again, which must fail naming that node (within
// opts.BlockTimeout). After each step it checks what the nodes hold; the Services end
// where they started.
func runMigration(ctx context.Context, env Env, opts Options, nodes []*HollowNode, counter *RequestCounter) (*Migration, error) {
	if env.NodeConfig == nil {
		return nil, errors.New("migrate step: needs the API server's configuration for the mover's client")
	}
	names := make([]string, len(nodes))
	for i, h := range nodes {
		names[i] = h.Name
	}
	if err := dropOtherStatuses(ctx, env.Admin, names); err != nil {
		return nil, err
	}
	marked, err := env.Admin.CoreV1().Services(gen.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelMigrate + "=true"})
	if err != nil {
		return nil, fmt.Errorf("listing the Services to move: %w", err)
	}
	svcs := make([]types.NamespacedName, 0, len(marked.Items))
	for _, s := range marked.Items {
		if _, ok := s.Labels[selector.LabelServiceProxyName]; ok {
			return nil, fmt.Errorf("migrate step: Service %s/%s is labeled %s before the move", s.Namespace, s.Name, selector.LabelServiceProxyName)
		}
		svcs = append(svcs, types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
	}
	if len(svcs) == 0 {
		return nil, fmt.Errorf("migrate step: no Service labeled %s=true (MarkForMigration)", LabelMigrate)
	}
	m := &Migration{Services: len(svcs)}
	sel := migrate.Selection{Namespace: gen.Namespace, LabelSelector: LabelMigrate + "=true"}
	timeout := orDefault(opts.MigrateTimeout, 2*time.Minute)

	if opts.MigrateIdle > 0 {
		opts.Logf("%d nodes: idle for %v before the move", len(nodes), opts.MigrateIdle)
		select {
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(opts.MigrateIdle):
		}
	}
	m.Move, err = migrationStep(ctx, env, opts, counter, "move", timeout, func(ctx context.Context, mv *migrate.Mover) (migrate.Report, error) {
		return mv.Move(ctx, sel, MigrationTarget)
	})
	if err != nil {
		return m, err
	}
	opts.Logf("%d nodes: moved %d Services to %s in %v (%d batches, every batch confirmed by %d nodes)", len(nodes), m.Move.Report.Moved,
		MigrationTarget, m.Move.Took.Round(time.Millisecond), m.Move.Report.Batches, m.Move.Confirmed)
	if err := checkMoved(ctx, env.Admin, nodes, svcs, MigrationTarget, time.Minute); err != nil {
		return m, fmt.Errorf("after the move: %w", err)
	}

	m.Rollback, err = migrationStep(ctx, env, opts, counter, "rollback", timeout, func(ctx context.Context, mv *migrate.Mover) (migrate.Report, error) {
		return mv.Rollback(ctx, sel, MigrationTarget, "")
	})
	if err != nil {
		return m, err
	}
	opts.Logf("%d nodes: rolled %d Services back in %v (%d batches, every wait confirmed by %d nodes)", len(nodes), m.Rollback.Report.Moved,
		m.Rollback.Took.Round(time.Millisecond), m.Rollback.Report.Batches, m.Rollback.Confirmed)
	if err := checkMoved(ctx, env.Admin, nodes, svcs, "", time.Minute); err != nil {
		return m, fmt.Errorf("after the rollback: %w", err)
	}

	stopped := nodes[len(nodes)-1]
	m.Stopped = stopped.Name
	if err := stopped.Stop(); err != nil {
		return m, fmt.Errorf("stopping %s: %w", stopped.Name, err)
	}
	m.Blocked, err = migrationStep(ctx, env, opts, counter, "blocked move", orDefault(opts.BlockTimeout, 30*time.Second),
		func(ctx context.Context, mv *migrate.Mover) (migrate.Report, error) {
			return mv.Move(ctx, sel, MigrationTarget)
		})
	if err == nil {
		return m, fmt.Errorf("migrate move with %s stopped succeeded", stopped.Name)
	}
	if ctx.Err() != nil {
		return m, err
	}
	m.Blocked.Err = err.Error()
	m.Named = NamedNodes(err.Error())
	opts.Logf("%d nodes, %s stopped: the move failed after %v naming %v: %v", len(nodes), stopped.Name, m.Blocked.Took.Round(time.Millisecond), m.Named, err)
	if !slices.Equal(m.Named, []string{stopped.Name}) {
		return m, fmt.Errorf("migrate move with %s stopped names %v, want only it: %w", stopped.Name, m.Named, err)
	}
	if err := checkMoved(ctx, env.Admin, nodes[:len(nodes)-1], svcs, "", time.Minute); err != nil {
		return m, fmt.Errorf("after the blocked move: %w", err)
	}
	return m, nil
}

// migrationStep runs one Mover as `shardproxy migrate` builds it (newMover, exclusive)
// and counts what it and the nodes asked of the API server meanwhile.
func migrationStep(ctx context.Context, env Env, opts Options, nodeCounter *RequestCounter, name string, timeout time.Duration,
	run func(context.Context, *migrate.Mover) (migrate.Report, error)) (MigrationStep, error) {
	step := MigrationStep{Name: name}
	counter := NewRequestCounter()
	rc := rest.CopyConfig(env.NodeConfig())
	rc.UserAgent = "shardproxy-migrate/fleet"
	// A connection of its own, as the CLI on an operator's machine has.
	rc.Dial = newDialer()
	rc.WrapTransport = counter.Wrap
	// The CLI's client has its own default limits (a kubeconfig sets none: newMover), not
	// the admin configuration's.
	rc.QPS, rc.Burst = migrate.ClientQPS, migrate.ClientBurst
	if opts.MoverQPS > 0 {
		rc.QPS = opts.MoverQPS
	}
	if opts.MoverBurst > 0 {
		rc.Burst = opts.MoverBurst
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return step, err
	}
	clock, err := migrate.NewAPIServerClock(rc)
	if err != nil {
		return step, err
	}
	var out bytes.Buffer
	mv := &migrate.Mover{Client: client, Clock: clock, StatusNamespace: StatusNamespace, Out: &out, Timeout: timeout}
	beforeProc, beforeServer, beforeNodes, err := readCounters(ctx, env, nodeCounter)
	if err != nil {
		return step, err
	}
	statuses, err := watchStatuses(ctx, env.Admin)
	if err != nil {
		return step, err
	}
	start := time.Now()
	lock := &migrate.Lock{Client: client, Namespace: StatusNamespace, Clock: clock, Holder: "shardproxy-fleet " + name}
	lctx, release, err := lock.Acquire(ctx)
	if err != nil {
		statuses.Stop()
		return step, fmt.Errorf("migrate %s: %w", name, err)
	}
	step.Report, err = run(lctx, mv)
	release()
	step.Took = time.Since(start)
	step.StatusWrites = statuses.Stop()
	afterProc, afterServer, afterNodes, cerr := readCounters(ctx, env, nodeCounter)
	if cerr != nil {
		return step, errors.Join(err, cerr)
	}
	step.Mover = counter.Snapshot()
	step.Nodes = afterNodes.Sub(beforeNodes)
	step.Server = afterServer.Sub(beforeServer)
	step.APIServerCPU = afterProc.CPU - beforeProc.CPU
	step.Confirmed = confirmedNodes(out.String())
	if err != nil {
		return step, fmt.Errorf("migrate %s: %w\n%s", name, err, out.String())
	}
	return step, nil
}

// onNodes matches the Mover's "on 3 node(s)": the nodes one wait found confirming.
var onNodes = regexp.MustCompile(`on (\d+) node\(s\)`)

// confirmedNodes is the fewest nodes any wait in a Mover's output names (-1: none).
func confirmedNodes(out string) int {
	least := -1
	for _, m := range onNodes.FindAllStringSubmatch(out, -1) {
		if n, err := strconv.Atoi(m[1]); err == nil && (least < 0 || n < least) {
			least = n
		}
	}
	return least
}

// namedNode matches a node a Mover's error names: "node-4: bench/svc-0" (a live node
// that did not confirm a Service) or "node-4: no status for 1m40s, Node Ready".
var namedNode = regexp.MustCompile(`\b(node-\d+): `)

// NamedNodes returns the nodes a Mover's error names, sorted, each once.
func NamedNodes(msg string) []string {
	var out []string
	for _, m := range namedNode.FindAllStringSubmatch(msg, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkMoved waits until every Service of svcs carries proxy name `to` (empty: none)
// and no migration marker, and each node's instance serving `to` (MigrationTarget, or
// the default instance) holds it while the other has let go of it.
func checkMoved(ctx context.Context, admin kubernetes.Interface, nodes []*HollowNode, svcs []types.NamespacedName, to string, timeout time.Duration) error {
	owner, other := DefaultInstance, MigrationTarget
	if to != "" {
		owner, other = MigrationTarget, DefaultInstance
	}
	for _, n := range svcs {
		svc, err := admin.CoreV1().Services(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := svc.Labels[selector.LabelServiceProxyName]; got != to {
			return fmt.Errorf("Service %s has proxy name %q, want %q", n, got, to)
		}
		if v, ok := svc.Labels[selector.LabelShadow]; ok {
			return fmt.Errorf("Service %s keeps label %s=%s", n, selector.LabelShadow, v)
		}
		if v, ok := svc.Annotations[selector.AnnotationShadow]; ok {
			return fmt.Errorf("Service %s keeps annotation %s=%s", n, selector.AnnotationShadow, v)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		var wrong []string
		for _, h := range nodes {
			for _, n := range svcs {
				if !h.ProgrammedBy(owner, n) || h.ProgrammedBy(other, n) {
					wrong = append(wrong, fmt.Sprintf("%s %s (%s: %t, %s: %t)", h.Name, n, owner, h.ProgrammedBy(owner, n), other, h.ProgrammedBy(other, n)))
				}
			}
		}
		if len(wrong) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d node Services not held by %s alone after %v: %s", len(wrong), owner, timeout, strings.Join(wrong[:min(5, len(wrong))], "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dropOtherStatuses deletes the node status ConfigMaps of nodes not in names (an
// earlier, larger fleet's): their Nodes are still Ready, and a stale status of a Ready
// node blocks every move, as it should.
func dropOtherStatuses(ctx context.Context, admin kubernetes.Interface, names []string) error {
	list, err := admin.CoreV1().ConfigMaps(StatusNamespace).List(ctx, metav1.ListOptions{LabelSelector: migrate.LabelComponent + "=" + migrate.ComponentNodeStatus})
	if err != nil {
		return fmt.Errorf("listing node statuses: %w", err)
	}
	for _, cm := range list.Items {
		node, _ := strings.CutPrefix(cm.Name, migrate.ConfigMapPrefix)
		if slices.Contains(names, node) {
			continue
		}
		if err := admin.CoreV1().ConfigMaps(StatusNamespace).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s's status: %w", node, err)
		}
	}
	return nil
}

// orDefault returns d, or def when d is 0.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// MigrationTable formats the migrate steps of results, a row each.
func MigrationTable(results []*Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%-10s %-6s %-9s %-13s %-5s %-8s %-7s %-9s %-8s %-9s %-8s %-9s %-8s %-8s %s\n",
		"proxy", "nodes", "reserve", "step", "svcs", "took", "batches", "confirmed", "moverReq", "moverW", "nodeReq", "nodeW",
		"etcdW", "apiCPU", "watch events; mover requests; node requests; status writes by change / named")
	for _, r := range results {
		m := r.Migration
		if m == nil {
			continue
		}
		for _, s := range []MigrationStep{m.Move, m.Rollback, m.Blocked} {
			last := fmt.Sprintf("%s; %s; %s; status writes by change: %s", counts(s.Server.WatchEvents), counts(s.Mover), counts(s.Nodes),
				counts(s.StatusWrites))
			if s.Err != "" {
				last = fmt.Sprintf("%s stopped, named %s; %s", m.Stopped, strings.Join(m.Named, ","), last)
			}
			fmt.Fprintf(&b, "%-10s %-6d %-9s %-13s %-5d %-8s %-7d %-9d %-8.0f %-9.0f %-8.0f %-9.0f %-8.0f %-8s %s\n",
				r.Proxy, r.Nodes, r.Reserve(), s.Name, m.Services, s.Took.Round(10*time.Millisecond), s.Report.Batches,
				s.Confirmed, s.Mover.Total(), s.Mover.Writes(), s.Nodes.Total(), s.Nodes.Writes(), s.Server.EtcdWrites.Total(),
				s.APIServerCPU.Round(10*time.Millisecond), last)
		}
	}
	return b.String()
}

// counts formats c's four largest keys as totals: "patch services 300, ...".
func counts(c Counts) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c[a] != c[b] {
			if c[a] > c[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, 4)
	for _, k := range keys[:min(4, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, c[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// migrationFigures are the columns MigrationFit fits against N.
var migrationFigures = []struct {
	name string
	of   func(MigrationStep) float64
}{
	{"took s", func(s MigrationStep) float64 { return s.Took.Seconds() }},
	{"mover requests", func(s MigrationStep) float64 { return s.Mover.Total() }},
	{"mover writes", func(s MigrationStep) float64 { return s.Mover.Writes() }},
	{"node writes", func(s MigrationStep) float64 { return s.Nodes.Writes() }},
	{"watch events", func(s MigrationStep) float64 { return s.Server.WatchEvents.Total() }},
	{"etcd writes", func(s MigrationStep) float64 { return s.Server.EtcdWrites.Total() }},
}

// MigrationFit prints, for each reserve setting measured at two sizes or more, the
// growth per added node of the move's and the rollback's figures (least squares over
// the measured N) and their value along that line at FitNodes.
func MigrationFit(results []*Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "\nmigrate step, fit over the measured N: growth per added node; extrapolated to %d nodes\n", FitNodes)
	fmt.Fprintf(&b, "%-26s %-16s %-12s %s\n", "setting, step", "figure", "per node", "line")
	for _, reserve := range []string{"true", "false", config.OtherNodeAddressesPublished} {
		var rs []*Result
		for _, r := range results {
			if r.Migration != nil && r.Reserve() == reserve {
				rs = append(rs, r)
			}
		}
		if len(rs) < 2 {
			continue
		}
		ns := make([]float64, len(rs))
		for i, r := range rs {
			ns[i] = float64(r.Nodes)
		}
		for _, step := range []string{"move", "rollback"} {
			for _, f := range migrationFigures {
				ys := make([]float64, len(rs))
				for i, r := range rs {
					s := r.Migration.Move
					if step == "rollback" {
						s = r.Migration.Rollback
					}
					ys[i] = f.of(s)
				}
				a, slope := line(ns, ys)
				fmt.Fprintf(&b, "%-26s %-16s %-12.4g %.4g\n", fmt.Sprintf("reserve %s, %s", reserve, step), f.name, slope, a+slope*FitNodes)
			}
		}
	}
	return b.String()
}

// statusWatch classifies the node status writes made while it runs by what changed
// from each node's previous status: "shadow" (an instance's programmed shadows),
// "handedBack", "health" (Failing or LastSync), "holdings", "heartbeat" (nothing but
// the heartbeat: a migrating node's rewrite every HeartbeatInterval) or "created". A
// write that changes several counts under the first of these that it changes.
type statusWatch struct {
	mu     sync.Mutex
	last   map[string]migrate.NodeStatus
	counts Counts
	stop   func()
	done   chan struct{}
}

// watchStatuses lists the node statuses and watches them from there, with the admin's
// client (one watch: the driver's, not the mover's or the nodes').
func watchStatuses(ctx context.Context, admin kubernetes.Interface) (*statusWatch, error) {
	sel := metav1.ListOptions{LabelSelector: migrate.LabelComponent + "=" + migrate.ComponentNodeStatus}
	list, err := admin.CoreV1().ConfigMaps(StatusNamespace).List(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("listing node statuses: %w", err)
	}
	w := &statusWatch{last: map[string]migrate.NodeStatus{}, counts: Counts{}, done: make(chan struct{})}
	for i := range list.Items {
		if node, st, ok := decodeStatus(&list.Items[i]); ok {
			w.last[node] = st
		}
	}
	sel.ResourceVersion = list.ResourceVersion
	watcher, err := admin.CoreV1().ConfigMaps(StatusNamespace).Watch(ctx, sel)
	if err != nil {
		return nil, fmt.Errorf("watching node statuses: %w", err)
	}
	w.stop = watcher.Stop
	go func() {
		defer close(w.done)
		for ev := range watcher.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			node, st, ok := decodeStatus(cm)
			if !ok {
				continue
			}
			w.mu.Lock()
			prev, seen := w.last[node]
			w.counts[statusChange(prev, st, seen)]++
			w.last[node] = st
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// Stop ends the watch and returns the writes by cause.
func (w *statusWatch) Stop() Counts {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts
}

func decodeStatus(cm *corev1.ConfigMap) (string, migrate.NodeStatus, bool) {
	node, ok := strings.CutPrefix(cm.Name, migrate.ConfigMapPrefix)
	var st migrate.NodeStatus
	if !ok || json.Unmarshal([]byte(cm.Data[migrate.StatusKey]), &st) != nil {
		return "", st, false
	}
	return node, st, true
}

// statusChange names what changed from prev to cur (statusWatch).
func statusChange(prev, cur migrate.NodeStatus, seen bool) string {
	if !seen {
		return "created"
	}
	changed := func(f func(migrate.InstanceStatus) any) bool {
		for name, is := range cur.Instances {
			if !reflect.DeepEqual(f(is), f(prev.Instances[name])) {
				return true
			}
		}
		return len(cur.Instances) != len(prev.Instances)
	}
	switch {
	case changed(func(is migrate.InstanceStatus) any { return is.Shadow }):
		return "shadow"
	case changed(func(is migrate.InstanceStatus) any { return is.HandedBack }):
		return "handedBack"
	case changed(func(is migrate.InstanceStatus) any { return [2]any{is.Failing, is.LastSync} }):
		return "health"
	case !reflect.DeepEqual(prev.Holdings, cur.Holdings):
		return "holdings"
	default:
		return "heartbeat"
	}
}
