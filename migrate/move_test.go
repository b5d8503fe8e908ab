package migrate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

const statusNS = "shardproxy-system"

// cluster is a fake apiserver whose ConfigMaps get a new resourceVersion on every
// write, as a real one does, and which records when each Service patch happened.
type cluster struct {
	client *fake.Clientset

	mu      sync.Mutex
	rv      int
	patches []patchRecord
}

type patchRecord struct {
	at   time.Time
	name string
	body string
}

func newCluster(t *testing.T, svcs ...*corev1.Service) *cluster {
	t.Helper()
	var objs []runtime.Object
	for _, s := range svcs {
		objs = append(objs, s)
	}
	// NewClientset, not NewSimpleClientset: it records managedFields, with their times,
	// as an API server does; liveness is judged on them.
	c := &cluster{client: fake.NewClientset(objs...)}
	bump := func(action k8stesting.Action) (bool, runtime.Object, error) {
		var obj runtime.Object
		switch a := action.(type) {
		case k8stesting.CreateAction:
			obj = a.GetObject()
		case k8stesting.UpdateAction:
			obj = a.GetObject()
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			c.mu.Lock()
			c.rv++
			cm.ResourceVersion = fmt.Sprint(c.rv)
			c.mu.Unlock()
		}
		return false, nil, nil
	}
	c.client.PrependReactor("create", "configmaps", bump)
	c.client.PrependReactor("update", "configmaps", bump)
	c.client.PrependReactor("patch", "services", func(action k8stesting.Action) (bool, runtime.Object, error) {
		p := action.(k8stesting.PatchAction)
		c.mu.Lock()
		c.patches = append(c.patches, patchRecord{at: time.Now(), name: p.GetNamespace() + "/" + p.GetName(), body: string(p.GetPatch())})
		c.mu.Unlock()
		return false, nil, nil
	})
	return c
}

func (c *cluster) patchLog() []patchRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]patchRecord(nil), c.patches...)
}

// node is one node's supervisor as far as migrate sees it: an instance team-a serving
// proxy name team-a, programming (at once) every Service the router gives it as a shadow,
// and a Publisher reporting it. It records when its status first listed each shadow.
type node struct {
	name    string
	mu      sync.Mutex
	listed  map[string]time.Time
	confirm func(svc string) bool // nil: confirm every shadow
	// legacy says whether the node's kube-proxy has programmed an unlabeled Service (nil:
	// at once); handedBack records when the status first listed each as handed back.
	legacy     func(svc string) bool
	handedBack map[string]time.Time
	// heartbeat is the Publisher's Heartbeat (nil: always, the Publisher's default).
	heartbeat func(NodeStatus) bool
	// specs are the node's instances (nil: team-a alone, serving proxy name team-a).
	specs []selector.Spec
}

func startNode(t *testing.T, c *cluster, n *node) {
	t.Helper()
	if n.specs == nil {
		n.specs = []selector.Spec{{Name: "team-a", ProxyNames: []string{"team-a"}}}
	}
	router, err := selector.NewRouter(n.specs)
	if err != nil {
		t.Fatal(err)
	}
	n.listed, n.handedBack = map[string]time.Time{}, map[string]time.Time{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	pub := &Publisher{Client: c.client, Namespace: statusNS, Node: n.name, Interval: 5 * time.Millisecond, Heartbeat: n.heartbeat,
		Source: func() NodeStatus {
			st := NodeStatus{Instances: map[string]InstanceStatus{}}
			list, err := c.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			for _, spec := range n.specs {
				is := InstanceStatus{Default: spec.Default, ProxyNames: spec.ProxyNames}
				for _, s := range list.Items {
					name := s.Namespace + "/" + s.Name
					if err == nil && router.Route(&s).Shadow == spec.Name && (n.confirm == nil || n.confirm(name)) {
						is.Shadow = append(is.Shadow, name)
						if _, labeled := s.Labels[selector.LabelServiceProxyName]; !labeled && (n.legacy == nil || n.legacy(name)) {
							is.HandedBack = append(is.HandedBack, name)
						}
					}
				}
				n.record(is)
				st.Instances[spec.Name] = is
			}
			return st
		}}
	go func() { defer close(done); pub.Run(ctx) }()
}

// record notes when is first listed each of its shadows and hand-backs.
func (n *node) record(is InstanceStatus) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range is.Shadow {
		if _, ok := n.listed[s]; !ok {
			n.listed[s] = time.Now()
		}
	}
	for _, s := range is.HandedBack {
		if _, ok := n.handedBack[s]; !ok {
			n.handedBack[s] = time.Now()
		}
	}
}

