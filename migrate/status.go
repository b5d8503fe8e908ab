// Package migrate moves Services between a legacy proxy (upstream kube-proxy) and
// shardproxy instances, and back, without a failed connection: the target programs the
// Services in shadow first (selector.AnnotationShadow), every node running it confirms
// through its node status, and only then does the service-proxy-name label move.
//
// The node status is a ConfigMap per node ("shardproxy-node-<node>") that each
// supervisor keeps current: its instances, the proxy names they serve, and the Services
// each has programmed in shadow. `shardproxy migrate` reads them to know which nodes run
// the target and whether they are ready.
//
// Readers trust a status only as far as the API server vouches for it. The node is the
// one the ConfigMap's name names (deploy/base/node-status-policy.yaml lets a node's
// supervisor write only its own), never the JSON's claim; and a node is live when the API
// server last stored its status less than StaleAfter ago by the API server's own clock
// (the ConfigMap's managedFields time against the server's Date header), so neither the
// node's clock nor the reader's decides.
package migrate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/shardproxy/shardproxy/selector"
)

// Labels and keys of the node status ConfigMaps.
const (
	// LabelComponent marks node status ConfigMaps, for listing them.
	LabelComponent = "shardproxy.io/component"
	// ComponentNodeStatus is LabelComponent's value on node status ConfigMaps.
	ComponentNodeStatus = "node-status"
	// StatusKey is the data key holding the JSON NodeStatus.
	StatusKey = "status.json"
	// DefaultNamespace holds the node status ConfigMaps unless configured otherwise.
	DefaultNamespace = "shardproxy-system"
	// HeartbeatInterval is how often an unchanged status is rewritten, so readers can
	// tell a live node from a gone one.
	HeartbeatInterval = 30 * time.Second
)

// NodeStatus is what one node's supervisor reports.
type NodeStatus struct {
	// Node is the Node object's name.
	Node string `json:"node"`
	// Heartbeat is when the supervisor last wrote the status, by the node's clock. It is
	// for people; readers judge liveness by the API server's time of the write. Every
	// write changes it, so every write moves that time.
	Heartbeat time.Time `json:"heartbeat"`
	// Instances are the node's proxy instances by name.
	Instances map[string]InstanceStatus `json:"instances"`
	// Holdings are the holders of the addresses more than one Service claims here
	// (selector.Dispatcher.Holdings), at most MaxHoldings: a node that starts later reads
	// them (SeedHoldings) to rank the claims it sees all at once as the running nodes do.
	Holdings []selector.Holding `json:"holdings,omitempty"`
}

// MaxHoldings bounds the holdings one node status carries (~100 bytes each), so that
// contested addresses cannot grow it toward the ConfigMap size limit.
const MaxHoldings = 1000

// SeedSample is how many node statuses a starting supervisor reads for SeedHoldings:
// one page, not every node's (at 5,000 nodes, a rollout reading them all would be 25
// million objects).
const SeedSample = 25

// SeedHoldings returns, from node statuses, the holder of each contested address as
// most of them report it (a tie goes to the smaller UID, so every reader picks the same).
func SeedHoldings(statuses []NodeStatus) []selector.Holding {
	type key struct {
		addr  string
		proto corev1.Protocol
		port  int32
	}
	votes := map[key]map[types.UID]int{}
	first := map[key]selector.Holding{}
	for _, st := range statuses {
		for _, h := range st.Holdings {
			k := key{h.Addr.String(), h.Protocol, h.Port}
			if votes[k] == nil {
				votes[k] = map[types.UID]int{}
				first[k] = h
			}
			votes[k][h.UID]++
		}
	}
	out := make([]selector.Holding, 0, len(votes))
	for k, v := range votes {
		h := first[k]
		h.UID = ""
		for uid, n := range v {
			if h.UID == "" || n > v[h.UID] || n == v[h.UID] && uid < h.UID {
				h.UID = uid
			}
		}
		out = append(out, h)
	}
	slices.SortFunc(out, selector.Holding.Compare)
	return out
}

