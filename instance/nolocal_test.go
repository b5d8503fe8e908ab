package instance

import (
	"context"
	"maps"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestSyncCountsNoLocalEndpointsPerFamily: the Service ports with a Local policy and no
// local endpoint are counted per IP family, as each of upstream's per-family proxiers
// counts its own: a dual-stack Service counts in both, a single-stack one in its family.
func TestSyncCountsNoLocalEndpointsPerFamily(t *testing.T) {
	p, err := New(Options{
		Name: "test", Tables: tables.Config{TablePrefix: "shardproxy", MasqueradeBit: 14},
		NFT: func(fam tables.Family, table string) (knftables.Interface, error) {
			return knftables.NewFake(tables.KnftFamily(fam), table), nil
		},
		Node: thisNode(), Clock: testutil.NewClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)),
	})
	if err != nil {
		t.Fatal(err)
	}
	local := func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}
	single := func(s *corev1.Service) {
		s.Name = "single"
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "172.30.9.9", []string{"172.30.9.9"}
	}
	p.UpdateService(service(dualStack, local))
	p.UpdateService(service(single, local))
	res, err := p.Sync(context.Background(), true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[tables.Family]int{tables.IPv4: 2, tables.IPv6: 1}
	if !maps.Equal(res.NoLocalInternal, want) {
		t.Errorf("no local endpoints, internal: %v, want %v", res.NoLocalInternal, want)
	}
	if want := map[tables.Family]int{tables.IPv4: 0, tables.IPv6: 0}; !maps.Equal(res.NoLocalExternal, want) {
		t.Errorf("no local endpoints, external: %v, want %v", res.NoLocalExternal, want)
	}
}

// TestSyncResultHealthChecks: every SyncResult carries the health check node port and the
// local endpoint count of each LoadBalancer Service with a Local external policy, right
// after each change, though results share one copy while nothing of it changes.
func TestSyncResultHealthChecks(t *testing.T) {
	p, _ := newTestProxy(t, nil)
	lbLocal := func(port int32) func(*corev1.Service) {
		return func(s *corev1.Service) {
			ofType(corev1.ServiceTypeLoadBalancer)(s)
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = port
		}
	}
	other := func(s *corev1.Service) {
		s.Name = "other"
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "172.30.9.9", []string{"172.30.9.9"}
	}
	steps := []struct {
		name      string
		change    func()
		wantPorts map[types.NamespacedName]int32
		wantLocal map[types.NamespacedName]LocalEndpoints
		wantSame  bool // the result shares the previous result's maps
	}{
		{"LB Local Service, no endpoints", func() { p.UpdateService(service(lbLocal(32000))) },
			map[types.NamespacedName]int32{webName: 32000}, map[types.NamespacedName]LocalEndpoints{webName: {IPv4: 0}}, false},
		{"a local endpoint", func() { p.UpdateEndpointSlice(v4Slice("web-1", ep("10.244.0.5", thisNodeName))) },
			map[types.NamespacedName]int32{webName: 32000}, map[types.NamespacedName]LocalEndpoints{webName: {IPv4: 1}}, false},
		{"an unrelated ClusterIP Service", func() { p.UpdateService(service(other)) },
			map[types.NamespacedName]int32{webName: 32000}, map[types.NamespacedName]LocalEndpoints{webName: {IPv4: 1}}, true},
		{"another health check port", func() { p.UpdateService(service(lbLocal(32001))) },
			map[types.NamespacedName]int32{webName: 32001}, map[types.NamespacedName]LocalEndpoints{webName: {IPv4: 1}}, false},
		{"no longer Local", func() { p.UpdateService(service(ofType(corev1.ServiceTypeLoadBalancer))) },
			map[types.NamespacedName]int32{}, map[types.NamespacedName]LocalEndpoints{}, false},
	}
	var prev *SyncResult
	for _, st := range steps {
		st.change()
		res, err := p.Sync(context.Background(), false)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if !maps.Equal(res.HealthCheckNodePorts, st.wantPorts) || !maps.Equal(res.LocalEndpoints, st.wantLocal) {
			t.Errorf("%s: health check ports %v, local endpoints %v; want %v, %v",
				st.name, res.HealthCheckNodePorts, res.LocalEndpoints, st.wantPorts, st.wantLocal)
		}
		if prev != nil {
			same := reflect.ValueOf(res.HealthCheckNodePorts).UnsafePointer() == reflect.ValueOf(prev.HealthCheckNodePorts).UnsafePointer()
			if same != st.wantSame {
				t.Errorf("%s: the result shares the previous one's map: %v, want %v", st.name, same, st.wantSame)
			}
		}
		prev = res
	}
}
