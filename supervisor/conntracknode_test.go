package supervisor

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/supervisor/conntrack"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/testutil"
)

const (
	dnsClient = "10.0.0.1:40000"
	podA      = "10.244.1.2"
	podB      = "10.244.2.2"
)

// dnsEndpoint is an EndpointSlice endpoint: ready, or serving and terminating.
func dnsEndpoint(ip string, terminating bool) discoveryv1.Endpoint {
	ready, serving, term := !terminating, true, terminating
	return discoveryv1.Endpoint{Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term}}
}

// dnsObjects returns a UDP Service "dns" on 53 and its EndpointSlice (port 5353).
func dnsObjects(ns, name, clusterIP string, labels, annotations map[string]string, eps ...discoveryv1.Endpoint) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}},
	}
	port, pname, proto := int32(5353), "dns", corev1.ProtocolUDP
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	return svc, sl
}

func (f *fixture) createDNS(ns, name, clusterIP string, labels, annotations map[string]string, eps ...discoveryv1.Endpoint) {
	f.t.Helper()
	svc, sl := dnsObjects(ns, name, clusterIP, labels, annotations, eps...)
	ctx := context.Background()
	if _, err := f.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) setEndpoints(ns, name string, eps ...discoveryv1.Endpoint) {
	f.t.Helper()
	ctx := context.Background()
	sl, err := f.client.DiscoveryV1().EndpointSlices(ns).Get(ctx, name+"-abc", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	sl.Endpoints = eps
	if _, err := f.client.DiscoveryV1().EndpointSlices(ns).Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// dnsFlow is a UDP flow from the client to clusterIP:53, DNATed to pod:5353.
func dnsFlow(clusterIP, pod string) *netlink.ConntrackFlow {
	return conntrack.NewFlow(tables.UDP, netip.MustParseAddrPort(dnsClient),
		netip.AddrPortFrom(netip.MustParseAddr(clusterIP), 53), netip.AddrPortFrom(netip.MustParseAddr(pod), 5353))
}

// hasFlow reports whether the fake conntrack table still holds flow.
func (f *fixture) hasFlow(flow *netlink.ConntrackFlow) bool {
	return slices.Contains(f.ct.FlowStrings(), conntrack.FlowString(flow))
}

// programsEndpoint reports whether an instance's IPv4 table DNATs to pod:5353.
func (f *fixture) programsEndpoint(inst, pod string) bool {
	return strings.Contains(f.tables.dump("ip shardproxy-"+inst), pod+" . 5353")
}

// settle waits until inst has finished handling every change made so far, cleanups
// included: it gives inst one more Service and waits until that is programmed, which
// happens in a sync after the observer of the previous one returned.
func (f *fixture) settle(inst, ns, proxyName, clusterIP string) {
	f.t.Helper()
	var labels map[string]string
	if proxyName != "" {
		labels = map[string]string{selector.LabelServiceProxyName: proxyName}
	}
	f.createDNS(ns, "settle-"+strings.ReplaceAll(clusterIP, ".", "-"), clusterIP, labels, nil, dnsEndpoint("10.244.9.9", false))
	testutil.Eventually(f.t, waitTimeout, inst+" programs the settling Service", func() bool { return has(f.tables.dump("ip shardproxy-"+inst), clusterIP) })
}

// TestHandoverKeepsFlowsOfServedService: when one local instance lets go of a UDP
// Service another local instance now serves (a relabel, a released migration shadow),
// the flows to its endpoints stay; they go when no local instance serves it any more.
func TestHandoverKeepsFlowsOfServedService(t *testing.T) {
	for _, tc := range []struct {
		name string
		// labels and annotations of the Service at first; team-a programs it.
		labels, annotations map[string]string
		// handOver moves it away from team-a, to newOwner.
		handOver func(f *fixture)
		newOwner string
	}{
		{
			name:     "relabel from team-a to the default instance",
			labels:   map[string]string{selector.LabelServiceProxyName: "team-a"},
			handOver: func(f *fixture) { f.relabel("a", "dns", "") },
			newOwner: "default",
		},
		{
			name:        "team-a's migration shadow released while the default instance owns it",
			annotations: map[string]string{selector.AnnotationShadow: "team-a"},
			handOver: func(f *fixture) {
				svc, err := f.client.CoreV1().Services("a").Get(context.Background(), "dns", metav1.GetOptions{})
				if err != nil {
					f.t.Fatal(err)
				}
				delete(svc.Annotations, selector.AnnotationShadow)
				if _, err := f.client.CoreV1().Services("a").Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
					f.t.Fatal(err)
				}
			},
			newOwner: "default",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startSupervisor(t, "")
			const vip = "172.30.0.53"
			f.createDNS("a", "dns", vip, tc.labels, tc.annotations, dnsEndpoint(podA, false), dnsEndpoint(podB, false))
			testutil.Eventually(t, waitTimeout, "team-a programs dns", func() bool { return f.programsEndpoint("team-a", podA) })
			flowA, flowB := dnsFlow(vip, podA), dnsFlow(vip, podB)
			f.ct.Add(flowA, flowB)

			tc.handOver(f)
			testutil.Eventually(t, waitTimeout, tc.newOwner+" serves dns", func() bool { return f.programsEndpoint(tc.newOwner, podA) })
			testutil.Eventually(t, waitTimeout, "team-a lets go of dns", func() bool { return !has(f.tables.dump("ip shardproxy-team-a"), vip) })
			f.settle("team-a", "a", "team-a", "172.30.0.54")
			if !f.hasFlow(flowA) || !f.hasFlow(flowB) {
				t.Errorf("team-a letting go of a Service %s still serves deleted its flows; left: %v", tc.newOwner, f.ct.FlowStrings())
			}

			// Once no local instance serves it, its flows are stale.
			if err := f.client.CoreV1().Services("a").Delete(context.Background(), "dns", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, waitTimeout, "the flows of the deleted Service go", func() bool { return !f.hasFlow(flowA) && !f.hasFlow(flowB) })
		})
	}
}

