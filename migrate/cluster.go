package migrate

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"

	"github.com/shardproxy/shardproxy/selector"
)

// SyncResolution is how far the LastSync a healthy instance publishes may lag its real
// last sync. A node rewrites its status when the published value moves, so at most once
// per SyncResolution while its instances sync (every syncPeriod, 30 s by default): at
// 5,000 nodes ~17 writes/s (each with its Get: ~33 requests/s), a tenth of what a 30 s
// heartbeat cost, against kubelets' 500 node Lease renewals/s. In exchange a reader can
// tell a supervisor that stopped from an idle one: a node whose instances publish a
// LastSync rewrites its status at least every SyncResolution (with syncPeriod at most
// SyncResolution), so a status older than StatusStaleAfter was left by a supervisor that
// no longer runs, or cannot write.
const SyncResolution = 10 * HeartbeatInterval

// StatusStaleAfter is the age, by the API server's clock, past which `status --cluster`
// calls a node's status stale: twice SyncResolution.
const StatusStaleAfter = 2 * SyncResolution

// PublishedSync is the LastSync a node publishes for an instance whose last successful
// sync was last: last itself (to the second) when exact (the instance is failing, so it
// does not move), else last rounded down to a multiple of SyncResolution offset by a
// phase of the node's own, so that a fleet's nodes do not all rewrite their statuses at
// the same moment. Zero stays zero.
func PublishedSync(node string, last time.Time, exact bool) time.Time {
	if last.IsZero() {
		return time.Time{}
	}
	if exact {
		return last.UTC().Truncate(time.Second)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	phase := time.Duration(h.Sum32()%uint32(SyncResolution/time.Second)) * time.Second
	return last.Add(-phase).Truncate(SyncResolution).Add(phase).UTC()
}

// MaxReasonLen bounds a published Failing reason, in bytes.
const MaxReasonLen = 160

// FailingReason is the Failing a node publishes for an instance: why it is down (the
// first line of the reason: a panic's stack stays in /status), its last sync error, or
// why it is stale, each in words that do not change while the fault lasts (no ages: a
// reason that changed with every poll would rewrite the status every poll); "" when
// healthy. queued is when the oldest update not yet programmed was queued.
func FailingReason(healthy, up bool, downReason, lastError string, queued time.Time) string {
	var r string
	switch {
	case healthy:
		return ""
	case !up:
		r = "down"
		if line := firstLine(downReason); line != "" {
			r += ": " + line
		}
	case lastError != "":
		r = "sync failing: " + firstLine(lastError)
	case !queued.IsZero():
		r = "stale: an update queued at " + queued.UTC().Format(time.RFC3339) + " is not programmed"
	default:
		r = "stale: the sync loop finishes no sync"
	}
	if len(r) > MaxReasonLen {
		r = r[:MaxReasonLen-3] + "..."
	}
	return r
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(line)
}

// ClusterStatus is every instance of the fleet as the nodes' statuses report it.
type ClusterStatus struct {
	// Namespace holds the node statuses.
	Namespace string `json:"namespace"`
	// ServerTime is the API server's time when the statuses were read.
	ServerTime time.Time `json:"serverTime"`
	// Nodes is how many node statuses there are.
	Nodes int `json:"nodes"`
	// NodesWithoutStatus counts the Nodes that publish no status (not running shardproxy,
	// statusNamespace off, or never started); Sample names a few.
	NodesWithoutStatus NodeSample `json:"nodesWithoutStatus"`
	// Instances are the instances, by name.
	Instances []ClusterInstance `json:"instances"`
}

// NodeSample is a count of nodes and the first few of their names.
type NodeSample struct {
	Count  int      `json:"count"`
	Sample []string `json:"sample,omitempty"`
}

// maxSample is how many names a NodeSample keeps.
const maxSample = 10

func (s *NodeSample) add(node string) {
	s.Count++
	if len(s.Sample) < maxSample {
		s.Sample = append(s.Sample, node)
	}
}

// ClusterInstance is one instance across the nodes that run it.
type ClusterInstance struct {
	Name string `json:"name"`
	// Default is true when it serves unlabeled Services on some node.
	Default bool `json:"default,omitempty"`
	// ProxyNames are the label values it serves on any node.
	ProxyNames []string `json:"proxyNames,omitempty"`
	// Nodes is how many nodes run it; Healthy how many of them report it healthy in a
	// status that is not stale.
	Nodes   int `json:"nodes"`
	Healthy int `json:"healthy"`
	// Services is how many Services are its to serve: labeled with one of its proxy
	// names, or unlabeled for a default instance (ExternalName and headless Services
	// left out). It is counted from the Services, not from the nodes, which would
	// otherwise rewrite their statuses on every Service added anywhere.
	Services int `json:"services"`
	// Shadows is how many Services it holds in shadow on some node (a migration).
	Shadows int `json:"shadows,omitempty"`
	// OldestSync is the oldest LastSync its nodes publish, on OldestSyncNode; NewestSync
	// the newest. Healthy nodes publish it to within SyncResolution.
	OldestSync     time.Time `json:"oldestSync,omitzero"`
	OldestSyncNode string    `json:"oldestSyncNode,omitempty"`
	NewestSync     time.Time `json:"newestSync,omitzero"`
	// Problems are its nodes that are failing or stale, and why.
	Problems []NodeProblem `json:"problems,omitempty"`
}

// NodeProblem is a node on which an instance is failing, or whose status is stale.
type NodeProblem struct {
	Node string `json:"node"`
	// Reason is why: the node's Failing, or "status stale" with the Node's state.
	Reason string `json:"reason"`
	// Written is when the API server stored the node's status, by its clock (zero when
	// it recorded no time).
	Written time.Time `json:"written,omitzero"`
	// LastSync is the instance's last sync the node published, if any.
	LastSync time.Time `json:"lastSync,omitzero"`
}

// listPage is the page size of the lists ReadClusterStatus makes: at 5,000 nodes, ten
// requests per kind, and one page in memory at a time.
const listPage = 500

// ReadClusterStatus reads every node status in namespace, the Nodes and the Services,
// each a paged list (never a request per node), and sums them up per instance (only
// instance, when not empty). Liveness is judged on clock, the API server's: a status is
// stale when it was stored more than StatusStaleAfter ago and its instances publish
// LastSync (supervisors older than the field write only on change), or when it was
// stored more than 3 × HeartbeatInterval ago while a migration had it heartbeating.
//
// The steps: the Nodes' readiness (a failed list only leaves the Node's state out of
// the reasons), the server's time, each node status added to its instances
// (clusterTally.addNodeStatus), the Nodes without a status, the Services each instance
// is to serve (countServices), then the instances in order (result).
func ReadClusterStatus(ctx context.Context, client kubernetes.Interface, namespace string, clock ServerClock, instance string) (ClusterStatus, error) {
	t := newClusterTally(namespace, instance)
	nodes, err := listNodeStates(ctx, client)
	if err != nil && ctx.Err() != nil {
		return t.cs, err
	}
	t.nodes, t.nodesListed = nodes, err == nil
	if t.serverNow, err = clock.ServerNow(ctx); err != nil {
		return t.cs, err
	}
	t.cs.ServerTime = t.serverNow
	err = pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().ConfigMaps(namespace).List(ctx, opts)
	}).EachListItem(ctx, metav1.ListOptions{LabelSelector: LabelComponent + "=" + ComponentNodeStatus, Limit: listPage}, func(obj runtime.Object) error {
		return t.addNodeStatus(obj.(*corev1.ConfigMap))
	})
	if err != nil {
		return t.cs, fmt.Errorf("listing node statuses in %s: %w", namespace, err)
	}
	t.addNodesWithoutStatus()
	if err := t.countServices(ctx, client); err != nil {
		return t.cs, err
	}
	return t.result()
}