func (n *node) firstHandedBack(svc string) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	at, ok := n.handedBack[svc]
	return at, ok
}

func (n *node) firstListed(svc string) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	at, ok := n.listed[svc]
	return at, ok
}

func svc(ns, name, proxyName string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if proxyName != "" {
		s.Labels = map[string]string{selector.LabelServiceProxyName: proxyName}
	}
	return s
}

// labelPatch: the patch moves the proxy-name label (the shadow's label moves with its
// annotation in every patch).
func labelPatch(p patchRecord) bool {
	return strings.Contains(p.body, `"service.kubernetes.io/service-proxy-name"`)
}

func waitStatus(t *testing.T, c *cluster, nodes int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st, err := ReadStatuses(context.Background(), c.client, statusNS); err == nil && len(st) == nodes {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no status from %d node(s)", nodes)
}

// TestRollbackStepsBackBeforeHandingBack: the owner becomes a shadow (annotation naming
// its own proxy) and every node confirms it before the label goes, so a legacy proxy
// finds the health-check node port free; the shadow stays for the grace, then goes.
func TestRollbackStepsBackBeforeHandingBack(t *testing.T) {
	c := newCluster(t, svc("shop", "cart", "team-a"), svc("shop", "web", "team-a"))
	nodes := []*node{{name: "node-1"}, {name: "node-2"}}
	for _, n := range nodes {
		startNode(t, c, n)
	}
	waitStatus(t, c, 2)
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond,
		Timeout: 5 * time.Second, LegacyTimeout: 5 * time.Second}
	rep, err := m.Rollback(context.Background(), Selection{Namespace: "shop"}, "team-a", "")
	if err != nil || rep.Moved != 2 || rep.Batches != 1 {
		t.Fatalf("rollback: %+v %v\n%s", rep, err, out.String())
	}
	t.Logf("rollback:\n%s", out.String())
	if !strings.Contains(out.String(), "team-a stepped back to a shadow on 2 node(s) (node-1, node-2)") {
		t.Errorf("the output does not report the nodes' confirmation:\n%s", out.String())
	}
	for _, name := range []string{"shop/cart", "shop/web"} {
		var label, last *patchRecord
		for _, p := range c.patchLog() {
			if p.name != name {
				continue
			}
			if label == nil && labelPatch(p) {
				label = &p
			}
			last = &p
		}
		if label == nil {
			t.Fatalf("%s: the label was never patched", name)
		}
		for _, n := range nodes {
			at, ok := n.firstListed(name)
			if !ok || !at.Before(label.at) {
				t.Errorf("%s: the label moved before %s reported the shadow (listed %v at %v, label at %v)", name, n.name, ok, at, label.at)
			}
		}
		if !strings.Contains(label.body, `"shardproxy.io/shadow":"team-a"`) || !strings.Contains(label.body, `"service.kubernetes.io/service-proxy-name":null`) {
			t.Errorf("%s: the hand-back patch %s must remove the label and keep the shadow", name, label.body)
		}
		if !strings.Contains(last.body, `"shardproxy.io/shadow":null`) || labelPatch(*last) {
			t.Errorf("%s: the last patch %s must only drop the shadow", name, last.body)
		}
		got, err := c.client.CoreV1().Services("shop").Get(context.Background(), strings.TrimPrefix(name, "shop/"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, labeled := got.Labels[selector.LabelServiceProxyName]; labeled || got.Annotations[selector.AnnotationShadow] != "" {
			t.Errorf("%s after the rollback: labels %v annotations %v", name, got.Labels, got.Annotations)
		}
	}
}

// TestMoveWithinOneInstance: moving Services between two proxy names that one instance
// serves changes nothing on a node running it (the router gives an instance no shadow of
// a Service it owns, so there is nothing for it to report), and the move must not wait
// for a confirmation that never comes; a node where the two names are two instances
// still confirms the shadow before the label moves. The same holds for a rollback
// handing Services back to another name of the instance that served them, and for a
// move of unlabeled Services to a node's default instance; such a rollback does not make
// the owner step back (it would release the Services' health-check node ports for
// nothing).
func TestMoveWithinOneInstance(t *testing.T) {
	shared := []selector.Spec{{Name: "team-a", Default: true, ProxyNames: []string{"team-a", "team-a-canary"}}}
	split := []selector.Spec{
		{Name: "team-a", ProxyNames: []string{"team-a"}},
		{Name: "canary", ProxyNames: []string{"team-a-canary"}},
	}
	for _, tc := range []struct {
		name     string
		label    string // the Services' label before
		rollback bool   // Rollback from label to "team-a-canary"; else Move to it
		to       string
	}{
		{name: "move between names of one instance", label: "team-a", to: "team-a-canary"},
		{name: "move of unlabeled Services to the default instance", label: "", to: "team-a-canary"},
		{name: "rollback to another name of one instance", label: "team-a-canary", rollback: true, to: "team-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, svc("shop", "cart", tc.label), svc("shop", "web", tc.label))
			one, two := &node{name: "node-1", specs: shared}, &node{name: "node-2", specs: split}
			nodes := []*node{one}
			if !tc.rollback && tc.label != "" {
				nodes = append(nodes, two) // a rollback to another instance waits for its legacy timeout
			}
			for _, n := range nodes {
				startNode(t, c, n)
			}
			waitStatus(t, c, len(nodes))
			var out bytes.Buffer
			m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond,
				Timeout: 5 * time.Second, LegacyTimeout: 5 * time.Second}
			var rep Report
			var err error
			if tc.rollback {
				rep, err = m.Rollback(context.Background(), Selection{Namespace: "shop"}, tc.label, tc.to)
			} else {
				rep, err = m.Move(context.Background(), Selection{Namespace: "shop"}, tc.to)
			}
			if err != nil || rep.Moved != 2 {
				t.Fatalf("%+v %v\n%s", rep, err, out.String())
			}
			for _, name := range []string{"cart", "web"} {
				got, err := c.client.CoreV1().Services("shop").Get(context.Background(), name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if got.Labels[selector.LabelServiceProxyName] != tc.to || got.Labels[selector.LabelShadow] != "" || got.Annotations[selector.AnnotationShadow] != "" {
					t.Errorf("%s after it: labels %v annotations %v", name, got.Labels, got.Annotations)
				}
				if _, ok := one.firstListed("shop/" + name); ok {
					t.Errorf("%s: node-1's instance owns it under both names, yet listed it as a shadow (a rollback stepped back)", name)
				}
			}
			if len(nodes) == 2 {
				label := slices.IndexFunc(c.patchLog(), labelPatch)
				for _, name := range []string{"shop/cart", "shop/web"} {
					at, ok := two.firstListed(name)
					if !ok || label < 0 || !at.Before(c.patchLog()[label].at) {
						t.Errorf("%s: node-2 runs the two names as two instances, and must confirm the shadow before the label moves (listed %v at %v)", name, ok, at)
					}
				}
			}
		})
	}
}

// TestRollbackHandsBackWithoutConfirmation: a node that never reports the shadow (an
// older supervisor, a stuck one) delays the hand-back by Timeout, never blocks it: a
// rollback must always be able to give Services back. Nor does it confirm that the legacy
// proxy programmed them, so the shadow stays (it serves there until then; the legacy
// rules run first once they exist) and the rollback fails saying so.
func TestRollbackHandsBackWithoutConfirmation(t *testing.T) {
	c := newCluster(t, svc("shop", "cart", "team-a"))
	startNode(t, c, &node{name: "node-1", confirm: func(string) bool { return false }})
	waitStatus(t, c, 1)
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond,
		Timeout: 100 * time.Millisecond, LegacyTimeout: 100 * time.Millisecond}
	rep, err := m.Rollback(context.Background(), Selection{Namespace: "shop"}, "team-a", "")
	if err == nil || rep.Moved != 0 || !strings.Contains(err.Error(), "the batch keeps the shadow shardproxy.io/shadow=team-a") {
		t.Fatalf("rollback: %+v %v, want an error keeping the shadow\n%s", rep, err, out.String())
	}
	if !strings.Contains(out.String(), "warning: not programmed in shadow within 100ms: node-1: shop/cart; handing back anyway") {
		t.Errorf("no warning about the missing confirmation:\n%s", out.String())
	}
	got, err := c.client.CoreV1().Services("shop").Get(context.Background(), "cart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, labeled := got.Labels[selector.LabelServiceProxyName]; labeled || got.Annotations[selector.AnnotationShadow] != "team-a" {
		t.Errorf("after the rollback: labels %v annotations %v, want no label and the shadow", got.Labels, got.Annotations)
	}
}

