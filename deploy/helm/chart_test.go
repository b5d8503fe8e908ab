package helm

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// namespace is where the overlays put everything, and where the chart is installed.
const namespace = "kube-system"

// nodeAddressesExample is deploy/'s overlay with the node address writer's Component
// (deploy/node-addresses/component) on the alongside overlay.
const nodeAddressesExample = "node-addresses/example"

// helmOnlyLabels and helmOnlyAnnotations are what the chart adds that kustomize does not:
// Helm's bookkeeping, not the proxy's settings.
var (
	helmOnlyLabels      = []string{"app.kubernetes.io/managed-by", "helm.sh/chart"}
	helmOnlyAnnotations = []string{"helm.sh/hook", "helm.sh/hook-delete-policy"}
)

// configPrefix starts the name of the configuration's ConfigMap; a hash of its content
// follows (kustomize's and the chart's hashes differ: neither is compared).
const configPrefix = "shardproxy-config-"

// renderChart renders the chart as `helm template --namespace kube-system` with values.
func renderChart(t *testing.T, values map[string]any) ([]*unstructured.Unstructured, error) {
	t.Helper()
	chrt, err := loader.Load("shardproxy")
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	vals, err := chartutil.ToRenderValues(chrt, values, chartutil.ReleaseOptions{
		Name: "shardproxy", Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(chrt, vals)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			if string(js) == "null" {
				continue
			}
			obj := &unstructured.Unstructured{}
			if err := obj.UnmarshalJSON(js); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			out = append(out, obj)
		}
	}
	return out, nil
}

// renderKustomize builds dir as `kubectl apply -k` would.
func renderKustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			t.Fatal(err)
		}
		out = append(out, obj)
	}
	return out
}

// key names an object for the comparison: the configuration's ConfigMap without its hash.
func key(o *unstructured.Unstructured) string {
	name := o.GetName()
	if o.GetKind() == "ConfigMap" && strings.HasPrefix(name, configPrefix) {
		name = configPrefix + "<hash>"
	}
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), name)
}

// normalize removes Helm's bookkeeping from o, replaces the configuration's hash in
// names, and the configuration's text by its decoded content (comments and key order
// are not settings).
func normalize(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	o = o.DeepCopy()
	labels := o.GetLabels()
	for _, l := range helmOnlyLabels {
		delete(labels, l)
	}
	o.SetLabels(labels)
	annotations := o.GetAnnotations()
	for _, a := range helmOnlyAnnotations {
		delete(annotations, a)
	}
	o.SetAnnotations(annotations)
	for _, field := range []string{"labels", "annotations"} {
		if m, _, _ := unstructured.NestedMap(o.Object, "metadata", field); len(m) == 0 {
			unstructured.RemoveNestedField(o.Object, "metadata", field)
		}
	}
	if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), configPrefix) {
		o.SetName(configPrefix + "<hash>")
		text, _, _ := unstructured.NestedString(o.Object, "data", "config.yaml")
		var cfg any
		if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
			t.Fatalf("%s: config.yaml: %v", key(o), err)
		}
		if err := unstructured.SetNestedField(o.Object, canonical(t, cfg), "data", "config.yaml"); err != nil {
			t.Fatal(err)
		}
	}
	if o.GetKind() == "DaemonSet" {
		vols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok && strings.HasPrefix(fmt.Sprint(cm["name"]), configPrefix) {
				cm["name"] = configPrefix + "<hash>"
			}
		}
		if vols != nil {
			if err := unstructured.SetNestedSlice(o.Object, vols, "spec", "template", "spec", "volumes"); err != nil {
				t.Fatal(err)
			}
		}
	}
	return o.Object
}

