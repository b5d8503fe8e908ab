package supervisor

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
	"github.com/shardproxy/shardproxy/supervisor/nodeaddrs"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestOtherNodesAddressesFromThePublishedList: with otherNodeAddresses: published, the
// other Nodes' addresses come from the published list, not from the Nodes (a Node's own
// address change reaches no node until the writer publishes it); an externalIP the list
// names is refused with a Warning event; an unreadable or deleted list leaves the last
// one read in force and says so in /status and shardproxy_published_node_addresses_up.
func TestOtherNodesAddressesFromThePublishedList(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{configure: func(c *config.Config) {
		c.OtherNodeAddresses = config.OtherNodeAddressesPublished
		c.SharedTenants = true // every instance admits every externalIP
		for i := range c.Instances {
			c.Instances[i].Tenant.ExternalIPCIDRs = []string{"0.0.0.0/0"}
		}
	}})
	ctx := context.Background()
	srv := httptest.NewServer(f.sup.countedHealth())
	defer srv.Close()
	status := func() healthcheck.NodeAddressesStatus {
		_, body := httpGet(t, srv.URL+"/status")
		var st healthcheck.StatusResponse
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("/status: %v: %s", err, body)
		}
		if st.NodeAddresses == nil {
			return healthcheck.NodeAddressesStatus{} // not reported before the caches fill
		}
		return *st.NodeAddresses
	}
	testutil.Eventually(t, waitTimeout, "the list's state in /status", func() bool { return status().State != "" })
	const cmKey = `shardproxy_published_node_addresses_up{configmap="shardproxy-system/shardproxy-nodeaddresses"}`
	if st := status(); st.State != publishedAbsent || metricValue(t, f.sup, cmKey) != "0" {
		t.Errorf("before any list: /status %+v, %s %s; want absent and 0", st, cmKey, metricValue(t, f.sup, cmKey))
	}

	// A Node whose address is not in the list: not reserved from the Node itself.
	node2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.31.0.9"}}}}
	if _, err := f.client.CoreV1().Nodes().Create(ctx, node2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cms := f.client.CoreV1().ConfigMaps(config.DefaultStatusNamespace)
	list := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: nodeaddrs.DefaultName, Namespace: config.DefaultStatusNamespace},
		Data: map[string]string{nodeaddrs.DataKey: nodeaddrs.Encode([]nodeaddrs.Node{
			{Name: "node-1", Addrs: addrList("192.168.100.1")},
			{Name: "node-3", Addrs: addrList("172.31.0.2", "fd00::2")},
		})}}
	if _, err := cms.Create(ctx, list, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the list read", func() bool { return status().State == publishedOK })
	if st := status(); st.Nodes != 2 || metricValue(t, f.sup, cmKey) != "1" ||
		metricValue(t, f.sup, `shardproxy_published_node_addresses_nodes{configmap="shardproxy-system/shardproxy-nodeaddresses"}`) != "2" {
		t.Errorf("/status %+v; want ok with 2 nodes, and the metrics", st)
	}

	f.createService("x", "plain", "", "172.30.0.1")
	svc, err := f.client.CoreV1().Services("x").Get(ctx, "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalIPs = []string{"172.31.0.2", "172.31.0.9"}
	if _, err := f.client.CoreV1().Services("x").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	const refused = "AddressRefused: externalIP 172.31.0.2 refused: it is an address of node node-3"
	testutil.Eventually(t, waitTimeout, refused, func() bool { return strings.Contains(f.rec.all(), refused) })
	testutil.Eventually(t, waitTimeout, "172.31.0.9 (node-2's, not in the list) served", func() bool {
		return strings.Contains(f.tables.dump("ip shardproxy-default"), "172.31.0.9 . tcp . 80")
	})
	if dump := f.tables.dump("ip shardproxy-default"); strings.Contains(dump, "172.31.0.2") {
		t.Fatalf("a listed node address is programmed:\n%s", dump)
	}

	// An unreadable list: the last one stays in force.
	list.Data[nodeaddrs.DataKey] = "garbage\n"
	if _, err := cms.Update(ctx, list, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the list invalid", func() bool { return status().State == publishedInvalid })
	if st := status(); !strings.Contains(st.Error, "not a node address list") || metricValue(t, f.sup, cmKey) != "0" {
		t.Errorf("/status %+v, up %s; want the decode error and 0", st, metricValue(t, f.sup, cmKey))
	}
	// Deleted: still the last list.
	if err := cms.Delete(ctx, nodeaddrs.DefaultName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "the list absent", func() bool { return status().State == publishedAbsent })
	if got := f.sup.watches.OtherNodeIPs(); len(got) != 2 || got[0].Addr.String() != "172.31.0.2" {
		t.Errorf("other node addresses while the list is gone: %v, want the last list's two of node-3", got)
	}

	// The list back without node-3: its address is served.
	list.ResourceVersion = ""
	list.Data[nodeaddrs.DataKey] = nodeaddrs.Encode([]nodeaddrs.Node{{Name: "node-1", Addrs: addrList("192.168.100.1")}})
	if _, err := cms.Create(ctx, list, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "172.31.0.2 served once the list no longer names it", func() bool {
		return strings.Contains(f.tables.dump("ip shardproxy-default"), "172.31.0.2 . tcp . 80")
	})
	if st := status(); st.State != publishedOK || st.Nodes != 1 {
		t.Errorf("/status %+v, want ok with 1 node", st)
	}
	if code, _ := httpGet(t, srv.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d", code)
	}
}

func addrList(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}