// clusterTally is a ClusterStatus while ReadClusterStatus sums it up.
type clusterTally struct {
	cs ClusterStatus
	// instance, when not empty, is the only instance summed up.
	instance  string
	serverNow time.Time
	// nodes is each Node's state ("Ready", "NotReady"), if nodesListed.
	nodes       map[string]string
	nodesListed bool
	// published are the nodes with a status.
	published map[string]bool
	insts     map[string]*ClusterInstance
	// proxyNames and shadows are, per instance, the union over its nodes.
	proxyNames, shadows map[string]map[string]bool
}

func newClusterTally(namespace, instance string) *clusterTally {
	return &clusterTally{
		cs:         ClusterStatus{Namespace: namespace},
		instance:   instance,
		published:  map[string]bool{},
		insts:      map[string]*ClusterInstance{},
		proxyNames: map[string]map[string]bool{},
		shadows:    map[string]map[string]bool{},
	}
}

// listNodeStates returns each Node's readiness, "Ready" or "NotReady", from a paged list.
func listNodeStates(ctx context.Context, client kubernetes.Interface) (map[string]string, error) {
	nodes := map[string]string{}
	err := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Nodes().List(ctx, opts)
	}).EachListItem(ctx, metav1.ListOptions{Limit: listPage}, func(obj runtime.Object) error {
		n := obj.(*corev1.Node)
		nodes[n.Name] = "NotReady"
		if nodeReady(n) {
			nodes[n.Name] = "Ready"
		}
		return nil
	})
	return nodes, err
}

