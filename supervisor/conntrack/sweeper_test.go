package conntrack

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/tables"
)

// sliceEndpoint is an EndpointSlice endpoint with the address of ep (as epA, whose port
// is the EndpointSlice's): ready, or serving and terminating.
func sliceEndpoint(ep string, terminating bool) discoveryv1.Endpoint {
	ready, serving := !terminating, true
	return discoveryv1.Endpoint{Addresses: []string{ap(ep).Addr().String()},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
}

// dnsService returns the UDP Service a/dns on clusterIP:53 and its EndpointSlice, port
// 5353, holding eps.
func dnsService(eps ...discoveryv1.Endpoint) (*corev1.Service, *discoveryv1.EndpointSlice) {
	port, portName, udp := int32(5353), "dns", corev1.ProtocolUDP
	return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "dns"},
			Spec: corev1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
				Ports: []corev1.ServicePort{{Name: portName, Port: 53, Protocol: udp}}},
		}, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "a", Name: "dns-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "dns"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &udp}},
		}
}

// fakeNode is a Node whose EndpointSlices are slices and where no other instance
// serves anything.
type fakeNode struct {
	slices func() []*discoveryv1.EndpointSlice
}

func (n fakeNode) EndpointSlicesOf(types.NamespacedName) []*discoveryv1.EndpointSlice {
	return n.slices()
}

func (fakeNode) ServedElsewhere(string, []types.NamespacedName) map[types.NamespacedName]*instance.ServiceModel {
	return nil
}

// TestFullSyncRevisitsKeptEndpoints: a full sync reports only Services whose model
// changed; a terminating pod leaving the EndpointSlice does not change it, and its flows
// still go.
func TestFullSyncRevisitsKeptEndpoints(t *testing.T) {
	svc, sl := dnsService(sliceEndpoint(epA, false), sliceEndpoint(epB, false))
	current := []*discoveryv1.EndpointSlice{sl}
	ct := NewFake()
	s := NewSweeper(NewCleaner(ct), fakeNode{slices: func() []*discoveryv1.EndpointSlice { return current }}, metrics.New(), klog.Background())
	name := types.NamespacedName{Namespace: "a", Name: "dns"}
	node := instance.NodeInfo{Name: "node-1"}
	both := instance.Build(svc, current, node)

	flowA, flowB := udp(hostPort(clusterIP, "53"), epA), udp(hostPort(clusterIP, "53"), epB)
	ct.Add(flowA, flowB)
	terminating := sl.DeepCopy()
	terminating.Endpoints = []discoveryv1.Endpoint{sliceEndpoint(epA, true), sliceEndpoint(epB, false)}
	current = []*discoveryv1.EndpointSlice{terminating}
	onlyB := instance.Build(svc, current, node)
	s.Synced("team-a", []instance.ChangedService{{Name: name, Before: both, After: onlyB}}, false)
	if got := ct.FlowStrings(); len(got) != 2 {
		t.Fatalf("pod A started terminating: flows left %v, want both", got)
	}

	gone := sl.DeepCopy()
	gone.Endpoints = []discoveryv1.Endpoint{sliceEndpoint(epB, false)}
	current = []*discoveryv1.EndpointSlice{gone}
	if m := instance.Build(svc, current, node); !reflect.DeepEqual(m, onlyB) {
		t.Fatal("the test expects pod A leaving not to change the model")
	}
	s.Synced("team-a", nil, true)
	if got, want := ct.FlowStrings(), []string{FlowString(flowB)}; !slices.Equal(got, want) {
		t.Errorf("after a full sync that did not report the Service: flows %v, want %v", got, want)
	}
	if n := len(s.kept.all("team-a")); n != 0 {
		t.Errorf("%d Services still remembered after their kept endpoints went", n)
	}
}

func TestServingEndpoints(t *testing.T) {
	notServing, terminating := false, true
	name := types.NamespacedName{Namespace: "a", Name: "dns"}
	_, sl := dnsService(
		sliceEndpoint(epA, false),
		sliceEndpoint(epB, true),
		discoveryv1.Endpoint{Addresses: []string{"10.244.3.2"}, Conditions: discoveryv1.EndpointConditions{Serving: &notServing, Terminating: &terminating}},
		discoveryv1.Endpoint{Addresses: []string{"10.244.4.2"}}, // conditions unset: serving, as upstream
	)
	tcpPort, tcpName, tcp := int32(8080), "http", corev1.ProtocolTCP
	sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: &tcpName, Port: &tcpPort, Protocol: &tcp})
	got := servingEndpoints([]*discoveryv1.EndpointSlice{sl}, name)
	key := tables.ServicePortName{Namespace: "a", Name: "dns", Port: "dns", Protocol: tables.UDP}
	var eps []string
	for _, ep := range got[key] {
		eps = append(eps, ep.String())
	}
	if want := []string{epA, epB, "10.244.4.2:5353"}; !slices.Equal(eps, want) || len(got) != 1 {
		t.Errorf("serving endpoints %v (all: %v), want only the UDP port's %v", eps, got, want)
	}
}

