package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/shardproxy/shardproxy/instance"
	"github.com/shardproxy/shardproxy/supervisor"
	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/measure"
	"github.com/shardproxy/shardproxy/test/netns"
)

// A child is this program re-executed inside a network namespace (`ip netns exec`), so
// `nft` runs there natively and the child's memory is the proxy's alone. It prints one
// JSON document on stdout.

// childOptions are the flags of a child.
type childOptions struct {
	mode       string // "single", "multi" or "load"
	services   int
	endpoints  int
	instances  int
	samples    int
	dump       string        // single: write `nft list ruleset` after the full sync here
	cpuProfile string        // single: write CPU and heap profiles into this directory
	target     string        // load: Service 0's only endpoint, ip:port
	lbMode     tables.LBMode // single: every Service's load-balancing mode
	// ipv6Percent of the generated Services are IPv6.
	ipv6Percent int
	// fullSyncHook is the instances' instance.Options.FullSync (the GC target), not a flag.
	fullSyncHook func() func()
}

func (o *childOptions) args() []string {
	return []string{"-child", o.mode,
		"-services", strconv.Itoa(o.services), "-endpoints", strconv.Itoa(o.endpoints),
		"-instances", strconv.Itoa(o.instances), "-samples", strconv.Itoa(o.samples),
		"-dump", o.dump, "-cpuprofile", o.cpuProfile, "-target", o.target, "-lb-mode", string(o.lbMode),
		"-ipv6-percent", strconv.Itoa(o.ipv6Percent)}
}

func parseChild(args []string) (*childOptions, error) {
	o := &childOptions{}
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	fs.StringVar(&o.mode, "child", "", "")
	fs.IntVar(&o.services, "services", 0, "")
	fs.IntVar(&o.endpoints, "endpoints", 10, "")
	fs.IntVar(&o.instances, "instances", 1, "")
	fs.IntVar(&o.samples, "samples", 21, "")
	fs.StringVar(&o.dump, "dump", "", "")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "")
	fs.StringVar(&o.target, "target", "", "")
	lbMode := fs.String("lb-mode", "", "")
	fs.IntVar(&o.ipv6Percent, "ipv6-percent", 0, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	o.lbMode, err = tables.ParseLBMode(*lbMode)
	return o, err
}

