package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/supervisor/healthcheck"
)

// kustomization is one directory a user applies with `kubectl apply -k`, and what its
// supervisor configuration must say.
type kustomization struct {
	dir string
	// defaultInstance: some instance serves the unlabeled Services. Only without
	// kube-proxy: two proxies must never both serve them.
	defaultInstance bool
	// kubeProxyPorts: the supervisor binds kube-proxy's ports (10256, 10249), which is
	// only possible where kube-proxy does not run.
	kubeProxyPorts bool
	// directAPIServer: the supervisor reaches kube-apiserver without a Service proxy
	// (KUBERNETES_SERVICE_HOST set, not a cluster name) and without cluster DNS
	// (dnsPolicy Default), since it is the Service proxy.
	directAPIServer bool
	// podLabels are labels the pods must carry besides the DaemonSet's selector.
	podLabels map[string]string
}

var kustomizations = []kustomization{
	{dir: "base"},
	{dir: "overlays/alongside-kube-proxy"},
	{dir: "overlays/replace-kube-proxy", defaultInstance: true, kubeProxyPorts: true, directAPIServer: true,
		// kube-prometheus-stack's kube-proxy Service selects k8s-app: kube-proxy.
		podLabels: map[string]string{"k8s-app": "kube-proxy"}},
}

// kube-proxy's health and metrics ports.
const (
	kubeProxyHealthzPort = 10256
	kubeProxyMetricsPort = 10249
)

// render builds dir as `kubectl apply -k` (kustomize's library, default options) would.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, obj)
	}
	return out
}

// objectsOf returns the objects of kind in objs.
func objectsOf(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// only returns the single object of kind in objs, converted strictly (an unknown field
// is an error) into T.
func only[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) *T {
	t.Helper()
	found := objectsOf(objs, kind)
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s, want 1", len(found), kind)
	}
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(found[0].Object, &v, true); err != nil {
		t.Fatalf("%s %s: %v", kind, found[0].GetName(), err)
	}
	return &v
}

func TestManifests(t *testing.T) {
	for _, k := range kustomizations {
		t.Run(k.dir, func(t *testing.T) {
			objs := render(t, k.dir)

			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
			}
			slices.Sort(kinds)
			want := []string{"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Namespace", "Role", "RoleBinding", "ServiceAccount",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
			if !slices.Equal(kinds, want) {
				t.Fatalf("kinds %v, want one each of %v", kinds, want)
			}

			ds := only[appsv1.DaemonSet](t, objs, "DaemonSet")
			cm := only[corev1.ConfigMap](t, objs, "ConfigMap")
			sa := only[corev1.ServiceAccount](t, objs, "ServiceAccount")
			checkDaemonSet(t, ds, sa, cm)
			checkPodLabels(t, k, ds)
			checkImages(t, ds)

			cfg := decodeConfig(t, k.dir, cm.Data[configKey])
			checkConfig(t, k, ds, cfg)
		})
	}
}

// configKey is the ConfigMap key, and file name under the mount, of the configuration.
const configKey = "config.yaml"

// imageUID is the user deploy/Dockerfile runs as (USER), not root.
const imageUID = 65532

