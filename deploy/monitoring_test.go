package deploy

import (
	"net"
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// monitoringExample is an overlay with the monitoring Component (monitoring/).
const monitoringExample = "monitoring/example"

// monitoringNodeAddressesExample is an overlay with the monitoring Component and the node
// address writer's.
const monitoringNodeAddressesExample = "monitoring/example-node-addresses"

// The monitoring Component's PodMonitors: the supervisors' and the node address
// writer's.
const (
	supervisorPodMonitor    = "shardproxy"
	nodeAddressesPodMonitor = "shardproxy-node-addresses"
)

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
	pm := podMonitor(t, objs, supervisorPodMonitor)
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

// TestMonitoringNodeAddressWriter renders monitoring/example-node-addresses (the
// monitoring Component with the node address writer's) and checks that the writer's
// PodMonitor would scrape the writer's pods, and only them, by a port they declare, as a
// job of their own in the namespace the supervisors read the list from; and that in
// monitoring/example (no writer) it selects no pod.
func TestMonitoringNodeAddressWriter(t *testing.T) {
	objs := render(t, monitoringNodeAddressesExample)
	ds := only[appsv1.DaemonSet](t, objs, "DaemonSet")
	dep := only[appsv1.Deployment](t, objs, "Deployment")
	cm := only[corev1.ConfigMap](t, objs, "ConfigMap")
	cfg := decodeConfig(t, monitoringNodeAddressesExample, cm.Data[configKey])
	if cfg.OtherNodeAddresses != "published" {
		t.Errorf("otherNodeAddresses %q, want published", cfg.OtherNodeAddresses)
	}
	if dep.Namespace != cfg.StatusNamespace {
		t.Errorf("the writer runs in %s, the supervisors read the list in %s", dep.Namespace, cfg.StatusNamespace)
	}
	writer := podMonitor(t, objs, nodeAddressesPodMonitor)
	supervisor := podMonitor(t, objs, supervisorPodMonitor)
	writerPods, nodePods := dep.Spec.Template.Labels, ds.Spec.Template.Labels
	for _, tc := range []struct {
		pm        *unstructured.Unstructured
		namespace string
		labels    map[string]string
		want      bool
	}{
		{writer, dep.Namespace, writerPods, true},
		{writer, ds.Namespace, nodePods, false},
		// Not by a namespace alone: should the two share one.
		{writer, dep.Namespace, nodePods, false},
		{supervisor, dep.Namespace, writerPods, false},
		{supervisor, ds.Namespace, writerPods, false},
		{supervisor, ds.Namespace, nodePods, true},
	} {
		if got := podMonitorSelects(tc.pm, tc.namespace, tc.labels); got != tc.want {
			t.Errorf("PodMonitor %s selects pods %v in %s: %v, want %v", tc.pm.GetName(), tc.labels, tc.namespace, got, tc.want)
		}
	}
	job, _, _ := unstructured.NestedString(writer.Object, "spec", "jobLabel")
	supervisorJob, _, _ := unstructured.NestedString(supervisor.Object, "spec", "jobLabel")
	if writerPods[job] == "" || writerPods[job] == nodePods[supervisorJob] {
		t.Errorf("the writer's job %q (jobLabel %s): want a label of its pods, not the supervisors' job %q", writerPods[job], job, nodePods[supervisorJob])
	}
	endpoints, _, _ := unstructured.NestedSlice(writer.Object, "spec", "podMetricsEndpoints")
	if len(endpoints) != 1 {
		t.Fatalf("%d podMetricsEndpoints, want 1", len(endpoints))
	}
	ep, _ := endpoints[0].(map[string]any)
	declared := false
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		declared = declared || p.Name == ep["port"]
	}
	if !declared || ep["path"] != "/metrics" {
		t.Errorf("the writer's PodMonitor scrapes port %v path %v: want a port its container declares, /metrics", ep["port"], ep["path"])
	}

	// Without the writer: nothing to scrape, nothing scraped.
	plain := render(t, monitoringExample)
	idle := podMonitor(t, plain, nodeAddressesPodMonitor)
	for _, o := range plain {
		tmpl, ok, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		if ok && podMonitorSelects(idle, o.GetNamespace(), tmpl) {
			t.Errorf("in %s the writer's PodMonitor selects the pods of %s %s", monitoringExample, o.GetKind(), o.GetName())
		}
	}
}

// podMonitor returns the PodMonitor name of objs.
func podMonitor(t *testing.T, objs []*unstructured.Unstructured, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objectsOf(objs, "PodMonitor") {
		if o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no PodMonitor %s", name)
	return nil
}

// podMonitorSelects says whether pm selects pods with labels in namespace: by its
// namespaceSelector's matchNames and its selector's matchLabels (the shipped ones use
// nothing else; anything else fails the test's caller by selecting too much).
func podMonitorSelects(pm *unstructured.Unstructured, namespace string, labels map[string]string) bool {
	namespaces, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "namespaceSelector", "matchNames")
	if !slices.Contains(namespaces, namespace) {
		return false
	}
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}