// InstanceStatus is one instance in a NodeStatus.
type InstanceStatus struct {
	// Default is true for the instance serving unlabeled Services.
	Default bool `json:"default,omitempty"`
	// ProxyNames are the label values it serves.
	ProxyNames []string `json:"proxyNames,omitempty"`
	// Shadow lists "namespace/name" of the Services it has programmed in shadow.
	Shadow []string `json:"shadow,omitempty"`
	// HandedBack lists the Services of Shadow that the proxy their label names has
	// programmed on this node: kube-proxy's rules for them are in the kernel (for a
	// Service of a proxy no local instance serves, or unlabeled without a local default
	// instance), or the local instance that owns them has programmed them. A rollback
	// removes the shadow only once every node lists the Service here.
	HandedBack []string `json:"handedBack,omitempty"`
	// Failing says, in a line (FailingReason), why the instance is not healthy on the
	// node; empty when it is. It is worded to stay the same while the fault does, so a
	// failing instance does not make its node rewrite the status.
	Failing string `json:"failing,omitempty"`
	// LastSync is when the instance last synced successfully (PublishedSync): exact
	// while it is failing (it does not move then), else coarse, so that syncing does
	// not make the node rewrite its status more than once per SyncResolution. Absent
	// before the first sync, and from supervisors older than the field.
	LastSync time.Time `json:"lastSync,omitzero"`
}

// Migrating reports whether a migration involves the node: an instance holds Services in
// shadow (a move or a rollback under way, or one that failed and left its annotations).
// Only then do readers need the node's heartbeat: a move or rollback that starts finds
// the node's status stale and waits for the write the shadow brings (Mover), so in
// steady state a node writes its status only when it changes.
func (s NodeStatus) Migrating() bool {
	for _, inst := range s.Instances {
		if len(inst.Shadow) > 0 || len(inst.HandedBack) > 0 {
			return true
		}
	}
	return false
}

// ServesProxyName returns the name of the instance serving proxyName, if any.
func (s NodeStatus) ServesProxyName(proxyName string) (string, bool) {
	for name, inst := range s.Instances {
		if slices.Contains(inst.ProxyNames, proxyName) {
			return name, true
		}
	}
	return "", false
}

// ConfigMapPrefix starts every node status ConfigMap's name; the node's name follows.
const ConfigMapPrefix = "shardproxy-node-"

// ConfigMapName is the name of a node's status ConfigMap.
func ConfigMapName(node string) string { return ConfigMapPrefix + node }

