package env

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics scrapes the supervisor's /metrics.
func (e *Env) Metrics(ctx context.Context) (Metrics, error) {
	code, body, err := e.HTTPGet(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", MetricsPort))
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics answered %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	return Metrics(fams), nil
}

// Metrics are parsed metric families by name.
type Metrics map[string]*dto.MetricFamily

// Value returns the value of the named counter, gauge, or histogram (its sample count)
// whose labels include every given name=value pair, summed over matching series.
func (m Metrics) Value(name string, labels ...string) float64 {
	fam, ok := m[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, met := range fam.GetMetric() {
		if !hasLabels(met, labels) {
			continue
		}
		switch {
		case met.Counter != nil:
			sum += met.GetCounter().GetValue()
		case met.Gauge != nil:
			sum += met.GetGauge().GetValue()
		case met.Histogram != nil:
			sum += float64(met.GetHistogram().GetSampleCount())
		case met.Untyped != nil:
			sum += met.GetUntyped().GetValue()
		}
	}
	return sum
}

// Has reports whether the named family exists.
func (m Metrics) Has(name string) bool { _, ok := m[name]; return ok }

func hasLabels(met *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range met.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// CLI runs the shardproxy binary inside the node namespace (as an operator on the node
// would) and returns its combined output.
func (e *Env) CLI(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", e.TP.Node, e.Binary}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("shardproxy %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// Loop opens connections in a tight loop from one namespace to one address until Stop,
// counting successes and failures: the client of the disruption scenarios.
type Loop struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	ok      int
	failed  int
	servers map[string]int
	errs    []string
}

// StartLoop starts a client loop from ns to addr:port over proto.
func (e *Env) StartLoop(ns, proto, addr string, port int) *Loop {
	l := &Loop{stop: make(chan struct{}), done: make(chan struct{}), servers: map[string]int{}}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			r, err := e.TP.Dial(ns, proto, addr, port)
			l.mu.Lock()
			if err != nil {
				l.failed++
				if len(l.errs) < 5 {
					l.errs = append(l.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
				}
			} else {
				l.ok++
				l.servers[r.Server]++
			}
			l.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return l
}

// LoopResult is what a loop saw.
type LoopResult struct {
	OK, Failed int
	// Servers counts answers per server name.
	Servers map[string]int
	// Errors are the first few failures.
	Errors []string
}

func (r LoopResult) String() string {
	var names []string
	for n, c := range r.Servers {
		names = append(names, fmt.Sprintf("%s=%d", n, c))
	}
	sort.Strings(names)
	return fmt.Sprintf("%d connections, %d failed (%s)", r.OK+r.Failed, r.Failed, strings.Join(names, " "))
}

// Snapshot returns the counts so far without stopping.
func (l *Loop) Snapshot() LoopResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := map[string]int{}
	for k, v := range l.servers {
		s[k] = v
	}
	return LoopResult{OK: l.ok, Failed: l.failed, Servers: s, Errors: append([]string(nil), l.errs...)}
}

// Stop ends the loop and returns its counts.
func (l *Loop) Stop() LoopResult {
	close(l.stop)
	<-l.done
	return l.Snapshot()
}