// checkDaemonSet checks what the issue asks of the DaemonSet, and that it runs the
// configuration and the identity the same rendering holds.
func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, sa *corev1.ServiceAccount, cm *corev1.ConfigMap) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork {
		t.Error("hostNetwork is not set: the rules must go into the node's network namespace")
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", pod.PriorityClassName)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("tolerations %v do not tolerate every taint (operator Exists, no key, no effect)", pod.Tolerations)
	}
	if pod.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("runs as %s/%s, but the ServiceAccount is %s/%s", ds.Namespace, pod.ServiceAccountName, sa.Namespace, sa.Name)
	}
	if pod.HostPID || pod.HostIPC {
		t.Error("hostPID or hostIPC set: the supervisor needs neither")
	}

	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil || sc.Capabilities == nil:
		t.Error("the container has no securityContext capabilities")
	default:
		if sc.Privileged != nil && *sc.Privileged {
			t.Error("the supervisor container is privileged: it needs NET_ADMIN only")
		}
		add := slices.Sorted(slices.Values(sc.Capabilities.Add))
		if !slices.Equal(add, []corev1.Capability{"NET_ADMIN"}) {
			t.Errorf("capabilities add %v, want [NET_ADMIN]: nft and conntrack netlink need it, nothing needs more", add)
		}
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Error("runAsNonRoot is not true")
		}
		if sc.RunAsUser == nil || *sc.RunAsUser != imageUID {
			t.Errorf("runAsUser %v, want the image's user %d (deploy/Dockerfile), whose file capabilities it relies on", sc.RunAsUser, imageUID)
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("capabilities drop %v, want [ALL]", sc.Capabilities.Drop)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("allowPrivilegeEscalation is not false")
		}
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("liveness probe %+v, want an HTTP GET of /livez", c.LivenessProbe)
	}
	// /readyz, not /healthz: a kube-proxy still holding the port answers /healthz.
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != healthcheck.ReadyzPath {
		t.Errorf("readiness probe %+v, want an HTTP GET of %s", c.ReadinessProbe, healthcheck.ReadyzPath)
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p != nil && p.HTTPGet != nil && p.HTTPGet.Port.String() != "healthz" {
			t.Errorf("probe of %s on port %s, want the port named healthz", p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("no %s request", r)
		}
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
			e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("NODE_NAME is not set from spec.nodeName: config.nodeName defaults to it")
	}

	// The container runs the configuration of the ConfigMap it mounts.
	configPath := flagValue(c.Args, "--config")
	if len(c.Args) == 0 || c.Args[0] != "run" || configPath == "" {
		t.Fatalf("args %q, want run --config FILE", c.Args)
	}
	var volume string
	for _, m := range c.VolumeMounts {
		if path.Join(m.MountPath, configKey) == configPath {
			volume = m.Name
		}
	}
	if volume == "" {
		t.Fatalf("no volume is mounted where --config %s points", configPath)
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == volume })
	if i < 0 || pod.Volumes[i].ConfigMap == nil || pod.Volumes[i].ConfigMap.Name != cm.Name {
		t.Errorf("volume %q is not the ConfigMap %s", volume, cm.Name)
	}
	if cm.Namespace != ds.Namespace {
		t.Errorf("ConfigMap in namespace %q, DaemonSet in %q", cm.Namespace, ds.Namespace)
	}
	if _, ok := cm.Data[configKey]; !ok {
		t.Errorf("ConfigMap %s has no key %s", cm.Name, configKey)
	}
}

// flagValue returns the value following name in args ("--config FILE" or
// "--config=FILE").
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// decodeConfig decodes, defaults and validates a ConfigMap's configuration as the
// supervisor will on a node (whose name comes from NODE_NAME).
func decodeConfig(t *testing.T, dir, data string) *config.Config {
	t.Helper()
	cfg, err := config.Decode([]byte(data), dir+" ConfigMap "+configKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultWith(func(string) string { return "node-1" }, nil)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("%s ConfigMap %s: %v", dir, configKey, err)
	}
	return cfg
}

// checkConfig checks the configuration against the DaemonSet that runs it and against
// what the kustomization is for.
func checkConfig(t *testing.T, k kustomization, ds *appsv1.DaemonSet, cfg *config.Config) {
	t.Helper()
	c := ds.Spec.Template.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for _, b := range []struct{ field, addr, port string }{
		{"healthzBindAddress", cfg.HealthzBindAddress, "healthz"},
		{"metricsBindAddress", cfg.MetricsBindAddress, "metrics"},
	} {
		host, p, err := net.SplitHostPort(b.addr)
		if err != nil {
			t.Errorf("%s: %v", b.field, err)
			continue
		}
		// Metrics (and pprof) are unauthenticated: loopback only, as kube-proxy's
		// default, and then no port is declared that a scraper would try.
		if ip := net.ParseIP(host); b.port == "metrics" {
			if ip == nil || !ip.IsLoopback() {
				t.Errorf("%s %s is not loopback: the metrics are unauthenticated", b.field, b.addr)
			}
			if n, declared := ports[b.port]; declared {
				t.Errorf("the DaemonSet declares a %s port (%d) for a loopback-only server", b.port, n)
			}
		} else if p != strconv.Itoa(int(ports[b.port])) {
			t.Errorf("%s %s, but the DaemonSet's %s port is %d", b.field, b.addr, b.port, ports[b.port])
		}
		if n, _ := strconv.Atoi(p); (n == kubeProxyHealthzPort || n == kubeProxyMetricsPort) != k.kubeProxyPorts {
			t.Errorf("%s %s: kube-proxy's ports are for replacing it only (kubeProxyPorts=%v)", b.field, b.addr, k.kubeProxyPorts)
		}
	}

	var defaults []string
	for _, in := range cfg.Instances {
		if in.Default {
			defaults = append(defaults, in.Name)
		}
	}
	if k.defaultInstance && len(defaults) != 1 {
		t.Errorf("default instances %v, want exactly one to serve the unlabeled Services", defaults)
	}
	if !k.defaultInstance && len(defaults) != 0 {
		t.Errorf("default instances %v: kube-proxy serves the unlabeled Services here, none may", defaults)
	}

	// The container cannot write /proc/sys; a nonzero setting would only log failures.
	ct := cfg.Conntrack
	for name, v := range map[string]int64{
		"maxPerCore":            int64(*ct.MaxPerCore),
		"tcpEstablishedTimeout": int64(ct.TCPEstablishedTimeout.Duration),
		"tcpCloseWaitTimeout":   int64(ct.TCPCloseWaitTimeout.Duration),
		"udpTimeout":            int64(ct.UDPTimeout.Duration),
		"udpStreamTimeout":      int64(ct.UDPStreamTimeout.Duration),
	} {
		if v != 0 {
			t.Errorf("conntrack.%s is set, but the unprivileged container cannot write sysctls: set it to 0", name)
		}
	}

	checkAPIServerPath(t, k, ds)
}