// runChild runs one child and writes its result to out.
func runChild(ctx context.Context, o *childOptions, out io.Writer) error {
	// The garbage collector as `shardproxy run` tunes it (supervisor.TuneGC and
	// NewGCTarget), so the memory and sync times measured are the daemon's.
	o.fullSyncHook = supervisor.NewGCTarget(supervisor.TuneGC(os.Getenv, debug.SetGCPercent), debug.SetGCPercent)
	var res any
	var err error
	switch o.mode {
	case "single":
		res, err = childSingle(ctx, o)
	case "multi":
		res, err = childMulti(ctx, o)
	case "load":
		err = childLoad(ctx, o)
		res = struct{}{}
	default:
		err = fmt.Errorf("unknown child mode %q", o.mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(res)
}

// benchInstance is one proxy instance under measurement.
type benchInstance struct {
	proxy *instance.Proxy
	nfts  []*timedNFT
	// direct are the families' netlink writers, timed.
	direct []*timedApplier
}

// tableConfig is the node every child pretends to be: the test/netns node's addresses,
// ClusterCIDR local detection over the generated and the topology's pod CIDRs.
func tableConfig(slot int) tables.Config {
	node, node6 := netip.MustParseAddr(netns.NodeIPv4), netip.MustParseAddr(netns.NodeIPv6)
	return tables.Config{
		TablePrefix:   "shardproxy",
		Slot:          slot,
		MasqueradeBit: 14,
		Local: tables.LocalTraffic{Mode: tables.LocalClusterCIDR, CIDRs: append(gen.PodCIDRs(),
			netip.MustParsePrefix(netns.ClusterPodCIDRv4), netip.MustParsePrefix(netns.ClusterPodCIDRv6))},
		NodePortIPs: []netip.Addr{node, node6},
		NodeIPs:     []netip.Addr{node, node6},
	}
}

// newInstance opens an instance as the supervisor does (both families), with timed nft,
// every Service in load-balancing mode lb.
func newInstance(name string, slot int, lb tables.LBMode, fullSync func() func()) (*benchInstance, error) {
	bi := &benchInstance{}
	p, err := instance.New(instance.Options{
		Name:     name,
		Tables:   tableConfig(slot),
		Families: []tables.Family{tables.IPv4, tables.IPv6},
		NFT: func(fam tables.Family, table string) (knftables.Interface, error) {
			nft, err := tables.NewNFT(fam, table)
			if err != nil {
				return nil, err
			}
			t := &timedNFT{Interface: nft}
			bi.nfts = append(bi.nfts, t)
			return t, nil
		},
		// As the supervisor does: partial syncs without new chains go over netlink.
		Direct: func(cfg tables.Config) (tables.Applier, error) {
			w, err := tables.NewNetlinkWriter(cfg)
			if err != nil {
				return nil, err
			}
			t := &timedApplier{Applier: w}
			bi.direct = append(bi.direct, t)
			return t, nil
		},
		ElementsPerCommand: tables.MaxElementsPerCommand,
		LoadBalancing:      instance.LoadBalancing{Mode: lb},
		FullSync:           fullSync,
		Node:               instance.NodeInfo{Name: gen.NodeName},
	})
	if err != nil {
		return nil, err
	}
	bi.proxy = p
	return bi, nil
}

// dumpRuleset writes `nft list ruleset` to path, line by line (at 100,000 Services the
// listing is ~85 MB, which held in memory would count in the child's peak RSS), and
// returns the bytes written. The kernel lists the bound it puts on every set a rule
// updates (the affinity sets) as "size 65535"; loaded back, an explicit size
// preallocates the hash table, which the proxy's own sets do not, and would inflate the
// floor: those lines are left out.
func dumpRuleset(ctx context.Context, path string) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "nft", "list", "ruleset")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("nft list ruleset: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	n, copyErr := 0, error(nil)
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 64<<10), 16<<20)
	for lines.Scan() {
		if strings.TrimSpace(lines.Text()) == "size 65535" {
			continue
		}
		k, err := fmt.Fprintln(w, lines.Text())
		n += k
		if err != nil {
			copyErr = err
			break
		}
	}
	if copyErr == nil {
		copyErr = lines.Err()
	}
	if copyErr != nil {
		_ = cmd.Process.Kill()
	}
	if err := errors.Join(copyErr, cmd.Wait(), w.Flush()); err != nil {
		return n, fmt.Errorf("nft list ruleset into %s: %w", path, err)
	}
	return n, f.Close()
}

// keepScripts copies each family's scripts into a file next to dump (dump.<i>.nft)
// until the returned function, which stops copying, closes the files and returns their
// paths.
func (bi *benchInstance) keepScripts(dump string) (func() ([]string, error), error) {
	var files []*os.File
	var bufs []*bufio.Writer
	closeAll := func() ([]string, error) {
		var paths []string
		var errs []error
		for i, f := range files {
			bi.nfts[i].script = nil
			paths = append(paths, f.Name())
			errs = append(errs, bufs[i].Flush(), f.Close())
		}
		return paths, errors.Join(errs...)
	}
	for i, t := range bi.nfts {
		f, err := os.Create(fmt.Sprintf("%s.%d.nft", dump, i))
		if err != nil {
			_, _ = closeAll()
			return nil, fmt.Errorf("keeping the full sync's scripts: %w", err)
		}
		// Buffered: the copy runs inside the timed sync, a write per command otherwise.
		b := bufio.NewWriterSize(f, 1<<20)
		files, bufs = append(files, f), append(bufs, b)
		t.script = b
	}
	return closeAll, nil
}

// syncOnce is one measured sync.
type syncOnce struct {
	elapsed  time.Duration
	nft      time.Duration
	nftCalls int
	ops      int
	elements int // added + deleted
	netlink  int // families whose partial sync went over netlink, not nft
	// netlinkTime is the time in the netlink writers' transactions (both families).
	netlinkTime time.Duration
	// user and sys are the process's CPU times during the sync (every thread: the
	// runtime's too), gcs the garbage collections that ended in it.
	user, sys time.Duration
	gcs       uint64
	txBytes   int
	txs       []*knftables.Transaction
}

