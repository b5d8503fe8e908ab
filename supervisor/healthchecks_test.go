package supervisor

import (
	"context"
	"net"
	"net/netip"
	"slices"
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
// node port addresses (primary: the Node's InternalIPs) of the Service's families only.
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
		t.Errorf("opened %v, want %v: the Node's InternalIPs of each Service's families only", got, want)
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