// TestTerminatingEndpointKeepsFlowsWhileServing: a pod that starts terminating while
// others are ready leaves the rules at once but keeps its UDP flows while it serves; they
// go when it leaves the EndpointSlice.
func TestTerminatingEndpointKeepsFlowsWhileServing(t *testing.T) {
	f := startSupervisor(t, "")
	const vip = "172.30.0.53"
	teamA := map[string]string{selector.LabelServiceProxyName: "team-a"}
	f.createDNS("a", "dns", vip, teamA, nil, dnsEndpoint(podA, false), dnsEndpoint(podB, false))
	testutil.Eventually(t, waitTimeout, "team-a programs both pods", func() bool {
		return f.programsEndpoint("team-a", podA) && f.programsEndpoint("team-a", podB)
	})
	flowA, flowB := dnsFlow(vip, podA), dnsFlow(vip, podB)
	f.ct.Add(flowA, flowB)

	f.setEndpoints("a", "dns", dnsEndpoint(podA, true), dnsEndpoint(podB, false))
	testutil.Eventually(t, waitTimeout, "team-a stops sending new flows to the terminating pod", func() bool { return !f.programsEndpoint("team-a", podA) })
	f.settle("team-a", "a", "team-a", "172.30.0.54")
	if !f.hasFlow(flowA) {
		t.Errorf("the flow to the terminating, still serving pod was deleted; left: %v", f.ct.FlowStrings())
	}

	f.setEndpoints("a", "dns", dnsEndpoint(podB, false))
	testutil.Eventually(t, waitTimeout, "the flow to the pod that left goes", func() bool { return !f.hasFlow(flowA) })
	if !f.hasFlow(flowB) {
		t.Errorf("the flow to the ready pod was deleted")
	}
}