// sameContent compares two statuses ignoring the heartbeat.
func sameContent(a, b NodeStatus) bool {
	a.Heartbeat, b.Heartbeat = time.Time{}, time.Time{}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// Publisher keeps one node's status ConfigMap current.
type Publisher struct {
	Client    kubernetes.Interface
	Namespace string
	Node      string
	// Source returns the current status (Node and Heartbeat are filled in).
	Source func() NodeStatus
	// Interval is how often Source is polled; default 500ms.
	Interval time.Duration
	// Backoff spaces the retries of a failed write; default PublishBackoff(Interval). A
	// successful write starts it over.
	Backoff *wait.Backoff
	// Clock is the clock; default the real one.
	Clock clock.Clock
	// Heartbeat says whether an unchanged status must still be rewritten every
	// HeartbeatInterval, so that readers see the node live; nil: always. A changed status
	// is written whatever it says.
	Heartbeat func(NodeStatus) bool

	// written is the ConfigMap as the last successful write returned it (Run's goroutine
	// only).
	written *corev1.ConfigMap
}

// PublishBackoff spaces a node's retries of a failed status write: from first, doubling,
// with jitter so that the nodes of a cluster do not retry in step when the API server
// comes back, up to 10 s (a node keeps retrying well within a reader's StaleAfter).
func PublishBackoff(first time.Duration) wait.Backoff {
	return wait.Backoff{Duration: first, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 10 * time.Second}
}

// Run publishes until ctx ends: at once, on every change, and every HeartbeatInterval
// while Heartbeat says so.
// Failures are logged and retried with an exponential backoff; they never stop the
// supervisor.
func (p *Publisher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("node-status")
	p.defaults()
	var last NodeStatus
	var lastWrite time.Time
	published := false
	backoff := p.newBackoff()
	for {
		delay := p.Interval
		cur := p.Source()
		cur.Node = p.Node
		heartbeat := p.Clock.Since(lastWrite) >= HeartbeatInterval && (p.Heartbeat == nil || p.Heartbeat(cur))
		if !published || !sameContent(cur, last) || heartbeat {
			cur.Heartbeat = p.Clock.Now().UTC().Truncate(time.Millisecond)
			if err := p.write(ctx, cur); err != nil {
				delay = backoff.Step()
				logger.Error(err, "Writing the node status failed; will retry", "namespace", p.Namespace,
					"name", ConfigMapName(p.Node), "retryIn", delay)
			} else {
				last, lastWrite, published = cur, p.Clock.Now(), true
				backoff = p.newBackoff()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.Clock.After(delay):
		}
	}
}

func (p *Publisher) defaults() {
	if p.Interval == 0 {
		p.Interval = 500 * time.Millisecond
	}
	if p.Clock == nil {
		p.Clock = clock.RealClock{}
	}
}

// newBackoff returns a fresh copy of the retry backoff (wait.Backoff counts in place).
func (p *Publisher) newBackoff() wait.Backoff {
	if p.Backoff != nil {
		return *p.Backoff
	}
	return PublishBackoff(p.Interval)
}

// write stores st in this node's ConfigMap. It updates the object its last write
// returned (one request, the usual case); only when that is unknown, or the API server
// says it is out of date (Conflict) or gone, does it read the ConfigMap first, as an
// update needs its resourceVersion.
func (p *Publisher) write(ctx context.Context, st NodeStatus) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	cms := p.Client.CoreV1().ConfigMaps(p.Namespace)
	if p.written != nil {
		cm, err := cms.Update(ctx, withStatus(p.written.DeepCopy(), data), metav1.UpdateOptions{})
		if err == nil {
			p.written = cm
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
		p.written = nil
	}
	cm, err := cms.Get(ctx, ConfigMapName(p.Node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm, err = cms.Create(ctx, withStatus(&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName(p.Node), Namespace: p.Namespace}}, data), metav1.CreateOptions{})
	} else if err == nil {
		cm, err = cms.Update(ctx, withStatus(cm, data), metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	p.written = cm
	return nil
}

// withStatus sets a status ConfigMap's content and label.
func withStatus(cm *corev1.ConfigMap, data []byte) *corev1.ConfigMap {
	cm.Data = map[string]string{StatusKey: string(data)}
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels[LabelComponent] = ComponentNodeStatus
	return cm
}

// ReadStatuses lists every node status in namespace.
func ReadStatuses(ctx context.Context, client kubernetes.Interface, namespace string) ([]NodeStatus, error) {
	return readStatuses(ctx, client, namespace, 0)
}

// ReadStatusSample reads one page of at most limit node statuses in namespace.
func ReadStatusSample(ctx context.Context, client kubernetes.Interface, namespace string, limit int64) ([]NodeStatus, error) {
	return readStatuses(ctx, client, namespace, limit)
}

func readStatuses(ctx context.Context, client kubernetes.Interface, namespace string, limit int64) ([]NodeStatus, error) {
	published, err := readPublishedPage(ctx, client, namespace, limit)
	if err != nil {
		return nil, err
	}
	out := make([]NodeStatus, 0, len(published))
	for _, p := range published {
		out = append(out, p.NodeStatus)
	}
	return out, nil
}

// publishedStatus is a node status with the resourceVersion of its ConfigMap, which
// changes whenever the supervisor writes it, and when the API server stored the status,
// by the server's clock (zero if the server recorded no time).
type publishedStatus struct {
	NodeStatus
	version string
	written time.Time
}

// readPublished lists the node statuses in namespace. Node is taken from each
// ConfigMap's name, which the admission policy ties to the writer; a labeled ConfigMap
// whose name is not a node status's is skipped.
func readPublished(ctx context.Context, client kubernetes.Interface, namespace string) ([]publishedStatus, error) {
	return readPublishedPage(ctx, client, namespace, 0)
}

// readPublishedPage is readPublished of the first page of limit statuses (0: all).
func readPublishedPage(ctx context.Context, client kubernetes.Interface, namespace string, limit int64) ([]publishedStatus, error) {
	list, err := client.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: LabelComponent + "=" + ComponentNodeStatus, Limit: limit})
	if err != nil {
		return nil, fmt.Errorf("listing node statuses in %s: %w", namespace, err)
	}
	var out []publishedStatus
	for _, cm := range list.Items {
		node, ok := strings.CutPrefix(cm.Name, ConfigMapPrefix)
		if !ok || node == "" {
			continue
		}
		var st NodeStatus
		if err := json.Unmarshal([]byte(cm.Data[StatusKey]), &st); err != nil {
			return nil, fmt.Errorf("node status %s/%s: %w", cm.Namespace, cm.Name, err)
		}
		st.Node = node
		out = append(out, publishedStatus{NodeStatus: st, version: cm.ResourceVersion, written: statusWritten(&cm)})
	}
	return out, nil
}

// statusWritten is when the API server last stored a change of the status key: the
// time of the managedFields entry that owns data[StatusKey]. The server sets it on every
// write that changes the value, by its own clock; zero when no entry owns the key.
func statusWritten(cm *corev1.ConfigMap) time.Time {
	var latest time.Time
	for _, mf := range cm.ManagedFields {
		if mf.Time == nil || mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]map[string]json.RawMessage
		if err := json.Unmarshal(mf.FieldsV1.Raw, &fields); err != nil {
			continue
		}
		if _, owns := fields["f:data"]["f:"+StatusKey]; owns && mf.Time.After(latest) {
			latest = mf.Time.Time
		}
	}
	return latest
}