func (bi *benchInstance) sync(ctx context.Context, full bool) (syncOnce, error) {
	for _, t := range bi.nfts {
		t.take()
	}
	for _, t := range bi.direct {
		t.take()
	}
	cpu0, gc0 := processCPU()
	start := time.Now()
	res, err := bi.proxy.Sync(ctx, full)
	s := syncOnce{elapsed: time.Since(start)}
	cpu1, gc1 := processCPU()
	s.user, s.sys, s.gcs = cpu1.user-cpu0.user, cpu1.sys-cpu0.sys, gc1-gc0
	for _, t := range bi.direct {
		s.netlinkTime += t.take()
	}
	if err != nil {
		return s, err
	}
	if res == nil {
		return s, errors.New("sync had nothing to do")
	}
	if res.Full != full {
		return s, fmt.Errorf("wanted a full sync %v, got %v", full, res.Full)
	}
	for _, st := range res.Stats {
		s.ops += st.Operations
		s.elements += st.Added + st.Deleted
		if st.Direct {
			s.netlink++
		}
	}
	for _, t := range bi.nfts {
		busy, calls, last, streamed := t.take()
		s.nft += busy
		s.nftCalls += calls
		s.txBytes += streamed
		if last != nil {
			s.txs = append(s.txs, last)
		}
	}
	return s, nil
}

// txSize renders the transactions once more to count their bytes (outside any timing).
func (s *syncOnce) txSize() {
	for _, tx := range s.txs {
		s.txBytes += len(tx.String())
	}
	s.txs = nil
}

func (s syncOnce) full() FullSync {
	return FullSync{Seconds: s.elapsed.Seconds(), NFTSeconds: s.nft.Seconds(), NFTCalls: s.nftCalls,
		Operations: s.ops, Elements: s.elements, TxBytes: s.txBytes}
}

// feed hands the instance its Services and slices, as the supervisor's informers do.
func (bi *benchInstance) feed(c *gen.Cluster, keep func(i int) bool) {
	for i, svc := range c.Services {
		if keep(i) {
			bi.proxy.UpdateService(svc)
			bi.proxy.UpdateEndpointSlice(c.Slices[i])
		}
	}
}

// childSingle measures one instance: full sync, memory, a second full sync over the
// populated table, and the partial syncs.
func childSingle(ctx context.Context, o *childOptions) (*ChildResult, error) {
	c := gen.GenerateFamilies(o.services, o.endpoints, o.ipv6Percent)
	bi, err := newInstance("bench", 0, o.lbMode, o.fullSyncHook)
	if err != nil {
		return nil, err
	}
	bi.feed(c, func(int) bool { return true })
	res := &ChildResult{}
	res.Memory.ObjectsRSSMB = rssMB()

	var closeScripts func() ([]string, error)
	if o.dump != "" {
		if closeScripts, err = bi.keepScripts(o.dump); err != nil {
			return nil, err
		}
	}
	stop := startProfile(o.cpuProfile, fmt.Sprintf("full-%d.pprof", o.services))
	first, err := bi.sync(ctx, true)
	stop()
	if closeScripts != nil {
		scripts, cerr := closeScripts()
		if err == nil && cerr != nil {
			return nil, cerr
		}
		res.Scripts = scripts
	}
	if err != nil {
		return nil, fmt.Errorf("full sync: %w", err)
	}
	res.Memory.fill()
	writeHeapProfile(o.cpuProfile, fmt.Sprintf("heap-%d.pprof", o.services))
	first.txSize()
	res.Full = first.full()

	if o.dump != "" {
		if res.DumpBytes, err = dumpRuleset(ctx, o.dump); err != nil {
			return nil, err
		}
	}

	// The periodic sync's own peak, not the larger of it and the first sync's.
	if err := resetPeakRSS(); err != nil {
		return nil, err
	}
	again, err := bi.sync(ctx, true)
	if err != nil {
		return nil, fmt.Errorf("second full sync: %w", err)
	}
	again.txs = nil
	res.Resync = again.full()
	res.Memory.ResyncPeakRSSMB = peakRSSMB()

	res.Partial, err = partials(ctx, bi, c, o)
	if err != nil {
		return nil, err
	}
	if o.cpuProfile != "" {
		// A longer run of one-endpoint changes, so the profile has enough samples.
		stop := startProfile(o.cpuProfile, fmt.Sprintf("partial-%d.pprof", o.services))
		for s := range 200 {
			p := pickServices(c, 1, 1000+s, nil)[0]
			bi.proxy.UpdateEndpointSlice(c.ReplaceEndpoint(p, s))
			if _, err := bi.sync(ctx, false); err != nil {
				stop()
				return nil, err
			}
		}
		stop()
	}
	res.Memory.EndPeakRSSMB = max(res.Memory.PeakRSSMB, peakRSSMB())
	return res, nil
}

