package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/tablestest"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestPublishedNodeAddresses runs the node address writer (two replicas electing a
// leader, as the Deployment's) and two supervisors with otherNodeAddresses: published
// against a real kube-apiserver: a Node added with address X is published, and both
// supervisors refuse a Service's externalIP X with an AddressRefused event (and program
// its other externalIP); the leader stopped, the standby takes the Lease and publishes
// the next Node added, whose address both refuse too; the list deleted, then edited by
// hand, writer-b writes it back and both nodes read it. The supervisors watch no Node but
// their own: without the published list they would serve both addresses.
func TestPublishedNodeAddresses(t *testing.T) {
	cp := controlplane.StartWith(t, controlplane.Options{ServiceCIDRs: gen.ServiceCIDRs})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := cp.Client()
	const nodes = 2
	if err := Prepare(ctx, admin, nodes, gen.Generate(1, 1), 2); err != nil {
		t.Fatal(err)
	}
	newClient := func(agent string) kubernetes.Interface {
		rc := cp.RESTConfig()
		rc.UserAgent = agent
		rc.Dial = newDialer()
		c, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// Two writers: a elects itself first, b stands by.
	startWriter := func(id string) context.CancelFunc {
		wctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		w := &nodeaddrs.Writer{Client: newClient(id), Namespace: StatusNamespace, Debounce: 200 * time.Millisecond,
			Logger: klog.Background().WithValues("writer", id)}
		go func() {
			done <- nodeaddrs.RunElected(wctx, w, nodeaddrs.Election{Identity: id,
				LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 250 * time.Millisecond})
		}()
		var once bool
		stopAndWait := func() {
			if once {
				return
			}
			once = true
			stop()
			if err := <-done; err != nil {
				t.Errorf("writer %s: %v", id, err)
			}
		}
		t.Cleanup(stopAndWait)
		return stopAndWait
	}
	leases := admin.CoordinationV1().Leases(StatusNamespace)
	holder := func() string {
		l, err := leases.Get(ctx, nodeaddrs.DefaultLeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	stopA := startWriter("writer-a")
	testutil.Eventually(t, time.Minute, "writer-a holds the Lease", func() bool { return holder() == "writer-a" })
	startWriter("writer-b")

	var fleet []*HollowNode
	for i := range nodes {
		h, err := StartHollow(ctx, HollowOptions{Name: NodeName(i), Addr: NodeAddr(i), Client: newClient(NodeName(i)),
			ReserveOtherNodeAddresses: true, OtherNodeAddresses: config.OtherNodeAddressesPublished, FullFake: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := h.Stop(); err != nil {
				t.Errorf("%s: %v", h.Name, err)
			}
		})
		fleet = append(fleet, h)
	}
	// Each supervisor reads the list of the Nodes there are.
	testutil.Eventually(t, time.Minute, "both nodes read the published list of 2 Nodes", func() bool {
		for _, h := range fleet {
			st := h.sup.Health().Status().NodeAddresses
			if st == nil || st.State != "ok" || st.Nodes != nodes {
				return false
			}
		}
		return true
	})

	// A Node joins with address x; a Service asks for x and a free address.
	const free = "203.0.113.10"
	addNode := func(name, addr string) {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const x, y = "10.200.0.1", "10.200.0.2"
	added := time.Now()
	addNode("joined-1", x)
	// The delay a new Node's address has before every node reserves it: the writer's
	// Node watch, its debounce (200 ms here, 1 s by default), one write, each node's
	// ConfigMap watch.
	testutil.Eventually(t, time.Minute, "both nodes reserve "+x, func() bool {
		for _, h := range fleet {
			if !slices.ContainsFunc(h.sup.OtherNodeIPs(), func(n selector.NodeIP) bool { return n.Addr.String() == x }) {
				return false
			}
		}
		return true
	})
	t.Logf("a new Node's address reserved on every node %v after its status was written (debounce 200 ms)", time.Since(added).Round(time.Millisecond))
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "takes-node-ips", Namespace: gen.Namespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			ExternalIPs: []string{x, free}}}
	created, err := admin.CoreV1().Services(gen.Namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refusedBy := func(addr, node string) func() bool {
		return func() bool {
			evs, err := admin.CoreV1().Events(gen.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
				"involvedObject.name": svc.Name, "reason": "AddressRefused"}.String()})
			if err != nil {
				return false
			}
			want := fmt.Sprintf("externalIP %s refused: it is an address of node %s", addr, node)
			hosts := map[string]bool{}
			for _, e := range evs.Items {
				if strings.Contains(e.Message, want) {
					hosts[e.Source.Host] = true
				}
			}
			return hosts[NodeName(0)] && hosts[NodeName(1)]
		}
	}
	testutil.Eventually(t, time.Minute, "both nodes refuse "+x+" (joined-1's) with an event", refusedBy(x, "joined-1"))
	for _, h := range fleet {
		testutil.Eventually(t, time.Minute, h.Name+" programs "+free, func() bool { return strings.Contains(dumpDefault(h), free+" . tcp . 80") })
		if d := dumpDefault(h); strings.Contains(d, x) {
			t.Errorf("%s programs the node address %s:\n%s", h.Name, x, d)
		}
	}

	// The leader stops: the standby takes over and publishes the next Node.
	stopA()
	testutil.Eventually(t, time.Minute, "writer-b holds the Lease", func() bool { return holder() == "writer-b" })
	addNode("joined-2", y)
	created, err = admin.CoreV1().Services(gen.Namespace).Get(ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Spec.ExternalIPs = append(created.Spec.ExternalIPs, y)
	if _, err := admin.CoreV1().Services(gen.Namespace).Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "both nodes refuse "+y+" (joined-2's, published by writer-b) with an event", refusedBy(y, "joined-2"))
	cm, err := admin.CoreV1().ConfigMaps(StatusNamespace).Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "joined-2 " + y + "\n"; !strings.Contains(cm.Data[nodeaddrs.DataKey], want) {
		t.Errorf("published list:\n%s\nwant a line %q", cm.Data[nodeaddrs.DataKey], want)
	}
	for _, h := range fleet {
		if d := dumpDefault(h); strings.Contains(d, y) || strings.Contains(d, x) {
			t.Errorf("%s programs a node address:\n%s", h.Name, d)
		}
	}

	// The list deleted, then edited by hand: writer-b writes it back, with no Node
	// changing, and both nodes read it again.
	cms := admin.CoreV1().ConfigMaps(StatusNamespace)
	want := cm.Data[nodeaddrs.DataKey]
	// restored waits until writer-b has written the list back and both nodes have read
	// that very object (its resourceVersion: the list's text was theirs already).
	restored := func(what string) {
		t.Helper()
		since := time.Now()
		var rv string
		testutil.Eventually(t, time.Minute, "writer-b to write the "+what+" list back", func() bool {
			cur, err := cms.Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
			if err == nil && cur.Data[nodeaddrs.DataKey] == want {
				rv = cur.ResourceVersion
				return true
			}
			return false
		})
		t.Logf("the %s list written back after %v", what, time.Since(since).Round(time.Millisecond))
		testutil.Eventually(t, time.Minute, "both nodes to read the "+what+" list written back", func() bool {
			for _, h := range fleet {
				st := h.sup.Health().Status().NodeAddresses
				if st == nil || st.State != "ok" || st.Nodes != nodes+2 || st.ResourceVersion != rv {
					return false
				}
			}
			return true
		})
	}
	if err := cms.Delete(ctx, nodeaddrs.DefaultName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	restored("deleted")
	edited, err := cms.Get(ctx, nodeaddrs.DefaultName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edited.Data[nodeaddrs.DataKey] = nodeaddrs.Encode(nil)
	if _, err := cms.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	restored("edited")
}

// dumpDefault is the node's default instance's IPv4 table (FullFake).
func dumpDefault(h *HollowNode) string {
	h.tables.mu.Lock()
	defer h.tables.mu.Unlock()
	fk := h.tables.fakes[tablestest.Key(tables.IPv4, config.DefaultTablePrefix+"-"+DefaultInstance)]
	if fk == nil {
		return ""
	}
	return fk.Dump()
}