// checkAPIServerPath: without kube-proxy the supervisor must reach kube-apiserver with
// neither a Service (KUBERNETES_SERVICE_HOST names the apiserver, not the "kubernetes"
// Service) nor cluster DNS (dnsPolicy Default: CoreDNS is a Service too), else a cold
// node waits for itself. Beside kube-proxy, the kubelet's variables and cluster DNS
// work (kube-proxy serves both).
func checkAPIServerPath(t *testing.T, k kustomization, ds *appsv1.DaemonSet) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	var host string
	for _, e := range pod.Containers[0].Env {
		if e.Name == "KUBERNETES_SERVICE_HOST" {
			host = e.Value
		}
	}
	if (host != "") != k.directAPIServer {
		t.Errorf("KUBERNETES_SERVICE_HOST %q, want it set: %v", host, k.directAPIServer)
	}
	if !k.directAPIServer {
		if pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Errorf("dnsPolicy %q, want %q", pod.DNSPolicy, corev1.DNSClusterFirstWithHostNet)
		}
		return
	}
	if pod.DNSPolicy != corev1.DNSDefault {
		t.Errorf("dnsPolicy %q, want %q: any other policy resolves through cluster DNS, a Service only shardproxy can program", pod.DNSPolicy, corev1.DNSDefault)
	}
	if clusterName(host) {
		t.Errorf("KUBERNETES_SERVICE_HOST %q is a cluster DNS name: it resolves only through a Service", host)
	}
}

// clusterName reports whether host is a name only cluster DNS resolves.
func clusterName(host string) bool {
	if net.ParseIP(host) != nil {
		return false
	}
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	return h == "kubernetes" || strings.HasPrefix(h, "kubernetes.default") ||
		strings.HasSuffix(h, ".svc") || strings.Contains(h, ".svc.") || strings.HasSuffix(h, ".cluster.local")
}

// checkPodLabels: the pods carry the labels the kustomization promises, beside the
// selector's.
func checkPodLabels(t *testing.T, k kustomization, ds *appsv1.DaemonSet) {
	t.Helper()
	labels := ds.Spec.Template.Labels
	for key, v := range ds.Spec.Selector.MatchLabels {
		if labels[key] != v {
			t.Errorf("pod label %s=%q, the selector wants %q", key, labels[key], v)
		}
	}
	for key, v := range k.podLabels {
		if labels[key] != v {
			t.Errorf("pod label %s=%q, want %q", key, labels[key], v)
		}
	}
	if _, ok := labels["k8s-app"]; ok && k.podLabels["k8s-app"] == "" {
		t.Errorf("pod label k8s-app=%q beside kube-proxy: its scrape and alerts would mix the two proxies", labels["k8s-app"])
	}
}

// TestCheckCommand runs every ConfigMap's configuration through the real
// `shardproxy check --skip-probe`, as an operator would before applying it.
func TestCheckCommand(t *testing.T) {
	bin := buildShardproxy(t)
	for _, k := range kustomizations {
		t.Run(k.dir, func(t *testing.T) {
			cm := only[corev1.ConfigMap](t, render(t, k.dir), "ConfigMap")
			file := filepath.Join(t.TempDir(), configKey)
			if err := os.WriteFile(file, []byte(cm.Data[configKey]), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "check", "--skip-probe", "--config", file)
			cmd.Env = append(os.Environ(), "NODE_NAME=node-1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("shardproxy check --skip-probe: %v\n%s", err, out)
			}
			t.Logf("shardproxy check --skip-probe:\n%s", out)
		})
	}
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// buildShardproxy builds cmd/shardproxy once per test binary.
func buildShardproxy(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "shardproxy-deploy-test-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir, "github.com/shardproxy/shardproxy/cmd/shardproxy")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/shardproxy: %w\n%s", err, out.String())
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "shardproxy")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// TestRBACFileKinds keeps base/rbac.yaml to the kinds the e2e environment creates from it
// (test/e2e/env applies exactly this file).
func TestRBACFileKinds(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("base", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if obj != nil {
			kind, _ := obj["kind"].(string)
			kinds = append(kinds, kind)
		}
	}
	want := []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Namespace", "Role", "RoleBinding"}
	if !slices.Equal(kinds, want) {
		t.Errorf("base/rbac.yaml holds %v, want exactly %v", kinds, want)
	}
}
