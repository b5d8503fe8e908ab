// Package bench measures one shardproxy instance with the real nft in fresh network
// namespaces (issue 6, `make bench`): full and partial syncs against `nft -f` alone,
// memory, per-packet cost at few and many Services, and several instances in one
// process against one. It drives the project's real code path: instance.Proxy (models
// from corev1.Service and discoveryv1.EndpointSlice, tables.Syncer, knftables over the
// real nft). Each scale runs in a re-executed child inside its own namespace, so
// memory figures are the proxy's own and nothing leaks between scales.
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/measure"
	"github.com/shardproxy/shardproxy/test/netns"
)

// Options configure a run.
type Options struct {
	// Scales are the numbers of Services to measure.
	Scales []int
	// Endpoints per Service.
	Endpoints int
	// Instances for the multi-instance comparison (0 or 1: skip it).
	Instances int
	// Samples per partial-sync scenario.
	Samples int
	// FloorRuns is how often `nft -f` of the final ruleset is timed (the best counts); 0
	// skips the floor.
	FloorRuns int
	// PacketScales are the Service counts the per-packet cost is compared at (empty: skip).
	PacketScales []int
	// Conns is the number of TCP connections per per-packet measurement.
	Conns int
	// Out is the JSON report's path.
	Out string
	// ProfileDir, when set, receives CPU and heap profiles of every single-instance child.
	ProfileDir string
	// Modes are the load-balancing modes every scale is measured in (every Service of
	// the instance in that mode); the first is the reference of the checks.
	Modes []tables.LBMode
	// IPv6Percent of the generated Services are IPv6 (the instance syncs both families).
	IPv6Percent int
}

// Main runs the bench (or, with -child, one child) and returns the exit code.
func Main(args []string) int {
	if len(args) > 0 && (args[0] == "-child" || args[0] == "--child") {
		o, err := parseChild(args)
		if err == nil {
			err = runChild(context.Background(), o, os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			return 1
		}
		return 0
	}
	opts, err := parseOptions(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := Run(ctx, opts, os.Stderr)
	if rep != nil {
		PrintTable(os.Stdout, rep)
		if werr := WriteJSON(opts.Out, rep); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Printf("\nJSON: %s\n", opts.Out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	return 0
}

func parseOptions(args []string) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("shardproxy-bench", flag.ContinueOnError)
	scales := fs.String("scales", "1000,10000,30000", "comma-separated numbers of Services")
	packet := fs.String("packet-scales", "100,max", `Service counts for the per-packet cost ("max": the largest scale; "" skips it)`)
	fs.IntVar(&o.Endpoints, "endpoints", 10, "endpoints per Service")
	fs.IntVar(&o.Instances, "instances", 4, "instances for the multi-instance comparison (1 skips it)")
	fs.IntVar(&o.Samples, "samples", 21, "samples per partial-sync scenario")
	fs.IntVar(&o.FloorRuns, "floor-runs", 2, "times `nft -f` of the final ruleset is timed (the best counts); 0 skips it and the `nft list ruleset` it needs (minutes at millions of elements)")
	fs.IntVar(&o.Conns, "conns", 400, "TCP connections per per-packet measurement")
	fs.StringVar(&o.Out, "out", "_output/bench/bench.json", "JSON report path")
	fs.StringVar(&o.ProfileDir, "profile-dir", "", "write CPU (full and partial sync) and heap profiles of each scale here")
	fs.IntVar(&o.IPv6Percent, "ipv6-percent", 0, "share of the generated Services that are IPv6, 0-100 (both families synced by the one instance)")
	modes := fs.String("modes", "random", "comma-separated load-balancing modes to measure each scale in (random, roundRobin, sourceHash, consistentHash)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.Modes, err = parseModes(*modes); err != nil {
		return o, fmt.Errorf("-modes %q: %w", *modes, err)
	}
	if o.Scales, err = parseInts(*scales, 0); err != nil || len(o.Scales) == 0 {
		return o, fmt.Errorf("-scales %q: want a comma-separated list of positive numbers", *scales)
	}
	if o.PacketScales, err = parseInts(*packet, slices.Max(o.Scales)); err != nil {
		return o, fmt.Errorf("-packet-scales %q: %w", *packet, err)
	}
	if o.Endpoints < 1 || o.Samples < 1 || o.FloorRuns < 0 || o.Conns < 10 {
		return o, errors.New("-endpoints and -samples must be positive, -floor-runs not negative, -conns at least 10")
	}
	if o.IPv6Percent < 0 || o.IPv6Percent > 100 {
		return o, fmt.Errorf("-ipv6-percent %d: want 0 to 100", o.IPv6Percent)
	}
	return o, nil
}

func parseInts(s string, maxScale int) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "max" {
			out = append(out, maxScale)
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseModes parses a comma-separated list of load-balancing modes (at least one).
func parseModes(s string) ([]tables.LBMode, error) {
	var out []tables.LBMode
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		m, err := tables.ParseLBMode(f)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("no mode")
	}
	return out, nil
}

// Run measures every scale, then the per-packet cost, logging progress to log. It
// returns what it measured so far even on error.
func Run(ctx context.Context, o Options, log io.Writer) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root: it creates network namespaces and loads nftables rules")
	}
	for _, bin := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s is not installed (hack/install-deps.sh installs it)", bin)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "shardproxy-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}

	start := time.Now()
	rep := &Report{Machine: DescribeMachine(), Endpoints: o.Endpoints}
	r := &runner{exe: exe, work: work, log: log}
	for _, mode := range o.Modes {
		for _, n := range o.Scales {
			sr, err := r.scale(ctx, o, n, mode)
			if err != nil {
				return r.finish(rep, start), fmt.Errorf("%d Services, %s: %w", n, mode, err)
			}
			rep.Scales = append(rep.Scales, *sr)
		}
	}
	if len(o.PacketScales) > 0 {
		pr, err := r.packet(ctx, o)
		rep.Packet = pr
		if err != nil {
			return r.finish(rep, start), fmt.Errorf("per-packet cost: %w", err)
		}
	}
	return r.finish(rep, start), nil
}

