package deploy

import (
	"net"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// monitoringExample is an overlay with the monitoring Component (monitoring/).
const monitoringExample = "monitoring/example"

// TestMonitoringComponent renders monitoring/example (the alongside overlay plus the
// monitoring Component) and checks that its PodMonitor would scrape what the supervisor
// serves: it selects the DaemonSet's pods in their namespace, by a port the container
// declares, whose number is the configuration's metricsBindAddress port on a non-loopback
// address; the job comes from a label the pods carry.
func TestMonitoringComponent(t *testing.T) {
	objs := render(t, monitoringExample)
	ds := only[appsv1.DaemonSet](t, objs, "DaemonSet")
	cm := only[corev1.ConfigMap](t, objs, "ConfigMap")
	checkImages(t, ds)
	cfg := decodeConfig(t, monitoringExample, cm.Data[configKey])
	if cfg.EnableProfiling {
		t.Error("enableProfiling with metrics on the node's addresses: pprof would be open to the network")
	}
	pms := objectsOf(objs, "PodMonitor")
	if len(pms) != 1 {
		t.Fatalf("%d PodMonitors, want 1", len(pms))
	}
	pm := pms[0]
	if pm.GetAPIVersion() != "monitoring.coreos.com/v1" {
		t.Errorf("PodMonitor apiVersion %s", pm.GetAPIVersion())
	}
	podLabels := ds.Spec.Template.Labels
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if len(sel) == 0 {
		t.Error("the PodMonitor selects no labels")
	}
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("the PodMonitor selects %s=%s, the pods have %q", k, v, podLabels[k])
		}
	}
	namespaces, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames")
	if len(namespaces) != 1 || namespaces[0] != ds.Namespace {
		t.Errorf("the PodMonitor looks in namespaces %v, the pods are in %s", namespaces, ds.Namespace)
	}
	if job, _, _ := unstructured.NestedString(pm.Object, "spec", "jobLabel"); podLabels[job] == "" {
		t.Errorf("jobLabel %q is not a label of the pods", job)
	}

	endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(endpoints) != 1 {
		t.Fatalf("%d podMetricsEndpoints, want 1", len(endpoints))
	}
	ep, _ := endpoints[0].(map[string]any)
	portName, _ := ep["port"].(string)
	var declared int32
	for _, p := range ds.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == portName {
			declared = p.ContainerPort
		}
	}
	host, port, err := net.SplitHostPort(cfg.MetricsBindAddress)
	if err != nil {
		t.Fatal(err)
	}
	if port != strconv.Itoa(int(declared)) {
		t.Errorf("the PodMonitor scrapes port %q (%d), the supervisor binds metrics on %s", portName, declared, cfg.MetricsBindAddress)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		t.Errorf("metricsBindAddress %s: Prometheus cannot scrape loopback", cfg.MetricsBindAddress)
	}
}
