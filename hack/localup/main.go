// Command localup runs a local Kubernetes control plane (etcd and kube-apiserver, see
// package controlplane) until interrupted, for demos and poking at the proxy by hand.
// Start it with hack/local-up.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/shardproxy/shardproxy/test/controlplane"
)

func main() { os.Exit(run()) }

type options struct {
	controlplane.Options
	serviceCIDRs string
	kubeconfig   string
	quiet        bool
}

func run() int {
	var opts options
	fs := flag.NewFlagSet("localup", flag.ContinueOnError)
	fs.StringVar(&opts.BindAddress, "bind-address", controlplane.DefaultBindAddress,
		"address kube-apiserver listens on; 0.0.0.0 lets network namespaces reach it through a veth")
	fs.StringVar(&opts.AdvertiseAddress, "advertise-address", "",
		"kube-apiserver's advertised address, the endpoint of the default/kubernetes Service (default: bind address, or 127.0.0.1)")
	fs.StringVar(&opts.serviceCIDRs, "service-cidrs", strings.Join(controlplane.DefaultServiceCIDRs, ","),
		"service CIDRs, comma-separated, at most one per family")
	fs.StringVar(&opts.kubeconfig, "kubeconfig", "",
		"also write the admin kubeconfig here (removed again on exit)")
	fs.BoolVar(&opts.quiet, "quiet", false, "do not print start progress")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	opts.ServiceCIDRs = strings.Split(opts.serviceCIDRs, ",")
	if !opts.quiet {
		opts.Progress = func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "localup: "+format+"\n", args...)
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := serve(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "localup: %v\n", err)
		return 1
	}
	return 0
}

// serve starts the control plane, prints how to use it and stops it when ctx ends.
func serve(ctx context.Context, opts options) (err error) {
	start := time.Now()
	cp, stop, err := controlplane.StartProcess(ctx, opts.Options)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(os.Stderr, "localup: stopping")
		if stopErr := stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	kubeconfig := cp.Kubeconfig
	if opts.kubeconfig != "" {
		if err := controlplane.WriteKubeconfig(opts.kubeconfig, cp.Host, "admin", cp.AdminToken); err != nil {
			return err
		}
		defer os.Remove(opts.kubeconfig)
		kubeconfig = opts.kubeconfig
	}
	fmt.Printf(`control plane up in %v
  server:         %s
  kubeconfig:     %s
  admin token:    %s
  service CIDRs:  %s
  logs:           %s
                  %s

  export KUBECONFIG=%s

Press Ctrl-C to stop and remove everything.
`, time.Since(start).Round(time.Millisecond), cp.Host, kubeconfig, cp.AdminToken,
		strings.Join(cp.ServiceCIDRs, ","), cp.APIServerLog, cp.EtcdLog, kubeconfig)
	<-ctx.Done()
	return nil
}