type runner struct {
	exe, work string
	log       io.Writer
}

// retire deletes a namespace measured in and waits, at most two minutes, for the kernel
// to tear it down in the background (WaitQuiet), so the next measurement does not run
// beside it. (Keeping them all until the end instead runs a 2-core, 24 GB machine out of
// memory at 30,000 Services: the kernel's tables take gigabytes.)
func (r *runner) retire(ns string) {
	deleteNamespace(ns)
	if waited, quiet := WaitQuiet(context.Background(), 2*time.Minute); waited > 5*time.Second || !quiet {
		r.logf("the kernel took %.0fs to tear down namespace %s (quiet: %v)", waited.Seconds(), ns, quiet)
	}
}

func (r *runner) finish(rep *Report, start time.Time) *Report {
	rep.Seconds = time.Since(start).Seconds()
	evaluate(rep)
	return rep
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, "bench: "+format+"\n", args...)
}

// scale measures n Services in one load-balancing mode: one instance, the floor, then
// (in the first mode only) several instances.
func (r *runner) scale(ctx context.Context, o Options, n int, mode tables.LBMode) (*ScaleResult, error) {
	sr := &ScaleResult{Services: n, Mode: mode}
	dump := ""
	if o.FloorRuns > 0 {
		dump = filepath.Join(r.work, fmt.Sprintf("ruleset-%d-%s.nft", n, mode))
	}
	r.logf("%d Services × %d endpoints, %s: one instance (full sync, resync, partial syncs)", n, o.Endpoints, mode)
	single := &childOptions{mode: "single", services: n, endpoints: o.Endpoints, ipv6Percent: o.IPv6Percent, instances: 1,
		samples: o.Samples, dump: dump, cpuProfile: o.ProfileDir, lbMode: mode}
	if err := r.child(ctx, single, &sr.ChildResult); err != nil {
		return nil, err
	}
	r.logf("%d Services: full sync %.2fs (nft %.2fs), 1-endpoint partial %.1fms", n,
		sr.Full.Seconds, sr.Full.NFTSeconds, sr.Partial[0].MedianMS)

	if dump != "" {
		r.logf("%d Services: nft -f of the final ruleset (%d bytes) into a fresh namespace", n, sr.DumpBytes)
		floor, err := r.floor(ctx, []string{dump}, o.FloorRuns)
		if err != nil {
			return nil, err
		}
		_ = os.Remove(dump)
		sr.Floor = floor
		sr.FullOverFloor = sr.Full.Seconds / floor.Seconds

		r.logf("%d Services: nft -f of the full sync's own scripts (%d families at once) into a fresh namespace", n, len(sr.Scripts))
		scripts, err := r.floor(ctx, sr.Scripts, o.FloorRuns)
		if err != nil {
			return nil, err
		}
		for _, f := range sr.Scripts {
			_ = os.Remove(f)
		}
		sr.ScriptFloor = scripts
		sr.FullOverScriptFloor = sr.Full.Seconds / scripts.Seconds
	}

	if o.Instances > 1 && mode == o.Modes[0] {
		r.logf("%d Services: %d instances × %d Services in one process", n, o.Instances, n/o.Instances)
		multi := &childOptions{mode: "multi", services: n, endpoints: o.Endpoints, ipv6Percent: o.IPv6Percent, instances: o.Instances, samples: 1}
		var mr MultiResult
		if err := r.child(ctx, multi, &mr); err != nil {
			return nil, err
		}
		sr.Multi = &mr
		sr.ExtraInstanceMB = (mr.Memory.PeakRSSMB - sr.Memory.PeakRSSMB) / float64(o.Instances-1)
	}
	return sr, nil
}