// canonical is v as JSON with sorted keys, numbers as JSON has them.
func canonical(t *testing.T, v any) map[string]any {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(js, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// valuesFromConfig are the chart values that carry an overlay's config.yaml: its
// instances, and every other field as config but those of leave (the fields a value of
// the chart sets itself, which the comparison then checks).
func valuesFromConfig(t *testing.T, path string, leave ...string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	instances := cfg["instances"]
	for _, k := range append([]string{"apiVersion", "kind", "instances"}, leave...) {
		delete(cfg, k)
	}
	return map[string]any{"instances": instances, "config": cfg}
}

func merge(maps ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range maps {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestChartMatchesOverlays: for the settings of each kustomization in deploy/, the
// chart renders the same objects (Helm's labels and hook annotations aside), the
// configuration's content rather than its text compared.
func TestChartMatchesOverlays(t *testing.T) {
	noCleanup := map[string]any{"cleanup": map[string]any{"onUninstall": false}}
	for _, tc := range []struct {
		name, dir string
		values    map[string]any
		// only restricts the comparison to the chart's objects of these kinds and names
		// (the cleanup DaemonSet is the chart's hook, deploy/cleanup's alone).
		only []string
		// kustomizeOnly are the overlay's objects the chart leaves out for these values,
		// knowing they would do nothing.
		kustomizeOnly []string
	}{
		{
			name: "alongside, the overlay's configuration", dir: "../overlays/alongside-kube-proxy",
			values: merge(noCleanup, map[string]any{"mode": "alongside"}, valuesFromConfig(t, "../overlays/alongside-kube-proxy/config.yaml")),
		},
		{
			name: "replace, the chart's defaults and the overlay's API server", dir: "../overlays/replace-kube-proxy",
			values: merge(noCleanup, map[string]any{"mode": "replace", "apiServer": map[string]any{"host": "192.0.2.10", "port": 6443}}),
		},
		{
			// The Component's PodMonitor of the node address writer selects nothing
			// without the writer; the chart renders it with nodeAddresses.enabled.
			name: "monitoring on the alongside overlay", dir: "../monitoring/example",
			values: merge(noCleanup, map[string]any{"mode": "alongside", "monitoring": map[string]any{"enabled": true}},
				valuesFromConfig(t, "../monitoring/example/config.yaml")),
			kustomizeOnly: []string{"PodMonitor shardproxy-system/shardproxy-node-addresses"},
		},
		{
			name: "monitoring and the node address writer on the alongside overlay", dir: "../monitoring/example-node-addresses",
			values: merge(noCleanup, map[string]any{
				"mode": "alongside", "monitoring": map[string]any{"enabled": true}, "nodeAddresses": map[string]any{"enabled": true},
			}, valuesFromConfig(t, "../monitoring/example-node-addresses/config.yaml", "otherNodeAddresses")),
		},
		{
			// The example's otherNodeAddresses: published is left to nodeAddresses.enabled.
			name: "the node address writer on the alongside overlay", dir: "../" + nodeAddressesExample,
			values: merge(noCleanup, map[string]any{"mode": "alongside", "nodeAddresses": map[string]any{"enabled": true}},
				valuesFromConfig(t, "../"+nodeAddressesExample+"/config.yaml", "otherNodeAddresses")),
		},
		{
			name: "the uninstall's cleanup", dir: "../cleanup",
			values: map[string]any{"mode": "alongside"},
			only:   []string{"DaemonSet kube-system/shardproxy-cleanup"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chart, err := renderChart(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]map[string]any{}
			for _, o := range renderKustomize(t, tc.dir) {
				want[key(o)] = normalize(t, o)
			}
			got := map[string]map[string]any{}
			for _, o := range chart {
				if tc.only == nil || slices.Contains(tc.only, key(o)) {
					got[key(o)] = normalize(t, o)
				}
			}
			for _, k := range tc.kustomizeOnly {
				if _, ok := want[k]; !ok {
					t.Errorf("%s renders no %s", tc.dir, k)
				}
				if _, ok := got[k]; ok {
					t.Errorf("the chart renders %s", k)
				}
				delete(want, k)
			}
			for _, k := range slices.Sorted(maps.Keys(want)) {
				g, ok := got[k]
				if !ok {
					t.Errorf("the chart renders no %s", k)
					continue
				}
				if diff := cmp.Diff(want[k], g); diff != "" {
					t.Errorf("%s differs (-kustomize +chart):\n%s", k, diff)
				}
			}
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[k]; !ok {
					t.Errorf("the chart renders %s, which %s does not", k, tc.dir)
				}
			}
		})
	}
}

// find returns the chart's object of kind and name, or nil.
func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && (o.GetName() == name || name == configPrefix && strings.HasPrefix(o.GetName(), configPrefix)) {
			return o
		}
	}
	return nil
}

// container returns the DaemonSet's container (or init container) of that name.
func container(t *testing.T, ds *unstructured.Unstructured, field, name string) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", field)
	for _, c := range cs {
		if m := c.(map[string]any); m["name"] == name {
			return m
		}
	}
	return nil
}

