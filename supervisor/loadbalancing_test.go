package supervisor

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestLoadBalancingThroughSupervisor: an instance's loadBalancing settings reach its
// tables; a Service's annotation gets an allowed mode, and a disallowed one gets a
// Warning event and the instance's mode.
func TestLoadBalancingThroughSupervisor(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{configure: func(c *config.Config) {
		for i := range c.Instances {
			if c.Instances[i].Name == "team-a" {
				c.Instances[i].LoadBalancing = config.LoadBalancing{Mode: string(tables.LBConsistentHash), AllowedModes: []string{"roundRobin"}}
			}
		}
	}})
	annotate := func(name, mode string) {
		t.Helper()
		svc, err := f.client.CoreV1().Services("a").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Annotations = map[string]string{instance.LoadBalancingAnnotation: mode}
		if _, err := f.client.CoreV1().Services("a").Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.createService("a", "plain", "team-a", "172.30.0.61")
	f.createService("a", "rr", "team-a", "172.30.0.62")
	f.createService("a", "sh", "team-a", "172.30.0.63")
	annotate("rr", "roundRobin")
	annotate("sh", "sourceHash")
	dump := func() string { return f.tables.dump("ip shardproxy-team-a") }
	testutil.Eventually(t, waitTimeout, "team-a programs the three Services in their modes", func() bool {
		d := dump()
		return strings.Contains(d, "172.30.0.61 . tcp . 80 : goto pick-ch-1 }") && strings.Contains(d, "172.30.0.62 . tcp . 80 : goto rr-") &&
			strings.Contains(d, "172.30.0.63 . tcp . 80 : goto pick-ch-1 }")
	})
	testutil.Eventually(t, waitTimeout, "a Warning event for a/sh's refused annotation", func() bool {
		return strings.Contains(f.rec.all(), "a/sh Warning InvalidServiceParts: instance team-a skipped parts of the Service: annotation shardproxy.io/load-balancing: sourceHash is not allowed")
	})
	if all := f.rec.all(); strings.Contains(all, "a/rr ") || strings.Contains(all, "a/plain ") {
		t.Errorf("events for Services whose mode is fine:\n%s", all)
	}
}
