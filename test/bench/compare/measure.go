package compare

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/shardproxy/shardproxy/test/bench"
	"github.com/shardproxy/shardproxy/test/bench/gen"
	"github.com/shardproxy/shardproxy/test/e2e/env"
	"github.com/shardproxy/shardproxy/test/measure"
)

// The values of the ip_family label.
const (
	ipv4 = "IPv4"
	ipv6 = "IPv6"
)

// daemon is one proxy process under measurement.
type daemon struct {
	name string
	// series selects the proxy's series (kube-proxy's IPv4 ones; for shardproxy, its
	// instance's); in picks another family's.
	series     Series
	metricsURL string
	// heapURL serves the daemon's Go heap profile ("": none).
	heapURL string
	// profileTag tells this daemon's heap profile from the others' of its scale.
	profileTag string
	start      func() error
	stop       func() error
	pid        func() int
	logTail    func() string
}

// in returns d's series of IP family fam.
func (d *daemon) in(fam string) Series {
	s := maps.Clone(d.series)
	s["ip_family"] = fam
	return s
}

// measurer runs the same measurements against each proxy of one environment.
type measurer struct {
	r       *runner
	e       *env.Env
	client  kubernetes.Interface
	cluster *gen.Cluster
	// changes counts the endpoint changes made so far, so each proxy's samples change
	// different Services.
	changes int
	// served are the indices of the Services the proxy serves (nil: all of them).
	served []int
}

// measure starts d, waits for its first full sync, then changes one endpoint of one
// Service at a time, each after the proxy has been idle for longer than the minimum
// sync period (so each change is synced at once, on its own), and reads each sample's
// partial sync time and network programming latency from the difference of two
// scrapes. It stops d at the end.
func (m *measurer) measure(ctx context.Context, d *daemon) (ProxyResult, error) {
	res := ProxyResult{Proxy: d.name}
	// The apiserver settles after the objects are created, and the kernel tears down the
	// previous proxy's tables in the background: neither should land on this proxy.
	waited, quiet := bench.WaitQuiet(ctx, 2*time.Minute)
	m.r.logf("%s: starting (machine quiet after %.1fs: %v)", d.name, waited.Seconds(), quiet)
	started := time.Now()
	if err := d.start(); err != nil {
		return res, err
	}
	defer func() {
		if err := d.stop(); err != nil {
			m.r.logf("%s: stopping: %v", d.name, err)
		}
	}()
	fail := func(err error) (ProxyResult, error) {
		return res, fmt.Errorf("%s: %w; log:\n%s", d.name, err, d.logTail())
	}

	peak := m.newPeakHeap(d)
	err := m.firstFullSync(ctx, d, started, peak, &res)
	if err != nil {
		return fail(err)
	}
	if res.FirstSyncPeakRSSMB, err = peakRSSMB(d.pid()); err != nil {
		return fail(err)
	}
	m.r.logf("%s: first full sync %.3fs (%.1fs after start), peak RSS so far %.1f MB", d.name, res.FirstFullSyncSeconds, res.StartToSyncedSeconds, res.FirstSyncPeakRSSMB)
	if err := peak.save(); err != nil {
		m.r.logf("%s: peak heap profile: %v", d.name, err)
	}
	if err := m.heapProfile(ctx, d); err != nil {
		m.r.logf("%s: heap profile: %v", d.name, err)
	}

	for i := range m.r.o.Samples {
		// Idle for longer than the minimum sync period: the change syncs at once.
		time.Sleep(m.r.o.MinSyncPeriod + 200*time.Millisecond)
		before, err := m.scrape(ctx, d)
		if err != nil {
			return fail(err)
		}
		svc := m.nextService()
		if err := m.changeEndpoint(ctx, svc); err != nil {
			return fail(err)
		}
		// The change is programmed, and timed, in its Service's family.
		series := d.in(m.family(svc))
		after, err := m.waitFor(ctx, d, fmt.Sprintf("the change of %s", gen.ServiceName(svc)), func(sc Scrape) bool {
			return sc.Histogram(metricProgramming, series).Count > before.Histogram(metricProgramming, series).Count
		})
		if err != nil {
			return fail(err)
		}
		partial := after.Histogram(metricPartialSync, series).Sub(before.Histogram(metricPartialSync, series))
		prog := after.Histogram(metricProgramming, series).Sub(before.Histogram(metricProgramming, series))
		if partial.Count == 0 {
			// A periodic full sync took the change; it is not a partial sync sample.
			m.r.logf("%s: sample %d was programmed by a full sync; not counted as a partial sync", d.name, i)
		} else {
			res.PartialSyncSeconds = append(res.PartialSyncSeconds, partial.Mean())
		}
		res.ProgrammingSeconds = append(res.ProgrammingSeconds, prog.Mean())
		m.r.logf("%s: sample %d (%s): partial sync %.1fms, network programming %.1fms", d.name, i, m.family(svc), partial.Mean()*1e3, prog.Mean()*1e3)
	}
	res.PartialSyncMedianSeconds = median(res.PartialSyncSeconds)
	res.PartialSyncP90Seconds = measure.Percentile(res.PartialSyncSeconds, 90)
	res.ProgrammingMedianSeconds = median(res.ProgrammingSeconds)
	res.ProgrammingP90Seconds = measure.Percentile(res.ProgrammingSeconds, 90)
	if m.r.o.ChurnDuration > 0 {
		c, err := m.churn(ctx, d)
		if err != nil {
			return fail(fmt.Errorf("churn: %w", err))
		}
		res.Churn = &c
	}
	res.PeakRSSMB, err = peakRSSMB(d.pid())
	if err != nil {
		return fail(err)
	}
	// The kernel's high-water mark lags (it is folded in at some points only, and a read
	// adds the current RSS): a later read can be below an earlier one.
	res.PeakRSSMB = max(res.PeakRSSMB, res.FirstSyncPeakRSSMB)
	return res, nil
}

