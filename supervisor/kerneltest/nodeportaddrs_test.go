package kerneltest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	vnetns "github.com/vishvananda/netns"

	"github.com/shardproxy/shardproxy/supervisor"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// addrChangeBound is how long an address added to (removed from) the node may take to
// serve (stop serving) NodePorts: one netlink event, one interface listing, one full
// sync of a one-Service instance (~0.1 s here alone), generous for a loaded 2-core
// machine. The periodic re-read is set to an hour, so only the netlink subscription can
// meet it.
const addrChangeBound = 10 * time.Second

// TestNodePortFollowsNewInterfaceAddress: instance alpha serves NodePorts on
// nodePortAddresses [10.77.0.0/24], which no node address is in at start. An address
// 10.77.0.5 added to the node's uplink afterwards (a keepalived VIP, a DHCP renumbering)
// answers the NodePort from the client within addrChangeBound, through the supervisor's
// netlink subscription to the node namespace's address changes (NetlinkAddrEvents), and
// stops answering once it is removed; instance beta (nodePortAddresses primary), which
// the change does not concern, has no full sync meanwhile. Before, CIDR
// nodePortAddresses were resolved at start and on Node changes only: the NodePort never
// answered on the new address until a restart.
func TestNodePortFollowsNewInterfaceAddress(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft")
	tp := netns.New(t)
	ns := tp.Node
	nftInNode(t, ns)
	tp.StartServer(tp.Pod1, "pod1", "tcp", 8080)
	const vip, nodePort = "10.77.0.5", 30080

	metrics := freePort(t)
	yaml := fmt.Sprintf("apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\nnodeName: node-1\n"+
		"healthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\nserviceCIDRDrop: false\nstatusNamespace: \"-\"\ninstances:\n"+
		"- name: alpha\n  proxyNames: [alpha]\n  slot: 0\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n  nodePortAddresses: [10.77.0.0/24]\n  tenant:\n    namespaces: [alpha]\n"+
		"- name: beta\n  proxyNames: [beta]\n  slot: 1\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n  tenant:\n    namespaces: [beta]\n",
		freePort(t), metrics)
	client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: netns.NodeIPv4}}}})
	createNodePort(t, client, "alpha", "web", "10.96.0.10", nodePort, netns.Pod1IPv4)
	createNodePort(t, client, "beta", "web", "10.96.0.20", nodePort+1, netns.Pod1IPv4)

	handle, err := vnetns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { handle.Close() })
	deps := nodeDeps(tp, ns, client, logr.Logger(funcr.New(func(prefix, args string) { t.Log(prefix, args) }, funcr.Options{})))
	deps.InterfaceAddrs = func() (out []netip.Addr, err error) {
		if doErr := tp.Do(ns, func() error { out, err = interfaceAddrs(); return nil }); doErr != nil {
			return nil, doErr
		}
		return out, err
	}
	deps.AddrEvents = supervisor.NetlinkAddrEvents(handle)
	deps.AddrResync = time.Hour
	deps.HealthCheckListener = nsListener{tp: tp, ns: ns}
	runSupervisor(t, decodeConfig(t, yaml, "test.yaml"), deps)

	answers := func(addr string, port int) bool {
		r, err := tp.DialWith(tp.Client, "tcp", addr, port, netns.DialOptions{Timeout: 500 * time.Millisecond})
		return err == nil && r.Server == "pod1"
	}
	testutil.Eventually(t, time.Minute, "beta's NodePort on the node's primary IP", func() bool { return answers(netns.NodeIPv4, nodePort+1) })
	testutil.Eventually(t, time.Minute, "alpha's Service programmed", func() bool {
		out, err := tp.Exec(ns, "nft", "list", "table", "ip", "shardproxy-alpha")
		return err == nil && strings.Contains(out, "10.96.0.10")
	})
	if answers(vip, nodePort) {
		t.Fatalf("alpha's NodePort answers on %s before the node has it", vip)
	}
	betaFull := fullSyncs(t, metrics, "beta")

	if _, err := tp.Exec(ns, "ip", "addr", "add", vip+"/32", "dev", netns.NodeClientInterface); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, addrChangeBound, "alpha's NodePort on the added "+vip, func() bool { return answers(vip, nodePort) })
	added := time.Since(start)

	if _, err := tp.Exec(ns, "ip", "addr", "del", vip+"/32", "dev", netns.NodeClientInterface); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	testutil.Eventually(t, addrChangeBound, vip+" gone from alpha's table", func() bool {
		out, err := tp.Exec(ns, "nft", "list", "table", "ip", "shardproxy-alpha")
		return err == nil && !strings.Contains(out, vip)
	})
	removed := time.Since(start)
	// The rule gone, a packet to the address is no longer DNATed to the pod (the node
	// would forward it so, address or not): the NodePort stops answering.
	if answers(vip, nodePort) {
		t.Errorf("alpha's NodePort still answers on %s after its removal", vip)
	}
	if !answers(netns.NodeIPv4, nodePort+1) {
		t.Errorf("beta's NodePort stopped answering")
	}
	if after := fullSyncs(t, metrics, "beta"); after != betaFull {
		t.Errorf("beta had %d full syncs while the address came and went (it does not serve NodePorts on it)", after-betaFull)
	}
	fmt.Printf("kernel: an address added in alpha's nodePortAddresses served its NodePort after %v and was unprogrammed %v after its removal (netlink events; periodic re-read 1h); beta: no full sync meanwhile\n",
		added.Round(time.Millisecond), removed.Round(time.Millisecond))
}

// createNodePort creates a NodePort Service of proxy ns (port 80 → 8080, node port
// nodePort) with one ready endpoint on node-1.
func createNodePort(t *testing.T, client kubernetes.Interface, ns, name, ip string, nodePort int32, endpoint string) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{"service.kubernetes.io/service-proxy-name": ns}},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Type: corev1.ServiceTypeNodePort,
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
				NodePort: nodePort}}}}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{endpoint}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-1")}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	ctx := context.Background()
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// fullSyncs sums an instance's full syncs (both families) from the metrics server.
func fullSyncs(t *testing.T, port int, inst string) int {
	t.Helper()
	body := scrapeMetrics(t, port)
	n, seen := 0, false
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "kubeproxy_sync_full_proxy_rules_duration_seconds_count{") ||
			!strings.Contains(line, `proxy_instance="`+inst+`"`) {
			continue
		}
		seen = true
		fields := strings.Fields(line)
		v, err := strconv.Atoi(fields[len(fields)-1])
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		n += v
	}
	if !seen {
		t.Fatalf("the metrics show no full sync count of %s", inst)
	}
	return n
}

// interfaceAddrs lists the calling thread's namespace's interface addresses.
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// nsListener opens the health-check node ports inside the node namespace.
type nsListener struct {
	tp *netns.Topology
	ns string
}

func (l nsListener) Listen(addr netip.Addr, port int) (ln net.Listener, err error) {
	if doErr := l.tp.Do(l.ns, func() error {
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
		return nil
	}); doErr != nil {
		return nil, doErr
	}
	return ln, err
}
