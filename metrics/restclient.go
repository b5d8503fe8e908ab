package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// restClientMetrics are client-go's request series as kube-proxy exposes them
// (k8s.io/component-base/metrics/prometheus/restclient, v0.36): same names, labels and
// buckets, so the dashboards and alerts that watch a proxy's load on the apiserver keep
// working. They are fed by a transport wrapper (InstrumentTransport) on the supervisor's
// own client instead of client-go's process-global metric hooks, which would make
// several Metrics in one process (tests) share and clobber one set of adapters.
type restClientMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newRESTClientMetrics(m *Metrics) restClientMetrics {
	return restClientMetrics{
		requests: nodeWide(m, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_requests_total",
			Help: "Number of HTTP requests, partitioned by status code, method, and host.",
		}, []string{"code", "method", "host"})),
		latency: nodeWide(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rest_client_request_duration_seconds",
			Help:    "Request latency in seconds. Broken down by verb, and host.",
			Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0},
		}, []string{"verb", "host"})),
	}
}

// InstrumentTransport wraps an API client's transport (rest.Config.Wrap) so that
// every request it sends is counted in rest_client_requests_total and timed, up to
// the response headers, in rest_client_request_duration_seconds. A request that gets
// no response is counted with code "<error>", as client-go does. A watch counts once,
// when it is opened.
func (m *Metrics) InstrumentTransport(rt http.RoundTripper) http.RoundTripper {
	return instrumentedTransport{next: rt, m: m.rest}
}

type instrumentedTransport struct {
	next http.RoundTripper
	m    restClientMetrics
}

// RoundTrip implements http.RoundTripper.
func (t instrumentedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	code := "<error>"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	host := req.URL.Host
	t.m.requests.WithLabelValues(code, req.Method, host).Inc()
	t.m.latency.WithLabelValues(req.Method, host).Observe(time.Since(start).Seconds())
	return resp, err
}
