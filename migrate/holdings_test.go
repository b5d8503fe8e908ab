package migrate

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/selector"
)

func TestSeedHoldings(t *testing.T) {
	held := func(addr string, port int32, uid types.UID) selector.Holding {
		return selector.Holding{Addr: netip.MustParseAddr(addr), Protocol: corev1.ProtocolTCP, Port: port, UID: uid}
	}
	status := func(hs ...selector.Holding) NodeStatus { return NodeStatus{Holdings: hs} }
	for _, tc := range []struct {
		name     string
		statuses []NodeStatus
		want     []selector.Holding
	}{
		{name: "no statuses", want: []selector.Holding{}},
		{
			name:     "the holder most nodes report",
			statuses: []NodeStatus{status(held("192.0.2.7", 80, "b")), status(held("192.0.2.7", 80, "a")), status(held("192.0.2.7", 80, "b"))},
			want:     []selector.Holding{held("192.0.2.7", 80, "b")},
		},
		{
			name:     "a tie goes to the smaller UID, whatever the order read",
			statuses: []NodeStatus{status(held("192.0.2.7", 80, "z")), status(held("192.0.2.7", 80, "c"))},
			want:     []selector.Holding{held("192.0.2.7", 80, "c")},
		},
		{
			name:     "keys apart, sorted",
			statuses: []NodeStatus{status(held("192.0.2.9", 80, "x"), held("192.0.2.7", 443, "y")), status(held("192.0.2.7", 80, "z"))},
			want:     []selector.Holding{held("192.0.2.7", 80, "z"), held("192.0.2.7", 443, "y"), held("192.0.2.9", 80, "x")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SeedHoldings(tc.statuses); !slices.Equal(got, tc.want) {
				t.Errorf("SeedHoldings = %+v, want %+v", got, tc.want)
			}
		})
	}
}
