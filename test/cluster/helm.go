package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/shardproxy/shardproxy/test/buildcache"
)

// ChartDir is deploy/helm/shardproxy in the repository: the chart an operator installs.
func (c *Cluster) ChartDir() string {
	return filepath.Join(c.opts.RepoRoot, "deploy", "helm", "shardproxy")
}

// Helm runs the Helm CLI (hack/build-helm.sh: the helm.sh/helm/v3 version go.mod requires,
// built from its module, a minute or two the first time) inside node-1's namespace with
// the admin kubeconfig, as an operator runs it, and returns its combined output. Helm's
// cache, configuration and data directories are the cluster's, never the host user's.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	bin, err := buildcache.Helm(ctx, c.opts.RepoRoot, nil)
	if err != nil {
		return "", err
	}
	home := filepath.Join(c.Dir, "helm")
	env := os.Environ()
	for _, dir := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		path := filepath.Join(home, strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(dir, "HELM_"), "_HOME")))
		if err := os.MkdirAll(path, 0o755); err != nil {
			return "", err
		}
		env = append(env, dir+"="+path)
	}
	full := append([]string{"--net=/run/netns/" + c.Nodes[0].NS, bin, "--kubeconfig=" + c.Kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
