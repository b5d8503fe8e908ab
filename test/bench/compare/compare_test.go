package compare

import (
	"context"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/shardproxy/shardproxy/supervisor/config"
	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// A scrape with both proxies' labelling: kube-proxy by ip_family, shardproxy by instance
// and ip_family (its IPv6 series first, so that the order cannot pick the family).
const sampleScrape = `# TYPE kubeproxy_sync_partial_proxy_rules_duration_seconds histogram
kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_sync_partial_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 1.5
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_partial_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.01
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{proxy_instance="default",ip_family="IPv6",le="+Inf"} 9
kubeproxy_sync_partial_proxy_rules_duration_seconds_sum{proxy_instance="default",ip_family="IPv6"} 0.9
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{proxy_instance="default",ip_family="IPv6"} 9
kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{proxy_instance="default",ip_family="IPv4",le="+Inf"} 4
kubeproxy_sync_partial_proxy_rules_duration_seconds_sum{proxy_instance="default",ip_family="IPv4"} 0.08
kubeproxy_sync_partial_proxy_rules_duration_seconds_count{proxy_instance="default",ip_family="IPv4"} 4
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e9
`

func TestScrapeSelectsTheProxysSeries(t *testing.T) {
	sc, err := ParseScrape(sampleScrape)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		series Series
		want   Histogram
	}{
		{"kube-proxy's IPv4 proxier", Series{"ip_family": "IPv4"}, Histogram{Count: 3, Sum: 1.5}},
		{"a shardproxy instance's IPv4 table", Series{"proxy_instance": "default", "ip_family": "IPv4"}, Histogram{Count: 4, Sum: 0.08}},
		{"a series not observed yet is zero", Series{"proxy_instance": "team-a", "ip_family": "IPv4"}, Histogram{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sc.Histogram(metricPartialSync, tc.series); got != tc.want {
				t.Errorf("Histogram = %+v, want %+v", got, tc.want)
			}
		})
	}
	if v, ok := sc.Gauge(metricLastSync, Series{"ip_family": "IPv4"}); !ok || v != 1.7e9 {
		t.Errorf("Gauge = %v, %v; want 1.7e9, true", v, ok)
	}
	if _, ok := sc.Gauge(metricLastSync, Series{"proxy_instance": "default"}); ok {
		t.Error("Gauge of a missing series reported present")
	}
	if _, err := ParseScrape("not a metric line {"); err == nil {
		t.Error("a malformed scrape parsed without error")
	}
}

func TestHistogramDelta(t *testing.T) {
	d := Histogram{Count: 5, Sum: 2.5}.Sub(Histogram{Count: 3, Sum: 1.5})
	if d != (Histogram{Count: 2, Sum: 1}) || d.Mean() != 0.5 {
		t.Errorf("delta = %+v mean %v, want 2 observations of 0.5", d, d.Mean())
	}
	if (Histogram{}).Mean() != 0 {
		t.Error("the mean of nothing is not 0")
	}
}

func TestMedianAndRatios(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	s := ScaleResult{
		Upstream:   ProxyResult{FirstFullSyncSeconds: 30, PartialSyncMedianSeconds: 5, ProgrammingMedianSeconds: 8, PeakRSSMB: 480, StartToSyncedSeconds: 40},
		Shardproxy: ProxyResult{FirstFullSyncSeconds: 3, PartialSyncMedianSeconds: 0.01, ProgrammingMedianSeconds: 0.04, PeakRSSMB: 120, StartToSyncedSeconds: 8},
	}
	s.fillRatios()
	want := Ratios{FirstFullSync: 0.1, StartToSynced: 0.2, PartialSync: 0.002, Programming: 0.005, PeakRSS: 0.25}
	for name, pair := range map[string][2]float64{
		"first full sync": {s.Ratios.FirstFullSync, want.FirstFullSync}, "start to synced": {s.Ratios.StartToSynced, want.StartToSynced},
		"partial": {s.Ratios.PartialSync, want.PartialSync}, "programming": {s.Ratios.Programming, want.Programming}, "rss": {s.Ratios.PeakRSS, want.PeakRSS},
	} {
		if math.Abs(pair[0]-pair[1]) > 1e-9 {
			t.Errorf("%s ratio = %v, want %v", name, pair[0], pair[1])
		}
	}
	var b strings.Builder
	PrintTable(&b, &Report{Endpoints: 10, Scales: []ScaleResult{s}})
	if !strings.Contains(b.String(), "0.100") || !strings.Contains(b.String(), "30000.0") {
		t.Errorf("table lacks the first-sync figures and ratio:\n%s", b.String())
	}

	s.Also = []ProxyResult{{Proxy: "shardproxy@/work/main", PeakRSSMB: 240}}
	b.Reset()
	PrintTable(&b, &Report{Endpoints: 10, Scales: []ScaleResult{s}})
	if !strings.Contains(b.String(), "shardproxy@/work/main") || !regexp.MustCompile(`240\.0 +0\.500`).MatchString(b.String()) {
		t.Errorf("table lacks the -also build's column (peak RSS 240 MB, 0.5 of upstream):\n%s", b.String())
	}
}