// addNodeStatus adds one node's status ConfigMap to the instances it reports; a
// ConfigMap not named for a node is left out.
func (t *clusterTally) addNodeStatus(cm *corev1.ConfigMap) error {
	node, ok := strings.CutPrefix(cm.Name, ConfigMapPrefix)
	if !ok || node == "" {
		return nil
	}
	var st NodeStatus
	if err := json.Unmarshal([]byte(cm.Data[StatusKey]), &st); err != nil {
		return fmt.Errorf("node status %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	t.cs.Nodes++
	t.published[node] = true
	written := statusWritten(cm)
	stale := statusStale(st, written, t.serverNow)
	for name, is := range st.Instances {
		if t.instance != "" && name != t.instance {
			continue
		}
		t.addInstance(node, name, is, written, stale)
	}
	return nil
}

// statusStale reports whether a status the API server stored at written is stale at
// serverNow: written at no known time, older than StatusStaleAfter while its instances
// publish LastSync, or older than 3 × HeartbeatInterval while it heartbeats for a
// migration.
func statusStale(st NodeStatus, written, serverNow time.Time) bool {
	ago := serverNow.Sub(written)
	reportsSync := false
	for _, is := range st.Instances {
		reportsSync = reportsSync || !is.LastSync.IsZero()
	}
	return written.IsZero() ||
		reportsSync && ago > StatusStaleAfter ||
		st.Migrating() && ago > 3*HeartbeatInterval
}

// addInstance adds instance name as node reports it (is) to the instance's sums: its
// node count, proxy names, shadows, sync times, and whether the node is healthy or a
// problem, and why.
func (t *clusterTally) addInstance(node, name string, is InstanceStatus, written time.Time, stale bool) {
	ci := t.insts[name]
	if ci == nil {
		ci = &ClusterInstance{Name: name}
		t.insts[name] = ci
		t.proxyNames[name], t.shadows[name] = map[string]bool{}, map[string]bool{}
	}
	ci.Nodes++
	ci.Default = ci.Default || is.Default
	for _, p := range is.ProxyNames {
		t.proxyNames[name][p] = true
	}
	for _, s := range is.Shadow {
		t.shadows[name][s] = true
	}
	if !is.LastSync.IsZero() {
		if ci.OldestSync.IsZero() || is.LastSync.Before(ci.OldestSync) {
			ci.OldestSync, ci.OldestSyncNode = is.LastSync, node
		}
		if is.LastSync.After(ci.NewestSync) {
			ci.NewestSync = is.LastSync
		}
	}
	reason := t.problem(node, is.Failing, stale)
	if reason == "" {
		ci.Healthy++
		return
	}
	ci.Problems = append(ci.Problems, NodeProblem{Node: node, Reason: reason, Written: written, LastSync: is.LastSync})
}

// problem is why an instance on node is not healthy: its Failing, and "status stale"
// with the Node's state (when the Nodes were listed) if stale; "" when it is healthy.
func (t *clusterTally) problem(node, failing string, stale bool) string {
	var reason []string
	if failing != "" {
		reason = append(reason, failing)
	}
	if stale {
		r := "status stale"
		if t.nodesListed {
			state, ok := t.nodes[node]
			if !ok {
				state = "gone"
			}
			r += ", Node " + state
		}
		reason = append(reason, r)
	}
	return strings.Join(reason, "; ")
}

// addNodesWithoutStatus counts the listed Nodes that publish no status.
func (t *clusterTally) addNodesWithoutStatus() {
	if !t.nodesListed {
		return
	}
	for _, n := range slices.Sorted(maps.Keys(t.nodes)) {
		if !t.published[n] {
			t.cs.NodesWithoutStatus.add(n)
		}
	}
}

// countServices settles each instance's proxy names and shadows, then counts the
// Services that are its to serve, by the label the router reads: labeled with one of
// its proxy names, or unlabeled for a default instance.
func (t *clusterTally) countServices(ctx context.Context, client kubernetes.Interface) error {
	byLabel := map[string][]string{}
	var defaults []string
	for name, ci := range t.insts {
		ci.ProxyNames = slices.Sorted(maps.Keys(t.proxyNames[name]))
		ci.Shadows = len(t.shadows[name])
		for _, p := range ci.ProxyNames {
			byLabel[p] = append(byLabel[p], name)
		}
		if ci.Default {
			defaults = append(defaults, name)
		}
	}
	if len(t.insts) == 0 {
		return nil
	}
	err := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return client.CoreV1().Services("").List(ctx, opts)
	}).EachListItem(ctx, metav1.ListOptions{Limit: listPage}, func(obj runtime.Object) error {
		s := obj.(*corev1.Service)
		if s.Spec.Type == corev1.ServiceTypeExternalName || s.Spec.ClusterIP == corev1.ClusterIPNone {
			return nil
		}
		served := defaults
		if label, ok := s.Labels[selector.LabelServiceProxyName]; ok {
			served = byLabel[label]
		}
		for _, name := range served {
			t.insts[name].Services++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	return nil
}

// result returns the ClusterStatus: the instances by name, each one's problems by
// reason, then node. Asked for one instance that no node reports, it is an error.
func (t *clusterTally) result() (ClusterStatus, error) {
	for _, ci := range t.insts {
		sort.Slice(ci.Problems, func(i, j int) bool {
			if ci.Problems[i].Reason != ci.Problems[j].Reason {
				return ci.Problems[i].Reason < ci.Problems[j].Reason
			}
			return ci.Problems[i].Node < ci.Problems[j].Node
		})
		t.cs.Instances = append(t.cs.Instances, *ci)
	}
	sort.Slice(t.cs.Instances, func(i, j int) bool { return t.cs.Instances[i].Name < t.cs.Instances[j].Name })
	if t.instance != "" && len(t.cs.Instances) == 0 {
		return t.cs, fmt.Errorf("no node in %s reports an instance %q", t.cs.Namespace, t.instance)
	}
	return t.cs, nil
}

// maxProblemLines is how many nodes WriteClusterStatus names per reason; the JSON and
// YAML outputs name them all.
const maxProblemLines = 5

// WriteClusterStatus prints cs as a table, one row per instance, then per instance the
// nodes that are failing or stale grouped by reason.
func WriteClusterStatus(w io.Writer, cs ClusterStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tSERVES\tNODES\tHEALTHY\tFAILING/STALE\tSERVICES\tSHADOWS\tLAST SYNC (OLDEST)")
	for _, ci := range cs.Instances {
		serves := strings.Join(ci.ProxyNames, ",")
		if ci.Default {
			serves = strings.Trim("<unlabeled>,"+serves, ",")
		}
		last := "-"
		if !ci.OldestSync.IsZero() {
			last = fmt.Sprintf("%s ago (%s)", ago(cs.ServerTime.Sub(ci.OldestSync)), ci.OldestSyncNode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", ci.Name, serves, ci.Nodes, ci.Healthy, len(ci.Problems), ci.Services, ci.Shadows, last)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, ci := range cs.Instances {
		if len(ci.Problems) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d node(s) failing or stale\n", ci.Name, len(ci.Problems))
		for i := 0; i < len(ci.Problems); {
			j := i
			for j < len(ci.Problems) && ci.Problems[j].Reason == ci.Problems[i].Reason {
				j++
			}
			var names []string
			for _, p := range ci.Problems[i:min(j, i+maxProblemLines)] {
				written := "never"
				if !p.Written.IsZero() {
					written = ago(cs.ServerTime.Sub(p.Written)) + " ago"
				}
				names = append(names, fmt.Sprintf("%s (status written %s)", p.Node, written))
			}
			if j-i > maxProblemLines {
				names = append(names, fmt.Sprintf("and %d more", j-i-maxProblemLines))
			}
			fmt.Fprintf(w, "  %s: %d node(s): %s\n", ci.Problems[i].Reason, j-i, strings.Join(names, ", "))
			i = j
		}
	}
	if n := cs.NodesWithoutStatus; n.Count > 0 {
		more := ""
		if n.Count > len(n.Sample) {
			more = fmt.Sprintf(" and %d more", n.Count-len(n.Sample))
		}
		fmt.Fprintf(w, "\n%d Node(s) publish no status in %s (not running shardproxy, or never started): %s%s\n",
			n.Count, cs.Namespace, strings.Join(n.Sample, ", "), more)
	}
	return nil
}

// ago rounds a duration for people: seconds under a minute, else minutes.
func ago(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}
