package supervisor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// addrRecorder is a healthcheck.Listener that serves on ephemeral loopback ports and
// records the addresses it was asked to open and, as their listeners close, to close.
type addrRecorder struct {
	mu     sync.Mutex
	opened []string
	closed []string
}

func (r *addrRecorder) Listen(addr netip.Addr, port int) (net.Listener, error) {
	at := netip.AddrPortFrom(addr, uint16(port)).String()
	r.mu.Lock()
	r.opened = append(r.opened, at)
	r.mu.Unlock()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &recordedListener{Listener: l, at: at, r: r}, nil
}

func (r *addrRecorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.opened)
}

func (r *addrRecorder) getClosed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.closed)
}

// recordedListener records its first Close in its addrRecorder.
type recordedListener struct {
	net.Listener
	at   string
	r    *addrRecorder
	once sync.Once
}

func (l *recordedListener) Close() error {
	l.once.Do(func() {
		l.r.mu.Lock()
		l.r.closed = append(l.r.closed, l.at)
		l.r.mu.Unlock()
	})
	return l.Listener.Close()
}

// TestHealthCheckNodePortOnPrimaryAddressOfServiceFamily: the supervisor opens a
// Local-policy LoadBalancer Service's health-check node port on the owning instance's
// node port addresses (primary: the Node's first InternalIP of each family) of the Service's
// families only.
func TestHealthCheckNodePortOnPrimaryAddressOfServiceFamily(t *testing.T) {
	rec := &addrRecorder{}
	f := startSupervisorWith(t, fixtureOptions{hcListener: rec})
	node, err := f.client.CoreV1().Nodes().Get(context.Background(), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = append(node.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "fd00:100::1"})
	if _, err := f.client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := localLoadBalancer()
	if _, err := f.client.CoreV1().Services("a").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dual := svc.DeepCopy()
	dual.Name, dual.Spec.HealthCheckNodePort, dual.Spec.Ports[0].NodePort = "dual", 30778, 30081
	dual.Spec.ClusterIPs = []string{"10.96.0.78", "fd00:96::78"}
	dual.Spec.ClusterIP = dual.Spec.ClusterIPs[0]
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	if _, err := f.client.CoreV1().Services("a").Create(context.Background(), dual, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"192.168.100.1:30777", "192.168.100.1:30778", "[fd00:100::1]:30778"}
	testutil.Eventually(t, waitTimeout, "the health checks to open", func() bool { return len(rec.get()) >= len(want) })
	got := rec.get()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("opened %v, want %v: the Node's primary IPs of each Service's families only", got, want)
	}
}

// localLoadBalancer is team-a's IPv4 LoadBalancer Service a/lb with
// externalTrafficPolicy Local: its health-check node port is 30777, its NodePort 30080.
func localLoadBalancer() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "lb", Labels: map[string]string{selector.LabelServiceProxyName: "team-a"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort: 30777, ClusterIP: "10.96.0.77", ClusterIPs: []string{"10.96.0.77"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, NodePort: 30080}}},
	}
}

// heldPorts is a healthcheck.Listener that refuses the ports in held, as if another
// process had them (a kube-proxy still running during a switch), and serves the others on
// ephemeral loopback ports.
type heldPorts struct{ held map[int]bool }

func (l heldPorts) Listen(_ netip.Addr, port int) (net.Listener, error) {
	if l.held[port] {
		return nil, fmt.Errorf("listen tcp :%d: bind: address already in use", port)
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// TestHealthCheckReadiness: which health-check node ports that cannot open fail the pod's
// readiness. A tenant's IPv6-only Local LoadBalancer Service on an instance with no IPv6
// node port address (the Node has no IPv6 InternalIP) is the tenant's configuration: it
// is reported (a Warning event on the Service, once) and listed in /status as unserved,
// and /readyz stays 200, or one tenant's Service would make every node's pod NotReady
// and stall the DaemonSet's rollouts. A port another process holds on this node is the
// operator's problem: /readyz fails, naming healthCheckNodePorts.
func TestHealthCheckReadiness(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{hcListener: heldPorts{held: map[int]bool{30779: true}}})
	ctx := context.Background()
	v6 := localLoadBalancer()
	v6.Name, v6.Spec.HealthCheckNodePort, v6.Spec.Ports[0].NodePort = "v6", 30778, 30081
	v6.Spec.ClusterIP, v6.Spec.ClusterIPs = "fd00:96::78", []string{"fd00:96::78"}
	v6.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
	if _, err := f.client.CoreV1().Services("a").Create(ctx, v6, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "/status to list a/v6's health check as unserved", func() bool {
		return strings.Contains(get(t, f.sup, "/status"), `"unserved":{"healthCheckNodePorts":"port 30778 (Service a/v6, instance team-a)"}`)
	})
	if code, body := probe(f.sup, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with a tenant's IPv6 Service on an IPv4-only instance: %d %s, want 200", code, body)
	}
	want := "a/v6 Warning FailedToStartServiceHealthcheck: failed to start health check on node port 30778 (instance \"team-a\"): " +
		"instance \"team-a\" has no node port address in the Service's IP families to listen on"
	if got := f.rec.all(); strings.Count(got, want) != 1 {
		t.Errorf("events %q, want one %q", got, want)
	}

	held := localLoadBalancer()
	held.Name, held.Spec.HealthCheckNodePort, held.Spec.Ports[0].NodePort = "held", 30779, 30082
	held.Spec.ClusterIP, held.Spec.ClusterIPs = "10.96.0.79", []string{"10.96.0.79"}
	if _, err := f.client.CoreV1().Services("a").Create(ctx, held, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "/readyz to fail for the port another process holds", func() bool {
		code, body := probe(f.sup, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"notListening":["healthCheckNodePorts"]`)
	})
	st := get(t, f.sup, "/status")
	if !strings.Contains(st, `"listenErrors":{"healthCheckNodePorts":"port 30779 (Service a/held, instance team-a)"}`) ||
		!strings.Contains(st, `"unserved":{"healthCheckNodePorts":"port 30778 (Service a/v6, instance team-a)"}`) {
		t.Errorf("/status %s, want 30779 among the listen errors and 30778 among the unserved", st)
	}
	if code, _ := probe(f.sup, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while a health-check node port is held: %d, want 200", code)
	}
}
