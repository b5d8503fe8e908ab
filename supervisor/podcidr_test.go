package supervisor

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestNodeCIDRWaitsForPodCIDRs: an instance detecting local traffic by the Node's pod
// CIDRs does not start while the Node has none (it would run with detection silently
// off): it reports why in /status, is down in shardproxy_instance_up, and programs
// nothing, while the other instances serve. Once the Node gets spec.podCIDRs it starts,
// and its table detects local traffic by them.
func TestNodeCIDRWaitsForPodCIDRs(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{configure: func(c *config.Config) {
		for i := range c.Instances {
			if c.Instances[i].Name == "team-a" {
				c.Instances[i].DetectLocal = config.DetectLocal{Mode: "NodeCIDR"}
			}
		}
	}})
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	f.createService("d", "web-d", "", "172.30.0.4")
	testutil.Eventually(t, waitTimeout, "the default instance serves meanwhile", func() bool {
		return has(f.tables.dump("ip shardproxy-default"), "172.30.0.4")
	})
	testutil.Eventually(t, waitTimeout, "team-a reports the wait in /status", func() bool {
		return strings.Contains(get(t, f.sup, "/status"), "waiting for Node node-1 to have spec.podCIDRs (detectLocal mode NodeCIDR)")
	})
	if got := metricValue(t, f.sup, `shardproxy_instance_up{proxy_instance="team-a"}`); got != "0" {
		t.Errorf("shardproxy_instance_up of the waiting instance = %q, want 0", got)
	}
	if dump := f.tables.dump("ip shardproxy-team-a"); has(dump, "172.30.0.2") {
		t.Errorf("team-a programmed its Service without pod CIDRs:\n%s", dump)
	}

	node, err := f.client.CoreV1().Nodes().Get(context.Background(), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.PodCIDRs = []string{"10.244.7.0/24"}
	if _, err := f.client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "team-a starts with the pod CIDR", func() bool {
		dump := f.tables.dump("ip shardproxy-team-a")
		return has(dump, "172.30.0.2") && strings.Contains(dump, "10.244.7.0/24")
	})
	testutil.Eventually(t, waitTimeout, "team-a up", func() bool {
		return metricValue(t, f.sup, `shardproxy_instance_up{proxy_instance="team-a"}`) == "1"
	})
}
