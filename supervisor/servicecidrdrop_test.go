package supervisor

import (
	"context"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/tables/servicecidr"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestServiceCIDRDropFollowsTheAPI: with the ServiceCIDR API served, the supervisor writes
// the node table of both families from the ServiceCIDR objects and follows their
// changes; with it off (configuration, or API not served), it deletes a node table an
// earlier run left, but never one without shardproxy's marker.
func TestServiceCIDRDropFollowsTheAPI(t *testing.T) {
	nodeTable := servicecidr.TableName("shardproxy")
	t.Run("served", func(t *testing.T) {
		f := startSupervisorWith(t, fixtureOptions{serviceCIDRs: []string{"10.96.0.0/16", "fd00:96::/112"}})
		waitDump(t, f, "ip "+nodeTable, "service-cidrs { 10.96.0.0/16 }")
		waitDump(t, f, "ip6 "+nodeTable, "service-cidrs { fd00:96::/112 }")

		extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "more"},
			Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/16"}}}
		if _, err := f.client.NetworkingV1().ServiceCIDRs().Create(context.Background(), extra, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitDump(t, f, "ip "+nodeTable, "10.100.0.0/16")
	})
	for _, tc := range []struct {
		name string
		opts fixtureOptions
	}{
		{"turned off", fixtureOptions{serviceCIDRs: []string{"10.96.0.0/16"}, noServiceCIDRDrop: true}},
		{"API not served", fixtureOptions{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.seed = []string{"ip " + nodeTable + " # " + servicecidr.OwnerComment, "ip6 " + nodeTable + " # someone else's"}
			f := startSupervisorWith(t, tc.opts)
			testutil.Eventually(t, waitTimeout, "the marked node table to go", func() bool {
				return f.tables.dump("ip "+nodeTable) == ""
			})
			if !strings.Contains(f.tables.dump("ip6 "+nodeTable), "left-over") {
				t.Errorf("the unmarked ip6 table was touched:\n%s", f.tables.dump("ip6 "+nodeTable))
			}
		})
	}
}

func waitDump(t *testing.T, f *fixture, table, want string) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, table+" to hold "+want, func() bool {
		return strings.Contains(f.tables.dump(table), want)
	})
}
