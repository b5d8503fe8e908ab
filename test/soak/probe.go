package soak

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardproxy/shardproxy/test/netns"
)

// probe is one client loop to a steady Service: a new connection (or UDP exchange) every
// interval, each answer checked to come from one of the Service's endpoints.
type probe struct {
	name, ns, proto, addr string
	port                  int
	servers               []string

	mu     sync.Mutex
	ok     int
	failed int
	errs   []string
}

// prober runs the steady probes. Faults that make the kernel drop new flows on purpose
// (a full conntrack table) hold pause while they last: what they do to traffic is the
// kernel's doing, not the proxy's, and is reported apart.
type prober struct {
	tp       *netns.Topology
	interval time.Duration
	probes   []*probe
	pause    sync.RWMutex
	stop     chan struct{}
	wg       sync.WaitGroup

	pausedMu sync.Mutex
	paused   time.Duration
}

func (p *prober) start() {
	p.stop = make(chan struct{})
	for _, pr := range p.probes {
		p.wg.Add(1)
		go p.loop(pr)
	}
}

func (p *prober) loop(pr *probe) {
	defer p.wg.Done()
	ticker := time.NewTicker(p.interval)
	defer ticker.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-ticker.C:
		}
		p.pause.RLock()
		r, err := p.tp.DialWith(pr.ns, pr.proto, pr.addr, pr.port, netns.DialOptions{Timeout: 2 * time.Second})
		p.pause.RUnlock()
		if err == nil && !slices.Contains(pr.servers, r.Server) {
			err = fmt.Errorf("answered by %q, not by an endpoint of the Service", r.Server)
		}
		pr.mu.Lock()
		if err != nil {
			pr.failed++
			if len(pr.errs) < 10 {
				pr.errs = append(pr.errs, stamp()+" "+err.Error())
			}
		} else {
			pr.ok++
		}
		pr.mu.Unlock()
	}
}

// Pause stops new probes until the returned function is called; probes in flight end
// first.
func (p *prober) Pause() (resume func()) {
	p.pause.Lock()
	start := time.Now()
	return func() {
		p.pausedMu.Lock()
		p.paused += time.Since(start)
		p.pausedMu.Unlock()
		p.pause.Unlock()
	}
}

// Stop ends the loops.
func (p *prober) Stop() {
	close(p.stop)
	p.wg.Wait()
}

// probeResult is what one probe saw.
type probeResult struct {
	Name       string
	OK, Failed int
	Errors     []string
}

// Results returns each probe's counts so far.
func (p *prober) Results() []probeResult {
	var out []probeResult
	for _, pr := range p.probes {
		pr.mu.Lock()
		out = append(out, probeResult{Name: pr.name, OK: pr.ok, Failed: pr.failed, Errors: slices.Clone(pr.errs)})
		pr.mu.Unlock()
	}
	return out
}

// Paused is how long the probes were held by faults.
func (p *prober) Paused() time.Duration {
	p.pausedMu.Lock()
	defer p.pausedMu.Unlock()
	return p.paused
}

// stamp is the wall-clock time for log lines.
func stamp() string { return time.Now().Format("15:04:05.000") }
