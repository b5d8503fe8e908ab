// Command demo is `make demo`: a local control plane, a node namespace running
// `shardproxy run` with three instances, sample Services and real traffic, then a table of
// which instance served which Service and how. It stays up until Ctrl-C; --once exits
// after the report (CI). With --cluster (`make demo-cluster`) the same Services and table
// come from a real node (test/cluster) running shardproxy as the replace overlay's
// DaemonSet pod. Root only: it creates network namespaces.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/shardproxy/shardproxy/test/e2e/demo"
)

func main() {
	once := flag.Bool("once", false, "exit after the report instead of staying up until Ctrl-C")
	root := flag.String("repo", ".", "the repository root")
	onCluster := flag.Bool("cluster", false, "run shardproxy as a DaemonSet pod on a real node (kubelet, containerd) instead of a process")
	flag.Parse()
	runDemo := run
	if *onCluster {
		runDemo = runOnCluster
	}
	if err := runDemo(*root, *once); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(root string, once bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: the demo creates network namespaces and nftables tables")
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "shardproxy-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Printf("demo: "+f+"\n", a...) }

	start := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	d, err := demo.Start(startCtx, demo.Options{RepoRoot: root, WorkDir: work, Out: os.Stdout, Logf: logf})
	cancel()
	defer func() {
		logf("tearing down")
		if cerr := d.Close(); cerr != nil {
			logf("teardown: %v", cerr)
		}
	}()
	if err != nil {
		return err
	}
	logf("up in %v: control plane in %s, shardproxy in %s (log %s)", time.Since(start).Round(time.Millisecond),
		d.Env.CP.Host, d.Env.TP.Node, filepath.Join(work, "shardproxy.log"))
	fmt.Println()
	if err := d.Report(ctx); err != nil {
		return err
	}
	if once {
		return nil
	}
	fmt.Printf("\nThe demo stays up; try, in another shell:\n"+
		"  ip netns exec %s nft list tables\n"+
		"  ip netns exec %s %s status\n"+
		"  ip netns exec %s kubectl --kubeconfig %s get services -A   (if you have kubectl)\n"+
		"Ctrl-C tears everything down.\n", d.Env.TP.Node, d.Env.TP.Node, d.Env.Binary, d.Env.TP.Node, d.Env.CP.Kubeconfig)
	<-ctx.Done()
	return nil
}
