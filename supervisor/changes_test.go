package supervisor

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/selector"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// nopSink is a selector.Sink that drops everything.
type nopSink struct{}

func (nopSink) UpdateService(*corev1.Service) <-chan struct{}  { return make(chan struct{}) }
func (nopSink) DeleteService(types.NamespacedName)             {}
func (nopSink) UpdateEndpointSlice(*discoveryv1.EndpointSlice) {}
func (nopSink) DeleteEndpointSlice(*discoveryv1.EndpointSlice) {}

var _ selector.Sink = &countingSink{}

// TestChangeCounter: every change counts in the totals; pending counts the Services with
// a change since the last sync, and a sync clears it.
func TestChangeCounter(t *testing.T) {
	m := metrics.New()
	sup := &Supervisor{metrics: m}
	c := newChangeCounter(m)
	sink := &countingSink{Sink: nopSink{}, instance: "team-a", counter: c}
	svc := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name}}
	}
	slice := func(svc string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: svc + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
	}
	want := func(step string, svcTotal, svcPending, epTotal, epPending int) {
		t.Helper()
		for series, v := range map[string]int{
			`kubeproxy_sync_proxy_rules_service_changes_total{proxy_instance="team-a"}`:    svcTotal,
			`kubeproxy_sync_proxy_rules_service_changes_pending{proxy_instance="team-a"}`:  svcPending,
			`kubeproxy_sync_proxy_rules_endpoint_changes_total{proxy_instance="team-a"}`:   epTotal,
			`kubeproxy_sync_proxy_rules_endpoint_changes_pending{proxy_instance="team-a"}`: epPending,
		} {
			if got := metricValue(t, sup, series); got != strconv.Itoa(v) {
				t.Errorf("%s: %s = %q, want %d", step, series, got, v)
			}
		}
	}

	sink.UpdateService(svc("web"))
	sink.UpdateService(svc("web"))
	sink.DeleteService(types.NamespacedName{Namespace: "a", Name: "db"})
	sink.UpdateEndpointSlice(slice("web"))
	want("three Service changes of two Services, one slice change", 3, 2, 1, 1)

	c.synced("team-a")
	want("after a sync", 3, 0, 1, 0)

	sink.DeleteEndpointSlice(slice("web"))
	sink.UpdateEndpointSlice(slice("db"))
	want("two slice changes after the sync", 3, 0, 3, 2)
	if got := metricValue(t, sup, `kubeproxy_sync_proxy_rules_service_changes_total{proxy_instance="default"}`); got != "" {
		t.Errorf("another instance got changes: %q", got)
	}
}

// TestChangeMetricsMove: the supervisor counts the changes it hands each instance and
// clears pending ones once the instance synced them.
func TestChangeMetricsMove(t *testing.T) {
	f := startSupervisor(t, "")
	f.createService("a", "web-a", "team-a", "172.30.0.2")
	testutil.Eventually(t, waitTimeout, "team-a programs its Service", func() bool { return has(f.tables.dump("ip shardproxy-team-a"), "172.30.0.2") })
	series := func(name, inst string) string {
		return metricValue(t, f.sup, `kubeproxy_sync_proxy_rules_`+name+`{proxy_instance="`+inst+`"}`)
	}
	testutil.Eventually(t, waitTimeout, "team-a's change counters to move and nothing to be pending", func() bool {
		return series("service_changes_total", "team-a") != "0" && series("endpoint_changes_total", "team-a") != "0" &&
			series("service_changes_pending", "team-a") == "0" && series("endpoint_changes_pending", "team-a") == "0"
	})
	for _, name := range []string{"service_changes_total", "endpoint_changes_total"} {
		if got := series(name, "team-b"); got != "0" {
			t.Errorf("team-b, which owns nothing, has %s = %q", name, got)
		}
	}
}