// partials runs every partial-sync scenario o.samples times (the 100-endpoint one a
// fifth as often) and summarizes each.
func partials(ctx context.Context, bi *benchInstance, c *gen.Cluster, o *childOptions) ([]Partial, error) {
	deleted := map[int]bool{}
	live := func(i int) bool { return !deleted[i] }
	n := len(c.Services)
	scenarios := []struct {
		name    string
		samples int
		change  func(s int)
	}{
		{"1 endpoint changed", o.samples, func(s int) {
			i := pickServices(c, 1, s, live)[0]
			bi.proxy.UpdateEndpointSlice(c.ReplaceEndpoint(i, s))
		}},
		{"1 Service added", o.samples, func(s int) {
			svc, slice := c.New(n + s)
			bi.proxy.UpdateService(svc)
			bi.proxy.UpdateEndpointSlice(slice)
		}},
		{"1 Service deleted", o.samples, func(s int) {
			i := pickServices(c, 1, 500+s, live)[0]
			deleted[i] = true
			bi.proxy.DeleteService(types.NamespacedName{Namespace: gen.Namespace, Name: c.Services[i].Name})
			bi.proxy.DeleteEndpointSlice(c.Slices[i])
		}},
		{"100 endpoints changed", max(3, o.samples/5), func(s int) {
			for _, i := range pickServices(c, 100, 2000+s, live) {
				bi.proxy.UpdateEndpointSlice(c.ReplaceEndpoint(i, s))
			}
		}},
	}
	var out []Partial
	for _, sc := range scenarios {
		var runs []syncOnce
		for s := range sc.samples {
			sc.change(s)
			r, err := bi.sync(ctx, false)
			if err != nil {
				return nil, fmt.Errorf("partial sync %q: %w", sc.name, err)
			}
			runs = append(runs, r)
		}
		out = append(out, summarize(sc.name, runs))
	}
	return out, nil
}

// pickServices returns k distinct Service indexes chosen by a fixed stride from seed,
// skipping those keep refuses (nil keeps all).
func pickServices(c *gen.Cluster, k, seed int, keep func(int) bool) []int {
	n := len(c.Services)
	var out []int
	seen := map[int]bool{}
	for j := 0; len(out) < k && j < 4*n; j++ {
		i := int((uint64(seed)*7919 + uint64(j)*104729) % uint64(n))
		if seen[i] || (keep != nil && !keep(i)) {
			continue
		}
		seen[i] = true
		out = append(out, i)
	}
	return out
}

func summarize(name string, runs []syncOnce) Partial {
	var ms, nftMS, nlMS, userMS, sysMS []float64
	var ops []int
	netlink := 0
	var gcs uint64
	msOf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, r := range runs {
		netlink += r.netlink
		gcs += r.gcs
		ms = append(ms, msOf(r.elapsed))
		nftMS = append(nftMS, msOf(r.nft))
		nlMS = append(nlMS, msOf(r.netlinkTime))
		userMS = append(userMS, msOf(r.user))
		sysMS = append(sysMS, msOf(r.sys))
		ops = append(ops, r.ops)
	}
	for _, v := range [][]float64{ms, nftMS, nlMS, userMS, sysMS} {
		slices.Sort(v)
	}
	slices.Sort(ops)
	mid := len(ms) / 2
	return Partial{Name: name, Samples: len(runs), MedianMS: ms[mid], P90MS: ms[len(ms)*9/10],
		MaxMS: ms[len(ms)-1], NFTMedianMS: nftMS[mid], NetlinkMedianMS: nlMS[mid],
		UserMedianMS: userMS[mid], SysMedianMS: sysMS[mid], GCs: gcs,
		Operations: ops[len(ops)/2], NetlinkSyncs: netlink}
}

