package supervisor

import (
	"context"
	"fmt"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// TestServiceTooLargeRefusedWithEvent checks, through the whole supervisor, that a
// Service over the instance's element limit gets one Warning event and is not
// programmed, while its instance goes on programming every other Service.
func TestServiceTooLargeRefusedWithEvent(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("a", "huge", "team-a", "172.30.0.40")
	// One slice whose ports × endpoints exceed the default limit: the estimate reads
	// the counts, the model is never built.
	ports := make([]discoveryv1.EndpointPort, 500)
	for i := range ports {
		name, port := fmt.Sprintf("p%d", i), int32(1000+i)
		ports[i] = discoveryv1.EndpointPort{Name: &name, Port: &port}
	}
	eps := make([]discoveryv1.Endpoint, instance.DefaultMaxServiceElements/len(ports)+1)
	for i := range eps {
		eps[i] = discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.245.%d.%d", i/250, i%250+1)}}
	}
	big := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "a", Name: "huge-big", Labels: map[string]string{discoveryv1.LabelServiceName: "huge"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: ports, Endpoints: eps,
	}
	if _, err := f.client.DiscoveryV1().EndpointSlices("a").Create(context.Background(), big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "a ServiceTooLarge event for a/huge", func() bool {
		return strings.Contains(f.rec.all(), "a/huge Warning ServiceTooLarge: instance team-a refused the Service")
	})
	f.createService("a", "small", "team-a", "172.30.0.41")
	testutil.Eventually(t, waitTimeout, "team-a programs a/small", func() bool {
		return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.41")
	})
	if d := f.tables.dump("ip shardproxy-team-a"); strings.Contains(d, "172.30.0.40") {
		t.Errorf("the refused Service is programmed:\n%s", d)
	}
	if n := strings.Count(f.rec.all(), "ServiceTooLarge"); n != 1 {
		t.Errorf("%d ServiceTooLarge events, want 1:\n%s", n, f.rec.all())
	}
}

// TestConfiguredServiceLimit: an instance's maxServiceElements reaches it: team-b (limit
// 20 in the test configuration) refuses a Service the default limit would admit.
func TestConfiguredServiceLimit(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("b", "wide", "team-b", "172.30.0.50")
	port, name := int32(8080), "http"
	eps := make([]discoveryv1.Endpoint, 30)
	for i := range eps {
		eps[i] = discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.246.0.%d", i+1)}}
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "b", Name: "wide-1", Labels: map[string]string{discoveryv1.LabelServiceName: "wide"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}}, Endpoints: eps,
	}
	if _, err := f.client.DiscoveryV1().EndpointSlices("b").Create(context.Background(), sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "a ServiceTooLarge event for b/wide", func() bool {
		return strings.Contains(f.rec.all(), "b/wide Warning ServiceTooLarge")
	})
}

// TestConfiguredInstanceCost: an instance's maxInstanceCost reaches it: with team-a's
// Services together limited to 40 cost units, its third one-port Service without
// endpoints (16 units: 4 elements, 3 rules) is refused with a ServiceTooLarge event
// naming the limit, while the first two are programmed.
func TestConfiguredInstanceCost(t *testing.T) {
	f := startSupervisorWith(t, fixtureOptions{configure: func(c *config.Config) {
		for i := range c.Instances {
			if c.Instances[i].Name == "team-a" {
				c.Instances[i].MaxInstanceCost = 40
			}
		}
	}})
	f.createService("a", "one", "team-a", "172.30.0.61")
	f.createService("a", "two", "team-a", "172.30.0.62")
	testutil.Eventually(t, waitTimeout, "team-a programs a/one and a/two", func() bool {
		d := f.tables.dump("ip shardproxy-team-a")
		return has(d, "172.30.0.61") && has(d, "172.30.0.62")
	})
	f.createService("a", "three", "team-a", "172.30.0.63")
	testutil.Eventually(t, waitTimeout, "a ServiceTooLarge event for a/three", func() bool {
		return strings.Contains(f.rec.all(), "a/three Warning ServiceTooLarge: instance team-a refused the Service") &&
			strings.Contains(f.rec.all(), "limit of 40 (maxInstanceCost)")
	})
	if d := f.tables.dump("ip shardproxy-team-a"); strings.Contains(d, "172.30.0.63") {
		t.Errorf("the refused Service is programmed:\n%s", d)
	}
}
