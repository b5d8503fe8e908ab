package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Overlay is what RenderOverlay changes in one of deploy/overlays, through kustomize as
// a user would (a kustomization of their own with the overlay as its resource), never by
// editing the manifests.
type Overlay struct {
	// Dir is the overlay's directory (absolute).
	Dir string
	// Image is the image to run instead of the overlay's (kustomize `images:`).
	Image string
	// APIServer sets the endpoint the replace overlay asks the user to set, when true.
	APIServer bool
	// Config, when set, replaces the supervisor configuration (configMapGenerator).
	Config string
	// NodeSelector, when set, is added to the DaemonSet's node selector (a patch merged
	// with the overlay's kubernetes.io/os): an operator staging shardproxy node by node
	// runs it on the nodes they labelled.
	NodeSelector map[string]string
}

// apiServerPatch sets apiserver-endpoint.yaml's two variables, merged by name.
const apiServerPatch = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: shardproxy
  namespace: kube-system
spec:
  template:
    spec:
      containers:
      - name: shardproxy
        env:
        - name: KUBERNETES_SERVICE_HOST
          value: "%s"
        - name: KUBERNETES_SERVICE_PORT
          value: "%d"
`

// nodeSelectorPatch adds to the DaemonSet's node selector (a JSON object, which is YAML).
const nodeSelectorPatch = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: shardproxy
  namespace: kube-system
spec:
  template:
    spec:
      nodeSelector: %s
`

// RenderOverlay renders o with kustomize and returns the YAML to apply.
func RenderOverlay(o Overlay) ([]byte, error) {
	base, err := kustomizeBuild(o.Dir)
	if err != nil {
		return nil, err
	}
	name, err := overlayImage(base)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shardproxy-kustomize-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// kustomize takes only relative paths to other kustomizations.
	rel, err := filepath.Rel(dir, o.Dir)
	if err != nil {
		return nil, err
	}
	repo, tag, _ := strings.Cut(o.Image, ":")
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nimages:\n- name: %s\n  newName: %s\n  newTag: %q\n", rel, name, repo, tag)
	files := map[string]string{}
	var patches []string
	if o.APIServer {
		patches = append(patches, "apiserver.yaml")
		files["apiserver.yaml"] = fmt.Sprintf(apiServerPatch, APIServerIP, APIPort)
	}
	if len(o.NodeSelector) > 0 {
		sel, err := json.Marshal(o.NodeSelector)
		if err != nil {
			return nil, err
		}
		patches = append(patches, "nodeselector.yaml")
		files["nodeselector.yaml"] = fmt.Sprintf(nodeSelectorPatch, sel)
	}
	if len(patches) > 0 {
		k += "patches:\n- path: " + strings.Join(patches, "\n- path: ") + "\n"
	}
	if o.Config != "" {
		k += "configMapGenerator:\n- name: shardproxy-config\n  namespace: kube-system\n  behavior: replace\n  files:\n  - config.yaml\n"
		files["config.yaml"] = o.Config
	}
	files["kustomization.yaml"] = k
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	out, err := kustomizeBuild(dir)
	if err != nil {
		return nil, err
	}
	return out.AsYaml()
}

func kustomizeBuild(dir string) (resmap.ResMap, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m, nil
}

// overlayImage is the image name (without tag) of the first container of the overlay's
// shardproxy (or shardproxy-cleanup) DaemonSet: what a user's `images:` entry names to
// replace it.
func overlayImage(m resmap.ResMap) (string, error) {
	for _, r := range m.Resources() {
		if r.GetKind() != "DaemonSet" || !strings.HasPrefix(r.GetName(), "shardproxy") {
			continue
		}
		images, err := r.GetSlice("spec.template.spec.containers")
		if err != nil || len(images) == 0 {
			return "", fmt.Errorf("the shardproxy DaemonSet has no containers: %v", err)
		}
		first, _ := images[0].(map[string]any)
		image, _ := first["image"].(string)
		if i := strings.LastIndex(image, "@"); i >= 0 {
			image = image[:i]
		}
		if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
			image = image[:i]
		}
		return image, nil
	}
	return "", fmt.Errorf("the overlay has no shardproxy* DaemonSet")
}

// Apply applies YAML with kubectl (server-side, so a later apply of another overlay
// takes over the same objects).
func (c *Cluster) Apply(ctx context.Context, yaml []byte) error {
	_, err := c.Kubectl(ctx, string(yaml), "apply", "--server-side", "--force-conflicts", "-f", "-")
	return err
}

// WaitDaemonSetRolledOut waits until the DaemonSet's pods all run its current template
// and are ready.
func (c *Cluster) WaitDaemonSetRolledOut(ctx context.Context, ns, name string, timeout time.Duration) (*appsv1.DaemonSet, error) {
	var ds *appsv1.DaemonSet
	var last string
	err := poll(ctx, timeout, fmt.Sprintf("DaemonSet %s/%s rolled out", ns, name), func() (bool, error) {
		if err := c.childrenRunning(); err != nil {
			return false, err
		}
		var err error
		ds, err = c.Client.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		s := ds.Status
		last = fmt.Sprintf("desired %d, updated %d, ready %d, available %d", s.DesiredNumberScheduled, s.UpdatedNumberScheduled, s.NumberReady, s.NumberAvailable)
		return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled > 0 &&
			s.UpdatedNumberScheduled == s.DesiredNumberScheduled && s.NumberReady == s.DesiredNumberScheduled &&
			s.NumberAvailable == s.DesiredNumberScheduled, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w (%s); %s", err, last, c.PodSummary(ctx, ns))
	}
	return ds, nil
}

// NFTTables lists the node's nftables tables ("family name" per line).
func (n *Node) NFTTables(ctx context.Context) ([]string, error) {
	out, err := n.Run(ctx, "nft", "list", "tables")
	if err != nil {
		return nil, err
	}
	var tables []string
	for _, line := range strings.Split(string(bytes.TrimSpace([]byte(out))), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables, nil
}

// OverlayDir is the path of deploy/NAME (an overlay, "cleanup") in the repository.
func (c *Cluster) OverlayDir(name string) string {
	return filepath.Join(c.opts.RepoRoot, "deploy", name)
}

// ApplyOverlay renders o (RenderOverlay), applies it and waits until its DaemonSet (ds,
// in kube-system) has rolled out; it returns how long applying and rolling out took.
func (c *Cluster) ApplyOverlay(ctx context.Context, o Overlay, ds string, timeout time.Duration) (time.Duration, error) {
	yaml, err := RenderOverlay(o)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := c.Apply(ctx, yaml); err != nil {
		return 0, err
	}
	if _, err := c.WaitDaemonSetRolledOut(ctx, "kube-system", ds, timeout); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// The overlays of deploy/, for OverlayDir.
const (
	ReplaceOverlay   = "overlays/replace-kube-proxy"
	AlongsideOverlay = "overlays/alongside-kube-proxy"
)