// configOf is the supervisor configuration the chart renders, decoded.
func configOf(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	text, _, _ := unstructured.NestedString(find(objs, "ConfigMap", configPrefix).Object, "data", "config.yaml")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatalf("config.yaml: %v\n%s", err, text)
	}
	return cfg
}

// componentKeys are the keys of the objects deploy/node-addresses/component adds: those
// of its example overlay that the alongside overlay under it does not render.
func componentKeys(t *testing.T) []string {
	t.Helper()
	base := map[string]bool{}
	for _, o := range renderKustomize(t, "../overlays/alongside-kube-proxy") {
		base[key(o)] = true
	}
	var keys []string
	for _, o := range renderKustomize(t, "../"+nodeAddressesExample) {
		if !base[key(o)] {
			keys = append(keys, key(o))
		}
	}
	if len(keys) == 0 {
		t.Fatalf("%s adds no object to the alongside overlay", nodeAddressesExample)
	}
	return keys
}

// checkNoNodeAddressWriter fails if the chart rendered any object of the writer's
// Component, or a configuration that reads the published list.
func checkNoNodeAddressWriter(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	rendered := map[string]bool{}
	for _, o := range objs {
		rendered[key(o)] = true
	}
	for _, k := range componentKeys(t) {
		if rendered[k] {
			t.Errorf("the chart renders %s without nodeAddresses.enabled", k)
		}
	}
	if v, ok := configOf(t, objs)["otherNodeAddresses"]; ok {
		t.Errorf("the configuration sets otherNodeAddresses: %v without the writer", v)
	}
}

