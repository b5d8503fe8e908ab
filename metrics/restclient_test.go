package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestInstrumentTransport: each request through the wrapped transport is counted by
// code, method and host, as kube-proxy's rest_client series count them, and timed.
func TestInstrumentTransport(t *testing.T) {
	m := New()
	rt := m.InstrumentTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
		switch r.URL.Path {
		case "/fail":
			return nil, errors.New("connection refused")
		case "/missing":
			return &http.Response{StatusCode: http.StatusNotFound, Body: http.NoBody}, nil
		}
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	}))
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/ok"},
		{http.MethodGet, "/ok"},
		{http.MethodPut, "/ok"},
		{http.MethodGet, "/missing"},
		{http.MethodPost, "/fail"},
	} {
		req := httptest.NewRequest(tc.method, "https://10.96.0.1:443"+tc.path, nil)
		if resp, err := rt.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	for _, tc := range []struct {
		code, method string
		want         float64
	}{
		{"200", "GET", 2},
		{"200", "PUT", 1},
		{"404", "GET", 1},
		{"<error>", "POST", 1},
		{"200", "POST", 0},
	} {
		got := testutil.ToFloat64(m.rest.requests.WithLabelValues(tc.code, tc.method, "10.96.0.1:443"))
		if got != tc.want {
			t.Errorf("rest_client_requests_total{code=%q,method=%q}: got %v, want %v", tc.code, tc.method, got, tc.want)
		}
	}
	if got := testutil.CollectAndCount(m.rest.latency); got != 3 { // GET, PUT, POST
		t.Errorf("rest_client_request_duration_seconds: %d series, want 3", got)
	}
	problems, err := testutil.GatherAndLint(m.Registry(), "rest_client_requests_total", "rest_client_request_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if !strings.Contains(p.Text, "unit") { // upstream's names, kept as they are
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
}
