package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/shardproxy/shardproxy/test/cluster"
)

// clusterTag is the tag of the shardproxy image the cluster demo builds and runs.
const clusterTag = "demo"

// runOnCluster is `make demo-cluster`: the image built from the repository, a real node
// (test/cluster), the replace overlay applied with the demo's three instances, the demo's
// Services behind agnhost pods, and the same table. Teardown leaves the host as found.
func runOnCluster(root string, once bool) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: the cluster demo runs containerd and a kubelet in network namespaces")
	}
	if root, err = filepath.Abs(root); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Printf("demo: "+f+"\n", a...) }

	start := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	images, err := cluster.BuildImages(startCtx, root, []string{"TAG=" + clusterTag}, "shardproxy", "agnhost")
	if err != nil {
		return err
	}
	cluster.RemoveStale(logf)
	before := cluster.SnapshotHost()
	c, err := cluster.Start(startCtx, cluster.Options{RepoRoot: root, Logf: logf, Images: images})
	defer func() {
		logf("tearing down")
		if cerr := c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("teardown: %w", cerr))
		} else if diff := before.Diff(c); diff != "" {
			err = errors.Join(err, fmt.Errorf("teardown left the host changed:\n%s", diff))
		} else {
			logf("torn down: no process, mount, network namespace or cgroup of the cluster left")
		}
	}()
	if err != nil {
		return err
	}
	d, err := c.StartDemo(startCtx, cluster.ImageName("shardproxy", images["shardproxy"]), cluster.ImageName("agnhost", images["agnhost"]))
	if err != nil {
		return err
	}
	n1 := c.Node(1)
	logf("up in %v: %d nodes, the demo's pods on %s (namespace %s), shardproxy as the DaemonSet pods of deploy/%s", time.Since(start).Round(time.Second), len(c.Nodes), n1.Name, n1.NS, cluster.ReplaceOverlay)
	fmt.Println()
	if _, err := d.Report(startCtx, os.Stdout); err != nil {
		return err
	}
	if once {
		return nil
	}
	fmt.Printf("\nThe demo stays up; try, in another shell:\n"+
		"  nsenter --net=/run/netns/%s nft list tables\n"+
		"  nsenter --net=/run/netns/%s %s --kubeconfig %s get pods -A -o wide\n"+
		"Ctrl-C tears everything down.\n", n1.NS, n1.NS, c.Bins["kubectl"], c.Kubeconfig)
	<-ctx.Done()
	return nil
}
