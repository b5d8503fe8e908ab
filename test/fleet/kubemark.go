package fleet

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardproxy/shardproxy/test/controlplane"
	"github.com/shardproxy/shardproxy/test/measure"
)

// KubemarkOptions say how to run kubemark's hollow kube-proxy, the fleet's anchor.
type KubemarkOptions struct {
	// Binary is kubemark (hack/build-apiserver.sh kubemark), run as --morph=proxy.
	Binary string
	// Kubeconfig is every hollow proxy's kubeconfig: one file serves all, since each
	// process makes its own client and connection from it and takes its node from --name.
	Kubeconfig string
	// LogDir holds one log per process.
	LogDir string
}

// kubemarkFleet is n kubemark processes, one per hollow node: kubemark runs one hollow
// proxy per process (its proxy server, informers and client are process-wide).
type kubemarkFleet struct {
	procs []*controlplane.Child
}

// startKubemark starts one kubemark --morph=proxy per node name, with kube-proxy's
// default client limits (QPS 5, burst 10; kubemark's own defaults are 10 and 20).
func startKubemark(opts KubemarkOptions, names []string, qps float32, burst int) (*kubemarkFleet, error) {
	f := &kubemarkFleet{}
	for _, name := range names {
		c, err := controlplane.StartChild("kubemark-"+name, filepath.Join(opts.LogDir, "kubemark-"+name+".log"), opts.Binary,
			"--morph=proxy", "--name="+name, "--kubeconfig="+opts.Kubeconfig,
			fmt.Sprintf("--kube-api-qps=%g", qps), fmt.Sprintf("--kube-api-burst=%d", burst), "--v=0")
		if err != nil {
			return nil, errors.Join(fmt.Errorf("starting kubemark for %s: %w", name, err), f.stop())
		}
		f.procs = append(f.procs, c)
	}
	return f, nil
}

// exited returns an error naming the first process that has exited, with its log's end.
func (f *kubemarkFleet) exited() error {
	for _, c := range f.procs {
		if !c.Running() {
			return fmt.Errorf("kubemark process %d exited (%v): %s", c.Pid(), c.ExitErr(), c.LogTail(10))
		}
	}
	return nil
}

// pss sums every process's proportional set size (bytes): the pages of the binary that
// every process maps count once over all of them, not once each as in the resident sets.
func (f *kubemarkFleet) pss() (int64, error) {
	var sum int64
	for _, c := range f.procs {
		pss, err := measure.ReadPss(c.Pid())
		if err != nil {
			return 0, fmt.Errorf("kubemark process %d: %w", c.Pid(), err)
		}
		sum += pss
	}
	return sum, nil
}

func (f *kubemarkFleet) stop() error {
	errs := make([]error, len(f.procs))
	done := make(chan int)
	for i, c := range f.procs {
		go func() {
			errs[i] = c.Stop(10 * time.Second)
			done <- i
		}()
	}
	for range f.procs {
		<-done
	}
	// SIGTERM ends a hollow proxy with a non-zero status; only a failure to stop counts.
	var out []error
	for i, c := range f.procs {
		if c.Running() {
			out = append(out, fmt.Errorf("kubemark process %d did not stop: %v", c.Pid(), errs[i]))
		}
	}
	return errors.Join(out...)
}

// waitWatching waits until n more watches of each of resources than in base are open on
// the apiserver (apiserver_longrunning_requests): each hollow proxy opens its watches
// after its lists, so by then it holds every Service. Its proxier discards what it is
// given, so there is nothing later to wait for.
func waitWatching(ctx context.Context, env Env, f *kubemarkFleet, base Counts, n int, resources []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		sc, err := env.APIServerMetrics(ctx)
		if err != nil {
			return err
		}
		var short []string
		for _, r := range resources {
			if got := sc.Watches[r] - base[r]; got < float64(n) {
				short = append(short, fmt.Sprintf("%v watches of %s", got, r))
			}
		}
		if len(short) == 0 {
			return nil
		}
		if err := f.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v, of %d hollow proxies: %s", timeout, n, strings.Join(short, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