// TestSweepObservesReconcileDuration: each family's cleanup that ran is observed in
// upstream's kubeproxy_conntrack_reconciler_sync_duration_seconds under that family; a
// family without ports to compare, and a cleanup whose dump failed (as upstream skips a
// round whose listing failed), are not. A failed cleanup is counted instead, under the
// instance and family, in shardproxy_conntrack_cleanup_failures_total (the alert
// ShardproxyConntrackCleanupFailing reads it).
func TestSweepObservesReconcileDuration(t *testing.T) {
	tests := []struct {
		name         string
		listErr      error
		wantIPv4     uint64
		wantFailures float64
	}{
		{name: "cleanup ran", wantIPv4: 1},
		{name: "conntrack dump failed", listErr: errors.New("netlink: broken"), wantIPv4: 0, wantFailures: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc, sl := dnsService(sliceEndpoint(epA, false), sliceEndpoint(epB, false))
			current := []*discoveryv1.EndpointSlice{sl}
			ct := NewFake(udp(hostPort(clusterIP, "53"), epA))
			ct.ListErr = tc.listErr
			m := metrics.New()
			m.InitInstance("team-a") // as the supervisor does
			s := NewSweeper(NewCleaner(ct), fakeNode{slices: func() []*discoveryv1.EndpointSlice { return current }}, m, klog.Background())
			name := types.NamespacedName{Namespace: "a", Name: "dns"}
			before := instance.Build(svc, current, instance.NodeInfo{Name: "node-1"})
			current = nil
			s.Synced("team-a", []instance.ChangedService{{Name: name, Before: before, After: nil}}, false)
			got := reconcileObservations(t, m)
			if got["IPv4"] != tc.wantIPv4 || got["IPv6"] != 0 {
				t.Errorf("observations by family %v, want IPv4 %d and IPv6 0 (the Service has no IPv6 port)", got, tc.wantIPv4)
			}
			failures := cleanupFailures(t, m)
			if want := map[string]float64{"IPv4": tc.wantFailures, "IPv6": 0}; !reflect.DeepEqual(failures, want) {
				t.Errorf("team-a's cleanup failures by family %v, want %v", failures, want)
			}
		})
	}
}

// reconcileObservations returns the sample count of the reconciler's duration
// histogram by ip_family.
func reconcileObservations(t *testing.T, m *metrics.Metrics) map[string]uint64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != "kubeproxy_conntrack_reconciler_sync_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "ip_family" {
					out[l.GetValue()] = s.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return out
}

// cleanupFailures returns team-a's shardproxy_conntrack_cleanup_failures_total by
// ip_family.
func cleanupFailures(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "shardproxy_conntrack_cleanup_failures_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["proxy_instance"] == "team-a" {
				out[labels["ip_family"]] = s.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestServesOutsideLists: an endpoint serving outside its port's lists is found; a
// Service with no UDP or SCTP port (nothing serving to compare) costs no allocation, so a
// first full sync over every Service builds no index of their endpoints.
func TestServesOutsideLists(t *testing.T) {
	udp := tables.ServicePortName{Namespace: "a", Name: "dns", Port: "dns", Protocol: tables.UDP}
	tcp := tables.ServicePortName{Namespace: "a", Name: "dns", Port: "http", Protocol: tables.TCP}
	a, b, c := tables.Endpoint{IP: ap(epA).Addr(), Port: 5353}, tables.Endpoint{IP: ap(epB).Addr(), Port: 5353}, tables.Endpoint{IP: ap(epB).Addr(), Port: 8080}
	model := &instance.ServiceModel{Ports: map[tables.Family][]*tables.ServicePort{tables.IPv4: {
		{Name: udp, Protocol: tables.UDP, ClusterEndpoints: []tables.Endpoint{a}},
		{Name: tcp, Protocol: tables.TCP, LocalEndpoints: []tables.Endpoint{c}},
	}}}
	for _, tc := range []struct {
		name    string
		serving Serving
		want    bool
	}{
		{"nothing serving (TCP only)", nil, false},
		{"every serving endpoint listed", Serving{udp: {a}}, false},
		{"a terminating endpoint outside the lists", Serving{udp: {a, b}}, true},
		{"listed on another port only", Serving{udp: {c}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := servesOutsideLists(model, tc.serving); got != tc.want {
				t.Errorf("servesOutsideLists = %v, want %v", got, tc.want)
			}
		})
	}
	if n := testing.AllocsPerRun(10, func() { servesOutsideLists(model, nil) }); n != 0 {
		t.Errorf("%v allocations with nothing serving, want 0", n)
	}
}

// TestIndexPortsKeepsNoTCPEndpoints: the cleanup compares the endpoints of UDP and SCTP
// ports only, so it indexes no TCP port's endpoints (a first full sync hands it every
// port of every Service); a UDP port's, with its serving ones, it does.
func TestIndexPortsKeepsNoTCPEndpoints(t *testing.T) {
	eps := []tables.Endpoint{{IP: ap(epA).Addr(), Port: 5353}, {IP: ap(epB).Addr(), Port: 5353}}
	udp := tables.ServicePortName{Namespace: "a", Name: "dns", Port: "dns", Protocol: tables.UDP}
	tcp := tables.ServicePortName{Namespace: "a", Name: "web", Port: "http", Protocol: tables.TCP}
	ports := []*tables.ServicePort{
		{Name: udp, Protocol: tables.UDP, ClusterIP: ap(epA).Addr(), Port: 53, ClusterEndpoints: eps[:1]},
		{Name: tcp, Protocol: tables.TCP, ClusterIP: ap(epB).Addr(), Port: 80, ClusterEndpoints: eps, LocalEndpoints: eps},
	}
	byKey, _ := indexPorts(ports, Serving{udp: eps[1:], tcp: eps})
	if len(byKey) != 2 {
		t.Fatalf("indexed %d ports, want 2", len(byKey))
	}
	for key, p := range byKey {
		want := 0
		if key.proto == tables.UDP {
			want = 2 // listed and serving
		}
		if len(p.endpoints) != want || (want == 0) != (p.endpoints == nil) {
			t.Errorf("%s %s: endpoints %v, want %d", key.name, key.proto, p.endpoints, want)
		}
	}
}
