package fleet

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/shardproxy/shardproxy/test/measure"
)

// Counts are counters by a key ("verb resource", "resource", ...).
type Counts map[string]float64

// Sub returns c - before, key by key (a key missing before counts from 0).
func (c Counts) Sub(before Counts) Counts {
	out := Counts{}
	for k, v := range c {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Total sums every key.
func (c Counts) Total() float64 {
	var t float64
	for _, v := range c {
		t += v
	}
	return t
}

// Scale returns c with every value multiplied by k (bytes to KB: 1.0/1024).
func (c Counts) Scale(k float64) Counts {
	out := Counts{}
	for key, v := range c {
		out[key] = v * k
	}
	return out
}

// Top formats the n largest keys as rates over d: "watch services 12.3/s, ...".
func (c Counts) Top(n int, d time.Duration) string {
	keys := slices.Collect(maps.Keys(c))
	slices.SortFunc(keys, func(a, b string) int {
		if c[a] != c[b] {
			if c[a] > c[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for i, k := range keys {
		if i == n {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f/s", k, c[k]/d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

// APIServerCounters are the kube-apiserver counters a run reads before and after.
type APIServerCounters struct {
	// Requests by "verb resource" (apiserver_request_total).
	Requests Counts
	// WatchEvents sent to watchers by resource (apiserver_watch_events_total).
	WatchEvents Counts
	// WatchBytes sent to watchers by resource: the sum of apiserver_watch_events_sizes,
	// which observes each event's encoded bytes as written to each watcher's stream (one
	// event to N watchers counts N times).
	WatchBytes Counts
	// EtcdWrites by "operation type" (etcd_requests_total, create/update/delete only).
	EtcdWrites Counts
	// Watches are the watches open now by resource (apiserver_longrunning_requests, a
	// gauge: Sub leaves it as it is after).
	Watches Counts
}

// Sub returns a - before.
func (a APIServerCounters) Sub(before APIServerCounters) APIServerCounters {
	return APIServerCounters{Requests: a.Requests.Sub(before.Requests), WatchEvents: a.WatchEvents.Sub(before.WatchEvents),
		WatchBytes: a.WatchBytes.Sub(before.WatchBytes), EtcdWrites: a.EtcdWrites.Sub(before.EtcdWrites), Watches: a.Watches}
}

// etcdWriteOperations are etcd_requests_total's operations that write to etcd.
var etcdWriteOperations = map[string]bool{"create": true, "update": true, "delete": true, "GuaranteedUpdate": true}

// ParseAPIServerMetrics reads kube-apiserver's /metrics text.
func ParseAPIServerMetrics(r io.Reader) (APIServerCounters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return APIServerCounters{}, fmt.Errorf("parsing kube-apiserver metrics: %w", err)
	}
	out := APIServerCounters{Requests: Counts{}, WatchEvents: Counts{}, WatchBytes: Counts{}, EtcdWrites: Counts{}, Watches: Counts{}}
	for name, fam := range families {
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			v := m.GetCounter().GetValue()
			switch name {
			case "apiserver_request_total":
				out.Requests[labels["verb"]+" "+labels["resource"]] += v
			case "apiserver_watch_events_total":
				res := labels["resource"]
				if res == "" {
					res = labels["kind"] // before 1.32
				}
				out.WatchEvents[res] += v
			case "apiserver_watch_events_sizes":
				out.WatchBytes[labels["resource"]] += m.GetHistogram().GetSampleSum()
			case "apiserver_longrunning_requests":
				if labels["verb"] == "WATCH" {
					out.Watches[labels["resource"]] += m.GetGauge().GetValue()
				}
			case "etcd_requests_total":
				if etcdWriteOperations[labels["operation"]] {
					out.EtcdWrites[labels["operation"]+" "+labels["type"]] += v
				}
			}
		}
	}
	return out, nil
}

// ProcStat is one reading of a process's CPU time, resident set and peak resident set.
type ProcStat struct {
	CPU     time.Duration
	RSS     int64 // bytes (VmRSS)
	PeakRSS int64 // bytes (VmHWM)
}

// ReadProc reads /proc/<pid>/stat and /proc/<pid>/status.
func ReadProc(pid int) (ProcStat, error) {
	st, err := measure.ReadStat(pid)
	if err != nil {
		return ProcStat{}, err
	}
	m, err := measure.ReadMemory(pid)
	if err != nil {
		return ProcStat{}, err
	}
	return ProcStat{CPU: st.CPU, RSS: m.RSS, PeakRSS: m.PeakRSS}, nil
}

// RequestCounter counts a client's requests by "verb resource", the way the
// apiserver's apiserver_request_total names them, so the proxies' own requests can be
// told from the driver's.
type RequestCounter struct {
	mu     sync.Mutex
	counts Counts
}

// NewRequestCounter returns an empty counter.
func NewRequestCounter() *RequestCounter { return &RequestCounter{counts: Counts{}} }

// Wrap is a rest.Config WrapTransport.
func (c *RequestCounter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		verb, resource := Classify(req)
		c.mu.Lock()
		c.counts[verb+" "+resource]++
		c.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

// Snapshot returns a copy of the counts.
func (c *RequestCounter) Snapshot() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Classify names a request's verb (get, list, watch, create, update, patch, delete) and
// resource ("configmaps", "nodes/status") from its method and path.
func Classify(req *http.Request) (verb, resource string) {
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return strings.ToLower(req.Method), "/" + strings.Join(segs, "/")
	}
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	if len(segs) == 0 {
		return strings.ToLower(req.Method), ""
	}
	resource = segs[0]
	named := len(segs) >= 2
	if len(segs) >= 3 {
		resource += "/" + segs[2]
	}
	q := req.URL.Query()
	switch req.Method {
	case http.MethodGet:
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}