// child runs this program with co in a fresh namespace and decodes its JSON into out.
func (r *runner) child(ctx context.Context, co *childOptions, out any) error {
	ns, err := newNamespace("spbench")
	if err != nil {
		return err
	}
	defer r.retire(ns)
	return r.childIn(ctx, ns, co, out)
}

func (r *runner) childIn(ctx context.Context, ns string, co *childOptions, out any) error {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, r.exe}, co.args()...)...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = r.log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("child %s: %w", co.mode, err)
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("child %s: decoding %q: %w", co.mode, stdout.String(), err)
	}
	return nil
}

// floor times `nft -f` of every file at once (the full sync's scripts run as the
// instance runs its families' syncs; a listing is one file) into a fresh namespace,
// runs times, and keeps the best: what nft and the kernel alone take for that input.
func (r *runner) floor(ctx context.Context, files []string, runs int) (FloorResult, error) {
	if len(files) == 0 {
		return FloorResult{}, errors.New("nothing to time nft -f of")
	}
	best := time.Duration(0)
	for range runs {
		ns, err := newNamespace("spfloor")
		if err != nil {
			return FloorResult{}, err
		}
		start := time.Now()
		errs := make([]error, len(files))
		var wg sync.WaitGroup
		for i, f := range files {
			wg.Go(func() {
				if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", f).CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("nft -f %s: %w: %s", f, err, out)
				}
			})
		}
		wg.Wait()
		d := time.Since(start)
		r.retire(ns)
		if err := errors.Join(errs...); err != nil {
			return FloorResult{}, err
		}
		if best == 0 || d < best {
			best = d
		}
	}
	return FloorResult{Seconds: best.Seconds(), Runs: runs}, nil
}

// packet measures TCP connect latency from pod2 to a ClusterIP whose endpoint is pod1,
// through the standard test/netns topology's node, at each per-packet scale.
func (r *runner) packet(ctx context.Context, o Options) ([]PacketResult, error) {
	r.logf("per-packet cost: building the test/netns topology")
	tp, err := netns.Build()
	if tp != nil {
		defer tp.Close()
	}
	if err != nil {
		return nil, err
	}
	const port = 8080
	stop, err := tp.Serve(tp.Pod1, "pod1", "tcp", "", port, func(string, ...any) {})
	if err != nil {
		return nil, err
	}
	defer stop()
	svc := net.JoinHostPort(gen.ClusterIP(0).String(), "80")
	direct := net.JoinHostPort(netns.Pod1IPv4, strconv.Itoa(port))
	var out []PacketResult
	for _, n := range o.PacketScales {
		r.logf("per-packet cost: %d Services in the node, %d connections each to a ClusterIP and to the pod", n, o.Conns)
		load := &childOptions{mode: "load", services: n, endpoints: o.Endpoints, ipv6Percent: o.IPv6Percent, instances: 1, samples: 1,
			target: net.JoinHostPort(netns.Pod1IPv4, strconv.Itoa(port))}
		var ignored struct{}
		if err := r.childIn(ctx, tp.Node, load, &ignored); err != nil {
			return out, err
		}
		sv, dv, err := dialLatencies(tp, tp.Pod2, svc, direct, o.Conns)
		if err != nil {
			return out, err
		}
		out = append(out, PacketResult{Services: n, Conns: o.Conns,
			ServiceMedianUS: measure.Percentile(sv, 50), ServiceP90US: measure.Percentile(sv, 90),
			DirectMedianUS: measure.Percentile(dv, 50), DirectP90US: measure.Percentile(dv, 90)})
	}
	return out, nil
}

// dialLatencies alternates TCP connects from ns to a and to b (after a warm-up) and
// returns the connect times in microseconds. Each connection is closed at once.
func dialLatencies(tp *netns.Topology, ns, a, b string, n int) (la, lb []float64, err error) {
	err = tp.Do(ns, func() error {
		dial := func(addr string) (float64, error) {
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			d := time.Since(start)
			if err != nil {
				return 0, err
			}
			_ = c.Close()
			return float64(d.Nanoseconds()) / 1000, nil
		}
		for i := range n + 20 {
			x, err := dial(a)
			if err != nil {
				return fmt.Errorf("dialing %s: %w", a, err)
			}
			y, err := dial(b)
			if err != nil {
				return fmt.Errorf("dialing %s: %w", b, err)
			}
			if i >= 20 {
				la, lb = append(la, x), append(lb, y)
			}
		}
		return nil
	})
	return la, lb, err
}

// newNamespace creates a network namespace with a random name.
func newNamespace(prefix string) (string, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := prefix + "-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ip netns add %s: %w: %s", name, err, out)
	}
	return name, nil
}

func deleteNamespace(name string) { _ = exec.Command("ip", "netns", "del", name).Run() }

// DescribeMachine says where a run happens: cores, kernel, nft and Go versions.
func DescribeMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("nft", "--version").Output(); err == nil {
		m.NFT = strings.TrimSpace(string(out))
	}
	return m
}

// WriteJSON writes v as indented JSON to path, creating its directory.
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