// TestRollbackWaitsForLegacyProxy: the shadow goes only once every node reports that
// the legacy proxy programmed the Services (however long it takes, up to LegacyTimeout),
// not after a fixed grace: here node-2's kube-proxy is slow.
func TestRollbackWaitsForLegacyProxy(t *testing.T) {
	c := newCluster(t, svc("shop", "cart", "team-a"))
	var slow atomic.Bool
	slow.Store(true)
	var reads atomic.Int32
	c.client.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		reads.Add(1)
		return false, nil, nil
	})
	nodes := []*node{{name: "node-1"}, {name: "node-2", legacy: func(string) bool { return !slow.Load() }}}
	for _, n := range nodes {
		startNode(t, c, n)
	}
	waitStatus(t, c, 2)
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond,
		Timeout: 5 * time.Second, LegacyTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		_, err := m.Rollback(context.Background(), Selection{Namespace: "shop"}, "team-a", "")
		done <- err
	}()
	testutil.Eventually(t, 5*time.Second, "node-1 to report the Service handed back", func() bool {
		_, ok := nodes[0].firstHandedBack("shop/cart")
		return ok
	})
	// The rollback reads the statuses ten more times; node-2's kube-proxy has still not
	// programmed the Service, so the shadow stays.
	seen := reads.Load()
	testutil.Eventually(t, 5*time.Second, "ten more status reads", func() bool { return reads.Load() >= seen+10 })
	if got, _ := c.client.CoreV1().Services("shop").Get(context.Background(), "cart", metav1.GetOptions{}); got.Annotations[selector.AnnotationShadow] != "team-a" {
		t.Fatalf("the shadow went before node-2's legacy proxy programmed the Service: %v", got.Annotations)
	}
	slow.Store(false)
	if err := <-done; err != nil {
		t.Fatalf("rollback: %v\n%s", err, out.String())
	}
	at, ok := nodes[1].firstHandedBack("shop/cart")
	var last patchRecord
	for _, p := range c.patchLog() {
		last = p
	}
	if !ok || !at.Before(last.at) || !strings.Contains(last.body, `"shardproxy.io/shadow":null`) {
		t.Errorf("the shadow went at %v (%s), node-2 reported the hand-back at %v (%v)", last.at, last.body, at, ok)
	}
	if !strings.Contains(out.String(), "programmed by it on 2 node(s) (node-1, node-2)") {
		t.Errorf("the output does not report the nodes' confirmation:\n%s", out.String())
	}
}