// TestChartValues: what each value changes in the rendered objects, and the values the
// chart refuses.
func TestChartValues(t *testing.T) {
	replace := map[string]any{"mode": "replace", "apiServer": map[string]any{"host": "10.0.0.10"}}
	for _, tc := range []struct {
		name    string
		values  map[string]any
		wantErr string
		check   func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{name: "an unknown mode is refused", values: map[string]any{"mode": "instead"}, wantErr: `mode "instead": want alongside or replace`},
		{name: "replace without the API server is refused", values: map[string]any{"mode": "replace"}, wantErr: "mode replace needs apiServer.host"},
		{
			name: "the image by digest", values: map[string]any{"image": map[string]any{"digest": "sha256:0123"}},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				for _, name := range []string{"shardproxy", "shardproxy-cleanup"} {
					ds := find(objs, "DaemonSet", name)
					cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
					if img := cs[0].(map[string]any)["image"]; img != "ghcr.io/shardproxy/shardproxy@sha256:0123" {
						t.Errorf("%s runs %v", name, img)
					}
				}
			},
		},
		{
			name: "a tag of one's own, and replace's init container follows it", values: merge(replace, map[string]any{"image": map[string]any{"repository": "registry.example/sp", "tag": "v9"}}),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				ds := find(objs, "DaemonSet", "shardproxy")
				for _, c := range []map[string]any{container(t, ds, "containers", "shardproxy"), container(t, ds, "initContainers", "conntrack-sysctls")} {
					if c["image"] != "registry.example/sp:v9" {
						t.Errorf("container %v runs %v", c["name"], c["image"])
					}
				}
			},
		},
		{
			name: "replace without the conntrack init container", values: merge(replace, map[string]any{"conntrackSysctls": map[string]any{"enabled": false}}),
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if c := container(t, find(objs, "DaemonSet", "shardproxy"), "initContainers", "conntrack-sysctls"); c != nil {
					t.Error("the init container is rendered")
				}
			},
		},
		{
			name: "the configuration's ConfigMap is the DaemonSet's, and a change renames it",
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				cm := find(objs, "ConfigMap", configPrefix)
				vols, _, _ := unstructured.NestedSlice(find(objs, "DaemonSet", "shardproxy").Object, "spec", "template", "spec", "volumes")
				if name := vols[0].(map[string]any)["configMap"].(map[string]any)["name"]; name != cm.GetName() {
					t.Errorf("the DaemonSet mounts %v, the chart's ConfigMap is %s", name, cm.GetName())
				}
				other, err := renderChart(t, map[string]any{"config": map[string]any{"reservedCIDRs": []any{"10.0.0.0/8"}}})
				if err != nil {
					t.Fatal(err)
				}
				if find(other, "ConfigMap", configPrefix).GetName() == cm.GetName() {
					t.Error("another configuration keeps the ConfigMap's name: the DaemonSet would not roll")
				}
			},
		},
		{
			name: "a table prefix of one's own reaches the uninstall's cleanup", values: map[string]any{"config": map[string]any{"tablePrefix": "shardproxy-blue"}},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				args := container(t, find(objs, "DaemonSet", "shardproxy-cleanup"), "initContainers", "cleanup")["args"]
				if fmt.Sprint(args) != "[cleanup --all --table-prefix shardproxy-blue]" {
					t.Errorf("cleanup args %v", args)
				}
			},
		},
		{
			name: "node statuses turned off: no status namespace", values: map[string]any{"config": map[string]any{"statusNamespace": "-"}},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if find(objs, "Namespace", "shardproxy-system") != nil || find(objs, "Role", "shardproxy-node-status") != nil {
					t.Error("the status namespace and its Role are rendered")
				}
			},
		},
		{
			name: "the node address writer is off by default", values: map[string]any{},
			check: checkNoNodeAddressWriter,
		},
		{
			// helm upgrade --reuse-values keeps an older release's values, not the chart's defaults.
			name: "values without nodeAddresses, an older chart's, render no writer", values: map[string]any{"nodeAddresses": nil},
			check: checkNoNodeAddressWriter,
		},
		{
			name: "the node address writer follows the image, the verbosity and statusNamespace",
			values: map[string]any{
				"nodeAddresses": map[string]any{"enabled": true},
				"image":         map[string]any{"repository": "registry.example/sp", "tag": "v9", "pullPolicy": "Always"},
				"logVerbosity":  4,
				"config":        map[string]any{"statusNamespace": "proxy-status"},
			},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				const ns = "proxy-status"
				if find(objs, "Namespace", ns) == nil {
					t.Errorf("no Namespace %s", ns)
				}
				dep := find(objs, "Deployment", "shardproxy-node-addresses")
				if dep == nil {
					t.Fatal("no writer Deployment")
				}
				c := container(t, dep, "containers", "node-addresses")
				if c["image"] != "registry.example/sp:v9" || c["imagePullPolicy"] != "Always" {
					t.Errorf("the writer runs %v, pulled %v", c["image"], c["imagePullPolicy"])
				}
				if got := fmt.Sprint(c["args"]); got != "[node-addresses --namespace "+ns+" --v 4]" {
					t.Errorf("the writer's args %s", got)
				}
				for _, kind := range []string{"Deployment", "ServiceAccount", "Role", "RoleBinding"} {
					if o := find(objs, kind, "shardproxy-node-addresses"); o == nil || o.GetNamespace() != ns {
						t.Errorf("the writer's %s is not in %s: %v", kind, ns, o)
					}
				}
				for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
					subjects, _, _ := unstructured.NestedSlice(find(objs, kind, "shardproxy-node-addresses").Object, "subjects")
					if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != ns {
						t.Errorf("the %s binds %v, want the ServiceAccount in %s", kind, subjects, ns)
					}
				}
				// The writer's admission policy names its ServiceAccount and namespace.
				if vap := find(objs, "ValidatingAdmissionPolicy", "shardproxy-node-addresses"); vap == nil {
					t.Error("no admission policy for the writer")
				} else {
					conds, _, _ := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
					vals, _, _ := unstructured.NestedSlice(vap.Object, "spec", "validations")
					wantUser := "request.userInfo.username == 'system:serviceaccount:" + ns + ":shardproxy-node-addresses'"
					if len(conds) != 1 || conds[0].(map[string]any)["expression"] != wantUser {
						t.Errorf("the writer's policy matches %v, want %s", conds, wantUser)
					}
					if len(vals) != 1 || !strings.Contains(fmt.Sprint(vals[0].(map[string]any)["expression"]), "request.namespace == '"+ns+"'") {
						t.Errorf("the writer's policy validates %v, want the namespace %s", vals, ns)
					}
				}
				cfg := configOf(t, objs)
				if cfg["otherNodeAddresses"] != "published" || cfg["statusNamespace"] != ns {
					t.Errorf("the configuration reads otherNodeAddresses %v from statusNamespace %v, want published from %s",
						cfg["otherNodeAddresses"], cfg["statusNamespace"], ns)
				}
			},
		},
		{
			name: "the configuration's otherNodeAddresses wins over the writer's", values: map[string]any{
				"nodeAddresses": map[string]any{"enabled": true},
				"config":        map[string]any{"otherNodeAddresses": "watch"},
			},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				if find(objs, "Deployment", "shardproxy-node-addresses") == nil {
					t.Error("no writer Deployment")
				}
				if v := configOf(t, objs)["otherNodeAddresses"]; v != "watch" {
					t.Errorf("otherNodeAddresses %v, want the configuration's watch", v)
				}
			},
		},
		{
			name:    "the node address writer without node statuses is refused",
			values:  map[string]any{"nodeAddresses": map[string]any{"enabled": true}, "config": map[string]any{"statusNamespace": "-"}},
			wantErr: "nodeAddresses.enabled needs config.statusNamespace",
		},
		{
			name: "the dashboard is deploy/grafana's", values: map[string]any{"monitoring": map[string]any{"enabled": true, "dashboard": true}},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				want, err := os.ReadFile("../grafana/shardproxy.json")
				if err != nil {
					t.Fatal(err)
				}
				cm := find(objs, "ConfigMap", "shardproxy-dashboard")
				got, _, _ := unstructured.NestedString(cm.Object, "data", "shardproxy.json")
				if strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
					t.Error("the chart's dashboard differs from deploy/grafana/shardproxy.json: copy it to deploy/helm/shardproxy/files/")
				}
				if cm.GetLabels()["grafana_dashboard"] != "1" {
					t.Error("the dashboard ConfigMap lacks the grafana_dashboard label")
				}
			},
		},
		{
			name:   "monitoring without the PodMonitor declares no metrics port, and scrapes no writer",
			values: map[string]any{"monitoring": map[string]any{"enabled": true, "podMonitor": false}, "nodeAddresses": map[string]any{"enabled": true}},
			check: func(t *testing.T, objs []*unstructured.Unstructured) {
				for _, name := range []string{"shardproxy", "shardproxy-node-addresses"} {
					if find(objs, "PodMonitor", name) != nil {
						t.Errorf("the PodMonitor %s is rendered", name)
					}
				}
				ports, _, _ := unstructured.NestedSlice(container(t, find(objs, "DaemonSet", "shardproxy"), "containers", "shardproxy"), "ports")
				if len(ports) != 1 {
					t.Errorf("ports %v, want healthz alone", ports)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := renderChart(t, tc.values)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, objs)
		})
	}
}

