package kerneltest

import (
	"context"
	"fmt"
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

	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// neighbourBound is how long the neighbour instance's change may take to reach the
// kernel while the other instance refuses a Service too costly to program. Generous
// for a loaded 2-core machine (a change alone takes ~0.1 s); the Service refused here
// held the commit lock 27 s when it was programmed (103 s on a loaded machine).
// Where a change alone is slower (a kernel under software emulation, hack/kernels.sh's
// VM: ~20 to 30 times), the bound is neighbourFactor times the slowest of the
// neighbour's changes measured before the costly Service exists, whichever is larger:
// the Service's transaction, were it programmed, would hold the lock that many times
// longer too, so the bound keeps telling a wait for it from a slow machine.
const (
	neighbourBound  = 5 * time.Second
	neighbourFactor = 10
)

// TestNeighbourNotDelayedByRefusedService: tenant alpha creates a 120-port ×
// 120-endpoint ClientIP-affinity Service (14,414 sets and 28,840 rules: ~27 s of
// nft -f here, all of it under the kernel's nftables commit lock, which every
// instance, kube-proxy and the CNI share). Its instance refuses it (ServiceTooLarge)
// and programs nothing of it, while every change of tenant beta, made one after another
// from the moment alpha's Service exists until alpha's instance has settled it, reaches
// beta's table in the real kernel within neighbourBound. Before issue 36 the Service was
// accepted (its elements alone were under the limit) and beta's change waited out
// alpha's transaction.
func TestNeighbourNotDelayedByRefusedService(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft")
	tp := netns.New(t)
	ns := tp.Node
	nftInNode(t, ns)
	client := startNeighbours(t, tp, ns)
	ctx := context.Background()
	inTable := func(table, what string) bool {
		out, err := tp.Exec(ns, "nft", "list", "map", "ip", table, "service-ips")
		return err == nil && strings.Contains(out, what)
	}
	testutil.Eventually(t, time.Minute, "both instances' first full syncs", func() bool {
		return inTable("shardproxy-alpha", "") && inTable("shardproxy-beta", "")
	})

	// The neighbour's changes alone, before alpha's Service exists: the bound's baseline.
	var baseline time.Duration
	for i := range 2 {
		ip := fmt.Sprintf("172.30.1.%d", 10+i)
		createPlain(t, client, "beta", fmt.Sprintf("base-%d", i), ip, fmt.Sprintf("10.244.3.%d", 10+i))
		start := time.Now()
		testutil.Eventually(t, time.Minute, "beta's change alone", func() bool {
			return inTable("shardproxy-beta", ip+" . tcp . 80")
		})
		baseline = max(baseline, time.Since(start))
	}
	bound := max(neighbourBound, neighbourFactor*baseline).Round(time.Millisecond)

	const stickyIP = "172.30.0.100"
	sticky, stickySlice := affinityService("alpha", "sticky", stickyIP, 120, 120)
	if _, err := client.CoreV1().Services("alpha").Create(ctx, sticky, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("alpha").Create(ctx, stickySlice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused := func() bool {
		evs, err := client.CoreV1().Events("alpha").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "ServiceTooLarge" && e.InvolvedObject.Name == "sticky" {
				return true
			}
		}
		return false
	}

	// beta's changes, one at a time: each a new Service whose cluster IP must reach
	// beta's table within the bound. They go on until alpha's Service is refused and
	// three more have passed (so some ran while alpha's instance weighed it, and some
	// after), or until a minute is up (four bounds, where the bound grew).
	var latencies []time.Duration
	wait := max(time.Minute, 4*bound)
	deadline := time.Now().Add(wait)
	after := 0
	for i := 0; after < 3; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("alpha's Service neither refused nor programmed after %v; beta's changes took %v (alone %v)",
				wait, latencies, baseline.Round(time.Millisecond))
		}
		ip := fmt.Sprintf("172.30.0.%d", 10+i)
		createPlain(t, client, "beta", fmt.Sprintf("web-%d", i), ip, fmt.Sprintf("10.244.2.%d", 10+i))
		start := time.Now()
		for !inTable("shardproxy-beta", ip+" . tcp . 80") {
			if d := time.Since(start); d > bound {
				t.Fatalf("beta's change %d waited %v (bound %v; alone %v) while alpha's instance took its Service; earlier ones: %v",
					i, d.Round(time.Millisecond), bound, baseline.Round(time.Millisecond), latencies)
			}
			time.Sleep(10 * time.Millisecond)
		}
		latencies = append(latencies, time.Since(start).Round(time.Millisecond))
		if refused() {
			after++
		}
	}
	if inTable("shardproxy-alpha", stickyIP) {
		t.Errorf("alpha's refused Service is programmed")
	}
	fmt.Printf("kernel: 120×120 ClientIP-affinity Service refused by its instance; the neighbour instance's changes meanwhile reached the kernel in %v (alone %v, bound %v)\n",
		latencies, baseline.Round(time.Millisecond), bound)
}

// startNeighbours runs one supervisor with instances alpha (slot 0) and beta (slot 1),
// each serving its own namespace and label, syncing on every change, writing the tables
// of namespace ns; it returns the fake API it watches.
func startNeighbours(t *testing.T, tp *netns.Topology, ns string) kubernetes.Interface {
	t.Helper()
	yaml := fmt.Sprintf("apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\nnodeName: node-1\n"+
		"healthzBindAddress: 127.0.0.1:%d\nmetricsBindAddress: 127.0.0.1:%d\nserviceCIDRDrop: false\nstatusNamespace: \"-\"\ninstances:\n",
		freePort(t), freePort(t))
	for i, name := range []string{"alpha", "beta"} {
		yaml += fmt.Sprintf("- name: %s\n  proxyNames: [%s]\n  slot: %d\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n  tenant:\n    namespaces: [%s]\n",
			name, name, i, name)
	}
	client := testutil.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	runSupervisor(t, decodeConfig(t, yaml, "test.yaml"), nodeDeps(tp, ns, client, logr.Logger(funcr.New(func(string, string) {}, funcr.Options{}))))
	return client
}

// affinityService is a ClusterIP Service of proxy ns (the label) with sessionAffinity
// ClientIP, ports TCP ports 1..ports, and its slice of endpoints ready endpoints.
func affinityService(ns, name, ip string, ports, endpoints int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{"service.kubernetes.io/service-proxy-name": ns}},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Type: corev1.ServiceTypeClusterIP,
			SessionAffinity: corev1.ServiceAffinityClientIP}}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
	for i := 1; i <= ports; i++ {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(i),
			Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(int32(i))})
		sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr.To(fmt.Sprintf("p%d", i)), Port: ptr.To(int32(i)),
			Protocol: ptr.To(corev1.ProtocolTCP)})
	}
	for i := range endpoints {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.250.%d.%d", i/250, i%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node-2")})
	}
	return svc, sl
}

// createPlain creates a one-port (80 → 8080) ClusterIP Service of proxy ns with one
// ready endpoint.
func createPlain(t *testing.T, client kubernetes.Interface, ns, name, ip, endpoint string) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{"service.kubernetes.io/service-proxy-name": ns}},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
		Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{endpoint}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-2")}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}}}
	ctx := context.Background()
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
