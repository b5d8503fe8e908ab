// Command shardproxy-realfleet runs fleets of real nodes (test/realfleet): upstream
// kube-proxy in nftables mode and shardproxy's supervisor, each node a network namespace
// of its own, against one local kube-apiserver and etcd holding the bench's mix of
// Services, and prints each fleet's network programming latency, measured in the nodes'
// kernels the same way for both, and shardproxy's fleet-wide p99 over kube-proxy's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardproxy/shardproxy/test/realfleet"
)

func main() { os.Exit(run()) }

func run() int {
	var o realfleet.Options
	fs := flag.NewFlagSet("shardproxy-realfleet", flag.ContinueOnError)
	nodes := fs.String("nodes", "5,10,20", "fleet sizes, comma-separated")
	proxies := fs.String("proxies", "kube-proxy,shardproxy", "proxies to run at each size: kube-proxy, shardproxy")
	fs.IntVar(&o.Services, "services", 1000, "Services (the bench's mix)")
	fs.IntVar(&o.Endpoints, "endpoints", 10, "endpoints per Service")
	fs.IntVar(&o.Changes, "changes", 10, "probe Services timed per fleet, one after the other")
	fs.DurationVar(&o.Gap, "gap", 0, "wait between one change reaching every node and the next change (0: at once, as make fleet; >1s: each change finds the proxies at rest)")
	fs.DurationVar(&o.Settle, "settle", 10*time.Second, "wait after every node's first sync before the first change")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", 5*time.Minute, "bound on every node's first sync")
	fs.DurationVar(&o.ChangeTimeout, "change-timeout", time.Minute, "bound on one change reaching every node")
	fs.StringVar(&o.ShardproxyBinary, "shardproxy", "bin/shardproxy", "the shardproxy binary")
	fs.StringVar(&o.KubeProxyBinary, "kube-proxy", "", "the kube-proxy binary (hack/build-apiserver.sh --print-path kube-proxy)")
	fs.StringVar(&o.WorkDir, "workdir", "", "where configs and proxy logs go (default a new temporary directory)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	for f := range strings.SplitSeq(*nodes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || n > 1000 {
			fmt.Fprintf(os.Stderr, "-nodes %q: want integers in 1..1000\n", *nodes)
			return 2
		}
		o.Nodes = append(o.Nodes, n)
	}
	for p := range strings.SplitSeq(*proxies, ",") {
		switch p := realfleet.Proxy(strings.TrimSpace(p)); p {
		case realfleet.KubeProxy, realfleet.Shardproxy:
			o.Proxies = append(o.Proxies, p)
		default:
			fmt.Fprintf(os.Stderr, "-proxies %q: want kube-proxy, shardproxy\n", *proxies)
			return 2
		}
	}
	if o.KubeProxyBinary == "" && strings.Contains(*proxies, string(realfleet.KubeProxy)) {
		fmt.Fprintln(os.Stderr, "-kube-proxy: required")
		return 2
	}
	if o.WorkDir != "" {
		if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	} else {
		dir, err := os.MkdirTemp("", "realfleet-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		o.WorkDir = dir
	}
	o.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	results, err := realfleet.Run(ctx, o)
	fmt.Printf("%d Services × %d endpoints (bench mix); %d probe Services per fleet, one after the other, %v apart; proxy logs in %s; %v\n",
		o.Services, o.Endpoints, o.Changes, o.Gap, o.WorkDir, time.Since(start).Round(time.Second))
	fmt.Print(realfleet.Table(results))
	fmt.Print(realfleet.Ratios(results))
	if err != nil {
		fmt.Fprintf(os.Stderr, "shardproxy-realfleet: %v\n", err)
		return 1
	}
	return 0
}