// TestRollbackWithoutNodeStatuses: with no node status at all (statuses turned off),
// a rollback hands back at once, as before node statuses existed.
func TestRollbackWithoutNodeStatuses(t *testing.T) {
	c := newCluster(t, svc("shop", "cart", "team-a"))
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Timeout: time.Minute, LegacyTimeout: 5 * time.Second}
	start := time.Now()
	rep, err := m.Rollback(context.Background(), Selection{Namespace: "shop"}, "team-a", "")
	if err != nil || rep.Moved != 1 {
		t.Fatalf("rollback: %+v %v\n%s", rep, err, out.String())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the rollback waited %v for nodes that do not exist", d)
	}
	if !strings.Contains(out.String(), `no live node reports an instance serving "team-a"`) {
		t.Errorf("no warning:\n%s", out.String())
	}
}

// TestMoveIgnoresStaleShadow: a node status still listing a Service as a shadow from an
// earlier step (here written before the node's supervisor even started) does not confirm
// a new move; only a status written after the annotation does.
func TestMoveIgnoresStaleShadow(t *testing.T) {
	c := newCluster(t, svc("shop", "cart", ""))
	stale := NodeStatus{Node: "node-1", Heartbeat: time.Now().UTC(),
		Instances: map[string]InstanceStatus{"team-a": {ProxyNames: []string{"team-a"}, Shadow: []string{"shop/cart"}}}}
	pub := &Publisher{Client: c.client, Namespace: statusNS, Node: "node-1"}
	if err := pub.write(context.Background(), stale); err != nil {
		t.Fatal(err)
	}
	// The Mover reads the statuses once before it annotates the batch, then once per
	// poll, and moves the label right after the read that confirms: a second read after
	// the annotation means it judged the stale status and polled on rather than moving.
	var readsAfterAnnotation atomic.Int32
	c.client.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if len(c.patchLog()) > 0 {
			readsAfterAnnotation.Add(1)
		}
		return false, nil, nil
	})
	var out bytes.Buffer
	m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond, Timeout: 5 * time.Second}
	type result struct {
		rep Report
		err error
	}
	res := make(chan result, 1)
	go func() {
		rep, err := m.Move(context.Background(), Selection{Namespace: "shop"}, "team-a")
		res <- result{rep, err}
	}()
	// The node's supervisor starts only now: until then the stale status is all there is.
	// (A Move that finished on it is caught below: the label patch precedes any listing.)
	testutil.Eventually(t, 5*time.Second, "the Mover to poll the stale status twice after annotating", func() bool {
		return readsAfterAnnotation.Load() >= 2 || len(res) > 0
	})
	n := &node{name: "node-1"}
	startNode(t, c, n)
	r := <-res
	if r.err != nil || r.rep.Moved != 1 {
		t.Fatalf("move: %+v %v\n%s", r.rep, r.err, out.String())
	}
	listed, ok := n.firstListed("shop/cart")
	if !ok {
		t.Fatalf("the move finished before the node reported anything:\n%s", out.String())
	}
	for _, p := range c.patchLog() {
		if labelPatch(p) && p.at.Before(listed) {
			t.Errorf("the label moved at %v on a stale status; the node reported the shadow at %v", p.at, listed)
		}
	}
}

