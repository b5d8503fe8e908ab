package instance

import (
	"context"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