// TestRetried: requests the apiserver timed out or was too busy for are sent again, up
// to five times; others fail at once.
func TestRetried(t *testing.T) {
	gr := schema.GroupResource{Resource: "services"}
	timeout := apierrors.NewTimeoutError("request did not complete within requested timeout", 0)
	for _, tc := range []struct {
		name      string
		errs      []error // returned by the attempts in turn; nil after the list
		wantCalls int
		wantErr   bool
	}{
		{"succeeds at once", nil, 1, false},
		{"a timeout, then success", []error{timeout}, 2, false},
		{"too busy and a conflict, then success", []error{apierrors.NewTooManyRequests("busy", 1), apierrors.NewConflict(gr, "svc", nil)}, 3, false},
		{"not transient", []error{apierrors.NewBadRequest("no")}, 1, true},
		{"always timing out", []error{timeout, timeout, timeout, timeout, timeout, timeout}, 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := retriedEvery(context.Background(), time.Millisecond, func() error {
				calls++
				if calls <= len(tc.errs) {
					return tc.errs[calls-1]
				}
				return nil
			})
			if calls != tc.wantCalls || (err != nil) != tc.wantErr {
				t.Errorf("%d calls, error %v; want %d calls, error %v", calls, err, tc.wantCalls, tc.wantErr)
			}
		})
	}
}

// TestFamilies: a cluster's changes are read in their Service's family, and the first
// full sync waits for the families the cluster has.
func TestFamilies(t *testing.T) {
	for _, tc := range []struct {
		percent int
		want    []string
	}{{0, []string{ipv4}}, {50, []string{ipv4, ipv6}}, {100, []string{ipv6}}} {
		m := &measurer{cluster: gen.GenerateFamilies(100, 1, tc.percent)}
		if got := m.families(); !slices.Equal(got, tc.want) {
			t.Errorf("%d%% IPv6: families %v, want %v", tc.percent, got, tc.want)
		}
		for i := range m.cluster.Services {
			want := string(m.cluster.Services[i].Spec.IPFamilies[0])
			if got := m.family(i); got != want {
				t.Errorf("%d%% IPv6: Service %d read in %s, want %s", tc.percent, i, got, want)
			}
		}
	}
	d := &daemon{series: Series{"proxy_instance": "default", "ip_family": ipv4}}
	if got := d.in(ipv6); got["ip_family"] != ipv6 || got["proxy_instance"] != "default" || d.series["ip_family"] != ipv4 {
		t.Errorf("in(IPv6) = %v (series now %v)", got, d.series)
	}
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions([]string{"-scales", "100, 2000", "-samples", "3", "-also", "../a, ../b"})
	if err != nil || len(o.Scales) != 2 || o.Scales[1] != 2000 || o.Samples != 3 || len(o.Also) != 2 || o.Also[1] != "../b" {
		t.Errorf("parseOptions = %+v, %v", o, err)
	}
	if o, err := parseOptions([]string{"-serve-percent", "10"}); err != nil || o.ServePercent != 10 {
		t.Errorf("parseOptions(-serve-percent 10) = %+v, %v", o, err)
	}
	if o, err := parseOptions([]string{"-ipv6-percent", "50", "-clients", "64"}); err != nil || o.IPv6Percent != 50 || o.Clients != 64 {
		t.Errorf("parseOptions(-ipv6-percent 50 -clients 64) = %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-scales", "10,x"}, {"-scales", "0"}, {"-samples", "0"}, {"-serve-percent", "-1"}, {"-serve-percent", "101"},
		{"-ipv6-percent", "-1"}, {"-ipv6-percent", "101"}, {"-clients", "0"}, {"-seed", "disk"}} {
		if _, err := parseOptions(bad); err == nil {
			t.Errorf("parseOptions(%v) accepted", bad)
		}
	}
}

// TestServedTable: with -serve-percent the table has the share's two columns and the
// ratios of the served share's peak RSS to upstream's and to the share alone.
func TestServedTable(t *testing.T) {
	s := ScaleResult{Services: 30000, Endpoints: 150000, ServePercent: 10,
		Upstream: ProxyResult{PeakRSSMB: 800}, Shardproxy: ProxyResult{PeakRSSMB: 300},
		Served: &ProxyResult{Proxy: servedName, PeakRSSMB: 60}, ServedOnly: &ProxyResult{Proxy: servedOnlyName, PeakRSSMB: 50}}
	s.fillRatios()
	if math.Abs(s.Ratios.ServedPeakRSSVsOnly-1.2) > 1e-9 || math.Abs(s.Ratios.ServedPeakRSS-0.075) > 1e-9 || math.Abs(s.Ratios.PeakRSS-0.375) > 1e-9 {
		t.Errorf("ratios %+v, want peak RSS 0.375 of upstream serving all, 0.075 serving the share, 1.2 of the share alone", s.Ratios)
	}
	var b strings.Builder
	PrintTable(&b, &Report{Endpoints: 5, Scales: []ScaleResult{s}})
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`peak RSS \(MB\) +800\.0 +300\.0 +0\.375 +60\.0 +0\.075 +50\.0 +0\.062`),
		regexp.MustCompile(`share served / shardproxy, share only: 1\.200`),
		regexp.MustCompile(`the 10% of the Services labelled bench-served`),
	} {
		if !want.MatchString(b.String()) {
			t.Errorf("table lacks %s:\n%s", want, b.String())
		}
	}
}

// TestShardproxyInstances: both instance configurations are valid supervisor configs,
// and the served one selects gen.ServedProxyName.
func TestShardproxyInstances(t *testing.T) {
	for _, served := range []bool{false, true} {
		yaml := "apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\nnodeName: node-1\ninstances:" +
			strings.ReplaceAll(shardproxyInstances(time.Second, served), "\n", "\n  ")
		c, err := config.Decode([]byte(yaml), "bench")
		if err != nil {
			t.Fatalf("served %v: %v\n%s", served, err, yaml)
		}
		c.Default()
		if err := c.Validate(); err != nil {
			t.Fatalf("served %v: %v\n%s", served, err, yaml)
		}
		in := c.Instances[0]
		if in.Name != instanceName(served) || in.Default == served || served && (len(in.ProxyNames) != 1 || in.ProxyNames[0] != gen.ServedProxyName) {
			t.Errorf("served %v: instance %+v", served, in)
		}
	}
}