// TestLivenessIsJudgedOnServerTime: whether a node is live depends only on when the API
// server stored its status, by the server's clock: a node's clock hours off neither
// keeps a gone node alive nor makes a live one look gone, and neither does the CLI's.
func TestLivenessIsJudgedOnServerTime(t *testing.T) {
	for _, tc := range []struct {
		name string
		// nodeClock and cliClock are how far the node's and the CLI's clocks are off.
		nodeClock, cliClock time.Duration
		// sinceWrite is how long ago, by the server's clock, the status was stored.
		sinceWrite time.Duration
		wantLive   bool
	}{
		{name: "clocks agree, stored a minute ago", sinceWrite: time.Minute, wantLive: true},
		{name: "clocks agree, stored five minutes ago", sinceWrite: 5 * time.Minute},
		{name: "node clock three hours behind, stored just now", nodeClock: -3 * time.Hour, wantLive: true},
		{name: "node clock three hours ahead, gone for five minutes", nodeClock: 3 * time.Hour, sinceWrite: 5 * time.Minute},
		{name: "CLI clock an hour ahead, stored just now", cliClock: time.Hour, wantLive: true},
		{name: "CLI clock an hour behind, gone for five minutes", cliClock: -time.Hour, sinceWrite: 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			ctx := context.Background()
			nodeNow := func() time.Time { return time.Now().Add(tc.nodeClock) }
			pub := &Publisher{Client: c.client, Namespace: statusNS, Node: "node-1"}
			st := NodeStatus{Node: "node-1", Heartbeat: nodeNow().UTC(),
				Instances: map[string]InstanceStatus{"team-a": {ProxyNames: []string{"team-a"}}}}
			if err := pub.write(ctx, st); err != nil {
				t.Fatal(err)
			}
			// The fake API server stamps managedFields with time.Now: its clock is the
			// true time, and sinceWrite has passed on it since the write.
			server := LocalClock(func() time.Time { return time.Now().Add(tc.sinceWrite) })
			m := &Mover{Client: c.client, StatusNamespace: statusNS, Clock: server,
				Now: func() time.Time { return time.Now().Add(tc.cliClock) }}
			m.defaults()
			statuses, serverNow, err := m.readStatuses(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := len(m.liveNodes(statuses, "team-a", serverNow)) == 1
			if got != tc.wantLive {
				t.Errorf("live = %v, want %v (heartbeat %v, stored %v, server now %v, CLI now %v)",
					got, tc.wantLive, st.Heartbeat, statuses[0].written, serverNow, m.Now())
			}
		})
	}
}

