package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Kubectl runs the cluster's kubectl (v1.36.3, built with the node) inside the first
// node's namespace with the admin kubeconfig, stdin as its input, and returns its stdout.
func (c *Cluster) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	full := append([]string{"--net=/run/netns/" + c.Nodes[0].NS, c.Bins["kubectl"], "--kubeconfig=" + c.Kubeconfig}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