// childMulti runs o.instances instances, Service i on instance i mod o.instances, and
// fully syncs them at once, as a supervisor does at start.
func childMulti(ctx context.Context, o *childOptions) (*MultiResult, error) {
	c := gen.GenerateFamilies(o.services, o.endpoints, o.ipv6Percent)
	var insts []*benchInstance
	for k := range o.instances {
		bi, err := newInstance(fmt.Sprintf("bench-%c", 'a'+k), k, tables.LBRandom, o.fullSyncHook)
		if err != nil {
			return nil, err
		}
		bi.feed(c, func(i int) bool { return i%o.instances == k })
		insts = append(insts, bi)
	}
	res := &MultiResult{Instances: o.instances, Services: o.services}
	res.Memory.ObjectsRSSMB = rssMB()
	var wg sync.WaitGroup
	errs := make([]error, len(insts))
	each := make([]float64, len(insts))
	start := time.Now()
	for k, bi := range insts {
		wg.Go(func() {
			r, err := bi.sync(ctx, true)
			errs[k] = err
			each[k] = r.elapsed.Seconds()
		})
	}
	wg.Wait()
	res.WallSeconds = time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.InstanceSeconds = each
	res.Memory.fill()
	// The instances and the objects are what is being measured: keep them alive
	// through the GC in fill.
	runtime.KeepAlive(insts)
	runtime.KeepAlive(c)
	return res, nil
}

// childLoad programs o.services Services into the namespace it runs in, with Service 0
// (a ClusterIP Service on port 80) sent to the single endpoint o.target, and exits; the
// rules stay behind for the per-packet measurement.
func childLoad(ctx context.Context, o *childOptions) error {
	target, err := netip.ParseAddrPort(o.target)
	if err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	c := gen.GenerateFamilies(max(o.services, 1), o.endpoints, o.ipv6Percent)
	slice := c.Slices[0]
	slice.Endpoints = slice.Endpoints[:1]
	slice.Endpoints[0].Addresses = []string{target.Addr().String()}
	slice.Ports[0].Port = ptr.To(int32(target.Port()))
	if c.Services[0].Spec.Type != corev1.ServiceTypeClusterIP {
		return errors.New("Service 0 of the mix is not a ClusterIP Service")
	}
	bi, err := newInstance("bench", 0, tables.LBRandom, o.fullSyncHook)
	if err != nil {
		return err
	}
	bi.feed(c, func(int) bool { return true })
	_, err = bi.sync(ctx, true)
	return err
}

// rssMB reads a VmRSS/VmHWM-style field of /proc/self/status, in MiB.
// resetPeakRSS starts VmHWM again from the current RSS (Linux: "5" into clear_refs).
func resetPeakRSS() error {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("resetting the peak RSS: %w", err)
	}
	return nil
}

// rssMB is this process's resident set (VmRSS) in MB; 0 when /proc cannot be read.
func rssMB() float64 {
	m, _ := measure.ReadMemory(0)
	return float64(m.RSS) / (1 << 20)
}

// peakRSSMB is this process's peak resident set (VmHWM) in MB; 0 when /proc cannot be
// read.
func peakRSSMB() float64 {
	m, _ := measure.ReadMemory(0)
	return float64(m.PeakRSS) / (1 << 20)
}

// fill records the memory right after a full sync.
func (m *Memory) fill() {
	m.RSSMB = rssMB()
	m.PeakRSSMB = peakRSSMB()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.HeapInuseMB = float64(ms.HeapInuse) / (1 << 20)
}

// startProfile starts a CPU profile into dir/name; it returns the function that stops it.
func startProfile(dir, name string) func() {
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cpu profile:", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "cpu profile:", err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func writeHeapProfile(dir, name string) {
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		fmt.Fprintln(os.Stderr, "heap profile:", err)
		return
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, "heap profile:", err)
	}
}