// TestStatusNodeIsTheConfigMapsName: the node a status speaks for is the one its
// ConfigMap's name names (the admission policy ties that name to the writer), not the
// node the JSON claims; a labeled ConfigMap of another name is no status.
func TestStatusNodeIsTheConfigMapsName(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	forged := NodeStatus{Node: "node-2", Instances: map[string]InstanceStatus{"team-a": {ProxyNames: []string{"team-a"}}}}
	if err := (&Publisher{Client: c.client, Namespace: statusNS, Node: "node-1"}).write(ctx, forged); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.CoreV1().ConfigMaps(statusNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "not-a-status", Namespace: statusNS,
			Labels: map[string]string{LabelComponent: ComponentNodeStatus}},
		Data: map[string]string{StatusKey: string(data)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	statuses, err := ReadStatuses(ctx, c.client, statusNS)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, st := range statuses {
		nodes = append(nodes, st.Node)
	}
	if len(nodes) != 1 || nodes[0] != "node-1" {
		t.Errorf("statuses speak for %v, want [node-1]: the name of shardproxy-node-node-1, not its JSON's node-2", nodes)
	}
}

// TestAPIServerClock reads the server's time from the Date header of GET /version and
// reports a failed request rather than a zero time.
func TestAPIServerClock(t *testing.T) {
	serverTime := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		status  int
		date    string
		want    time.Time
		wantErr string
	}{
		{name: "Date header", status: http.StatusOK, date: serverTime.Format(http.TimeFormat), want: serverTime},
		{name: "refused", status: http.StatusForbidden, date: serverTime.Format(http.TimeFormat), wantErr: "403 Forbidden"},
		{name: "no usable Date header", status: http.StatusOK, date: "yesterday", wantErr: `Date header "yesterday"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/version" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("Date", tc.date)
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			clock, err := NewAPIServerClock(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			got, err := clock.ServerNow(context.Background())
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("ServerNow() = %v, %v; want an error with %q", got, err, tc.wantErr)
				}
			case err != nil || !got.Equal(tc.want):
				t.Errorf("ServerNow() = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// writeStaleStatus stores a status for each of nodes, running an instance for proxy
// name team-a, that the API server last wrote ago. (The fake clientset stamps
// managedFields itself, so the lists its readers make are rewritten.)
func writeStaleStatus(t *testing.T, c *cluster, ago time.Duration, nodes ...string) {
	t.Helper()
	st := NodeStatus{Instances: map[string]InstanceStatus{"team-a": {ProxyNames: []string{"team-a"}}}}
	stale := map[string]bool{}
	for _, node := range nodes {
		if err := (&Publisher{Client: c.client, Namespace: statusNS, Node: node}).write(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		stale[ConfigMapName(node)] = true
	}
	c.client.PrependReactor("list", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := c.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("configmaps"),
			corev1.SchemeGroupVersion.WithKind("ConfigMap"), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.ConfigMapList).DeepCopy()
		for i := range list.Items {
			if stale[list.Items[i].Name] {
				for j := range list.Items[i].ManagedFields {
					list.Items[i].ManagedFields[j].Time = &metav1.Time{Time: time.Now().Add(-ago)}
				}
			}
		}
		return true, list, nil
	})
}

func nodeObject(name string, ready corev1.ConditionStatus) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
}

// TestMoveWithSilentNodes: nodes a move cannot hear from are never skipped silently. A
// Ready node whose status names the target but went stale (its supervisor is down, or
// cannot write) blocks the batch: moving the label there would take the Service from the
// legacy proxy with nothing to replace it. A stale node that is NotReady or gone, and a
// Node that never published a status, are named in the output and not waited for.
func TestMoveWithSilentNodes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		nodes   []*corev1.Node
		stale   bool
		wantErr string
		wantOut string
	}{
		{name: "stale status of a Ready node blocks the move", stale: true,
			nodes:   []*corev1.Node{nodeObject("node-1", corev1.ConditionTrue), nodeObject("node-2", corev1.ConditionTrue)},
			wantErr: "node-2: no status for 10m0s, Node Ready"},
		{name: "stale status of a NotReady node is named", stale: true,
			nodes:   []*corev1.Node{nodeObject("node-1", corev1.ConditionTrue), nodeObject("node-2", corev1.ConditionFalse)},
			wantOut: "not waiting for node-2: no status for 10m0s, Node NotReady"},
		{name: "stale status of a deleted node is named", stale: true,
			nodes:   []*corev1.Node{nodeObject("node-1", corev1.ConditionTrue)},
			wantOut: "not waiting for node-2: no status for 10m0s, Node gone"},
		{name: "a Node without a status is named",
			nodes:   []*corev1.Node{nodeObject("node-1", corev1.ConditionTrue), nodeObject("node-3", corev1.ConditionTrue)},
			wantOut: "not waiting for 1 Node(s) without a shardproxy status in shardproxy-system (not running it, or it never started): node-3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, svc("shop", "cart", ""))
			ctx := context.Background()
			for _, n := range tc.nodes {
				if _, err := c.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.stale {
				writeStaleStatus(t, c, 10*time.Minute, "node-2")
			}
			startNode(t, c, &node{name: "node-1"})
			waitStatus(t, c, map[bool]int{true: 2, false: 1}[tc.stale])
			var out bytes.Buffer
			m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond, Timeout: 300 * time.Millisecond}
			rep, err := m.Move(ctx, Selection{Namespace: "shop"}, "team-a")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || rep.Moved != 0 {
					t.Fatalf("move: %+v %v, want an error naming %q\n%s", rep, err, tc.wantErr, out.String())
				}
				got, err := c.client.CoreV1().Services("shop").Get(ctx, "cart", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if len(got.Labels)+len(got.Annotations) != 0 {
					t.Errorf("a blocked move left labels %v annotations %v", got.Labels, got.Annotations)
				}
				return
			}
			if err != nil || rep.Moved != 1 {
				t.Fatalf("move: %+v %v\n%s", rep, err, out.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("output does not name the node (%q):\n%s", tc.wantOut, out.String())
			}
		})
	}
}

// TestMoveReadsSilentNodesTogether: the Nodes of stale statuses (a cluster at rest:
// statuses are written only on change) are read in one list before the first batch,
// whatever their number, and in at most nodeGetsAtMost GETs, else one list, each time a
// batch's wait reads the statuses: the mover's requests do not grow with the number of
// silent nodes. The silent nodes here are NotReady or gone, so none holds up the move.
func TestMoveReadsSilentNodesTogether(t *testing.T) {
	for _, silent := range []int{1, nodeGetsAtMost, nodeGetsAtMost + 2, 4 * nodeGetsAtMost} {
		t.Run(fmt.Sprintf("%d silent nodes", silent), func(t *testing.T) {
			c := newCluster(t, svc("shop", "cart", ""))
			ctx := context.Background()
			if _, err := c.client.CoreV1().Nodes().Create(ctx, nodeObject("node-1", corev1.ConditionTrue), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			var names []string
			for i := range silent {
				name := fmt.Sprintf("silent-%02d", i)
				names = append(names, name)
				if i%2 == 1 {
					continue // gone: no Node
				}
				if _, err := c.client.CoreV1().Nodes().Create(ctx, nodeObject(name, corev1.ConditionFalse), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			writeStaleStatus(t, c, 10*time.Minute, names...)
			// The mover's requests in order, from the move on: its Node requests, its
			// status lists (each a read of the statuses) and its Service patches.
			// node-1 lists no ConfigMap and reads no Node. (Reactors are added before
			// node-1 starts: the fake's reactor chain is not safe to change while in use.)
			var mu sync.Mutex
			var counting bool
			var requests []string
			c.client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.GetVerb() + " " + a.GetResource().Resource
				mu.Lock()
				defer mu.Unlock()
				if counting && (a.GetResource().Resource == "nodes" || r == "list configmaps" || r == "patch services") {
					requests = append(requests, r)
				}
				return false, nil, nil
			})
			startNode(t, c, &node{name: "node-1"})
			waitStatus(t, c, 1+silent)
			mu.Lock()
			counting = true
			mu.Unlock()
			var out bytes.Buffer
			m := &Mover{Client: c.client, StatusNamespace: statusNS, Out: &out, Poll: 5 * time.Millisecond, Timeout: 5 * time.Second}
			if rep, err := m.Move(ctx, Selection{Namespace: "shop"}, "team-a"); err != nil || rep.Moved != 1 {
				t.Fatalf("move: %+v %v\n%s", rep, err, out.String())
			}
			if got := strings.Count(out.String(), "not waiting for silent-"); got != silent {
				t.Errorf("named %d silent nodes, want %d:\n%s", got, silent, out.String())
			}
			mu.Lock()
			defer mu.Unlock()
			first := slices.Index(requests, "patch services")
			if first < 0 {
				t.Fatalf("no Service patch among the mover's requests %v", requests)
			}
			before := slices.DeleteFunc(slices.Clone(requests[:first]), func(r string) bool { return r == "list configmaps" })
			if !slices.Equal(before, []string{"list nodes"}) {
				t.Errorf("before the first batch the mover's Node requests were %v, want one list", before)
			}
			perRead := min(silent, nodeGetsAtMost)
			if silent > nodeGetsAtMost {
				perRead = 1
			}
			var reads, nodeRequests int
			for _, r := range requests[first:] {
				switch {
				case r == "list configmaps":
					reads++
				case strings.HasSuffix(r, " nodes"):
					nodeRequests++
				}
			}
			if nodeRequests > perRead*reads {
				t.Errorf("during the batch the mover made %d Node requests in %d reads of the statuses, want at most %d a read",
					nodeRequests, reads, perRead)
			}
		})
	}
}