// firstFullSync waits for d's first full sync of every family the cluster has (peak
// watching the heap meanwhile), and records its duration (the slowest family's: they are synced side by side) and the
// time from start until the last family had synced.
func (m *measurer) firstFullSync(ctx context.Context, d *daemon, started time.Time, peak *peakHeap, res *ProxyResult) error {
	fams := m.families()
	sc, err := m.waitFor(ctx, d, "the first full sync", func(sc Scrape) bool {
		peak.observe(ctx, sc)
		for _, fam := range fams {
			_, synced := sc.Gauge(metricLastSync, d.in(fam))
			if !synced || sc.Histogram(metricFullSync, d.in(fam)).Count < 1 {
				return false
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	for _, fam := range fams {
		res.FirstFullSyncSeconds = max(res.FirstFullSyncSeconds, sc.Histogram(metricFullSync, d.in(fam)).Mean())
		last, _ := sc.Gauge(metricLastSync, d.in(fam))
		res.StartToSyncedSeconds = max(res.StartToSyncedSeconds, last-float64(started.UnixNano())/1e9)
	}
	return nil
}

// families are the IP families of the generated Services, as the ip_family label
// spells them.
func (m *measurer) families() []string {
	switch m.cluster.IPv6Percent {
	case 0:
		return []string{ipv4}
	case 100:
		return []string{ipv6}
	}
	return []string{ipv4, ipv6}
}

// family is the IP family of Service i.
func (m *measurer) family(i int) string {
	if m.cluster.IsIPv6(i) {
		return ipv6
	}
	return ipv4
}

// nextService picks the Service of the next change, spread over the whole cluster.
func (m *measurer) nextService() int {
	m.changes++
	if m.served != nil {
		return m.served[(m.changes*7919)%len(m.served)]
	}
	return (m.changes * 7919) % len(m.cluster.Services)
}

// changeEndpoint replaces one endpoint of Service i's slice with a new pod, stamped with
// the trigger time the endpointslice controller would set.
func (m *measurer) changeEndpoint(ctx context.Context, i int) error {
	fresh := m.cluster.ReplaceEndpoint(i, m.changes)
	slices := m.client.DiscoveryV1().EndpointSlices(gen.Namespace)
	cur, err := slices.Get(ctx, fresh.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading EndpointSlice %s: %w", fresh.Name, err)
	}
	cur.Endpoints = fresh.Endpoints
	onThisNode(cur.Endpoints)
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[corev1.EndpointsLastChangeTriggerTime] = time.Now().Format(time.RFC3339Nano)
	if _, err := slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating EndpointSlice %s: %w", fresh.Name, err)
	}
	return nil
}

func (m *measurer) scrape(ctx context.Context, d *daemon) (Scrape, error) {
	code, body, err := m.e.HTTPGet(ctx, d.metricsURL)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d", d.metricsURL, code)
	}
	return ParseScrape(body)
}

// waitFor scrapes d every 50ms until cond holds, within the sync timeout.
func (m *measurer) waitFor(ctx context.Context, d *daemon, what string, cond func(Scrape) bool) (Scrape, error) {
	deadline := time.Now().Add(m.r.o.SyncTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		if d.pid() == 0 {
			return nil, fmt.Errorf("exited while waiting for %s", what)
		}
		sc, err := m.scrape(ctx, d)
		if err == nil && cond(sc) {
			return sc, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("no %s within %s (last scrape error: %v)", what, m.r.o.SyncTimeout, lastErr)
}

// peakRSSMB reads a process's peak resident set size (VmHWM) in MB.
func peakRSSMB(pid int) (float64, error) {
	if pid == 0 {
		return 0, fmt.Errorf("process not running")
	}
	m, err := measure.ReadMemory(pid)
	if err != nil {
		return 0, err
	}
	return float64(m.PeakRSS) / (1 << 20), nil
}

// heapProfile saves d's heap profile into Options.HeapProfileDir (when both are set).
func (m *measurer) heapProfile(ctx context.Context, d *daemon) error {
	if m.r.o.HeapProfileDir == "" || d.heapURL == "" {
		return nil
	}
	code, body, err := m.e.HTTPGet(ctx, d.heapURL) // in the node's namespace
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d", d.heapURL, code)
	}
	if err := os.MkdirAll(m.r.o.HeapProfileDir, 0o755); err != nil {
		return err
	}
	return m.writeProfile(d, "", body)
}

// writeProfile writes one of d's profiles into Options.HeapProfileDir as
// heap-N[-tag][-kind].pprof.
func (m *measurer) writeProfile(d *daemon, kind, body string) error {
	path := m.heapFile(d, kind, ".pprof")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return err
	}
	m.r.logf("%s: heap profile in %s", d.name, path)
	return nil
}

// heapFile is the path in Options.HeapProfileDir of d's file heap-N[-tag][-kind]ext.
func (m *measurer) heapFile(d *daemon, kind, ext string) string {
	name := fmt.Sprintf("heap-%d", len(m.cluster.Services))
	for _, part := range []string{d.profileTag, kind} {
		if part != "" {
			name += "-" + part
		}
	}
	return filepath.Join(m.r.o.HeapProfileDir, name+ext)
}

// peakHeap keeps a daemon's heap profile from the top of its first full sync: each time
// the heap in use (go_memstats_heap_alloc_bytes) passes its high by a tenth, the profile
// is read again, without a collection. Its in-use figures are the live heap of the
// collection before (what the runtime sized the heap's next growth on), and its
// allocation figures everything allocated since the start: with the profile taken after
// the sync, what was live at the peak and what was transient.
type peakHeap struct {
	m    *measurer
	d    *daemon
	high float64
	body string
	// series logs the heap in use and the resident set at each scrape (heap-N-series.txt).
	series strings.Builder
	start  time.Time
}

func (m *measurer) newPeakHeap(d *daemon) *peakHeap {
	if m.r.o.HeapProfileDir == "" || d.heapURL == "" {
		return nil
	}
	return &peakHeap{m: m, d: d, start: time.Now()}
}

func (p *peakHeap) observe(ctx context.Context, sc Scrape) {
	if p == nil {
		return
	}
	heap, ok := sc.Gauge("go_memstats_heap_alloc_bytes", Series{})
	rss, _ := sc.Gauge("process_resident_memory_bytes", Series{})
	fmt.Fprintf(&p.series, "%.2f s\theap %.1f MB\tRSS %.1f MB", time.Since(p.start).Seconds(), heap/1e6, rss/1e6)
	for _, g := range []struct{ name, metric string }{{"spans in use", "go_memstats_heap_inuse_bytes"},
		{"idle", "go_memstats_heap_idle_bytes"}, {"released", "go_memstats_heap_released_bytes"},
		{"stacks", "go_memstats_stack_inuse_bytes"}} {
		v, _ := sc.Gauge(g.metric, Series{})
		fmt.Fprintf(&p.series, "\t%s %.1f MB", g.name, v/1e6)
	}
	goroutines, _ := sc.Gauge("go_goroutines", Series{})
	fmt.Fprintf(&p.series, "\tgoroutines %.0f\n", goroutines)
	if !ok || heap < p.high*1.1 {
		return
	}
	p.high = heap
	code, body, err := p.m.e.HTTPGet(ctx, strings.TrimSuffix(p.d.heapURL, "?gc=1"))
	if err == nil && code == http.StatusOK {
		p.body = body
	}
}

func (p *peakHeap) save() error {
	if p == nil || p.body == "" {
		return nil
	}
	p.m.r.logf("%s: heap in use at most %.1f MB during the first full sync", p.d.name, p.high/1e6)
	if err := os.MkdirAll(p.m.r.o.HeapProfileDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p.m.heapFile(p.d, "series", ".txt"), []byte(p.series.String()), 0o644); err != nil {
		return err
	}
	return p.m.writeProfile(p.d, "peak", p.body)
}
