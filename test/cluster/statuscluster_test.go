package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/migrate"
)

// TestStatusCluster runs `shardproxy status --cluster` as an operator does (the binary
// with a kubeconfig, here from node-1's namespace) against the replace overlay on every
// node: each node's status ConfigMap reports the default instance, healthy, with the
// Services it serves; the table form is printed for the record.
func TestStatusCluster(t *testing.T) {
	c := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	deployReplaceOverlay(ctx, t, c, shardproxyTag)
	cli := c.shardproxyCLI(ctx, t)
	run := func(args ...string) ([]byte, error) {
		args = append([]string{"--net=/run/netns/" + c.Node(1).NS, cli, "status", "--cluster", "--kubeconfig", c.Kubeconfig}, args...)
		return exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	}
	var cs migrate.ClusterStatus
	var last string
	err := poll(ctx, 3*time.Minute, "every node's status to report its default instance healthy", func() (bool, error) {
		out, err := run("-o", "json")
		last = string(out)
		if err != nil || json.Unmarshal(out, &cs) != nil {
			return false, nil // the statuses are written once the instances synced
		}
		for _, in := range cs.Instances {
			if in.Name == "default" {
				return in.Nodes == len(c.Nodes) && in.Healthy == len(c.Nodes) && in.Services > 0, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v; last output:\n%s", err, last)
	}
	if cs.Nodes != len(c.Nodes) || cs.NodesWithoutStatus.Count != 0 {
		t.Errorf("%d nodes, %d without a status (%v); want %d and none", cs.Nodes, cs.NodesWithoutStatus.Count, cs.NodesWithoutStatus.Sample, len(c.Nodes))
	}
	table, err := run("--instance", "default")
	if err != nil {
		t.Fatalf("status --cluster --instance default: %v\n%s", err, table)
	}
	fmt.Printf("cluster: shardproxy status --cluster --instance default (%d nodes):\n%s", len(c.Nodes), table)
}