// TestChartConfigurationIsValid: the configuration the chart writes by default, in each
// mode, with and without the node address writer, is one the supervisor accepts, and
// reads the other Nodes' addresses from the published list exactly when the writer runs.
func TestChartConfigurationIsValid(t *testing.T) {
	writer := map[string]any{"enabled": true}
	for _, tc := range []struct {
		name   string
		values map[string]any
		// want is the configuration's otherNodeAddresses once defaulted.
		want string
	}{
		{"alongside", map[string]any{"mode": "alongside"}, config.OtherNodeAddressesWatch},
		{"replace", map[string]any{"mode": "replace", "apiServer": map[string]any{"host": "10.0.0.10"}}, config.OtherNodeAddressesWatch},
		{"alongside with the node address writer", map[string]any{"mode": "alongside", "nodeAddresses": writer}, config.OtherNodeAddressesPublished},
		{"replace with the node address writer", map[string]any{"mode": "replace", "apiServer": map[string]any{"host": "10.0.0.10"}, "nodeAddresses": writer},
			config.OtherNodeAddressesPublished},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := renderChart(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			text, _, _ := unstructured.NestedString(find(objs, "ConfigMap", configPrefix).Object, "data", "config.yaml")
			cfg, err := config.Decode([]byte(text), "chart")
			if err != nil {
				t.Fatal(err)
			}
			cfg.DefaultWith(func(string) string { return "node-1" }, nil)
			if err := cfg.Validate(); err != nil {
				t.Errorf("%v\n%s", err, text)
			}
			if cfg.OtherNodeAddresses != tc.want {
				t.Errorf("otherNodeAddresses %q, want %q", cfg.OtherNodeAddresses, tc.want)
			}
		})
	}
}

// TestChartVersion: the chart runs the release's image by default: its appVersion is the
// VERSION file's, and its version that without the "v".
func TestChartVersion(t *testing.T) {
	data, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(data))
	chrt, err := loader.Load("shardproxy")
	if err != nil {
		t.Fatal(err)
	}
	if chrt.Metadata.AppVersion != version || "v"+chrt.Metadata.Version != version {
		t.Errorf("Chart.yaml version %s appVersion %s, want %s and %s", chrt.Metadata.Version, chrt.Metadata.AppVersion, strings.TrimPrefix(version, "v"), version)
	}
}