// ServerClock tells the API server's current time, the clock node statuses' write times
// are on.
type ServerClock interface {
	ServerNow(ctx context.Context) (time.Time, error)
}

// LocalClock is a ServerClock for an API server on this machine's clock: a fake
// clientset, whose managedFields times are this process's time.Now.
type LocalClock func() time.Time

// ServerNow returns the local time.
func (c LocalClock) ServerNow(context.Context) (time.Time, error) { return c(), nil }

// APIServerClock reads the API server's time from the Date header of GET /version,
// which every authenticated user may read. The header has one-second resolution, as do
// the managedFields times it is compared with.
type APIServerClock struct {
	Client *http.Client
	// URL is the API server's /version URL.
	URL string
}

var _ ServerClock = &APIServerClock{}

// NewAPIServerClock returns the clock of the API server cfg talks to, with cfg's
// credentials and TLS settings.
func NewAPIServerClock(cfg *rest.Config) (*APIServerClock, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building an HTTP client for the API server's clock: %w", err)
	}
	u, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the API server's URL: %w", err)
	}
	u.Path = path.Join(u.Path, "/version")
	return &APIServerClock{Client: client, URL: u.String()}, nil
}

// ServerNow asks the API server for its time.
func (c *APIServerClock) ServerNow(ctx context.Context) (time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return time.Time{}, err
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return time.Time{}, fmt.Errorf("asking the API server for its time: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("asking the API server for its time: GET %s: %s", c.URL, resp.Status)
	}
	t, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return time.Time{}, fmt.Errorf("asking the API server for its time: Date header %q: %w", resp.Header.Get("Date"), err)
	}
	return t, nil
}
