package compare

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The metric names both proxies export (shardproxy keeps kube-proxy's).
const (
	metricFullSync    = "kubeproxy_sync_full_proxy_rules_duration_seconds"
	metricPartialSync = "kubeproxy_sync_partial_proxy_rules_duration_seconds"
	metricProgramming = "kubeproxy_network_programming_duration_seconds"
	metricLastSync    = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
)

// Series picks one proxy's series out of a scrape by label values: kube-proxy labels
// them by ip_family, shardproxy by instance and ip_family. Every label must match.
type Series map[string]string

// Histogram is one histogram series' count and sum.
type Histogram struct {
	Count uint64
	Sum   float64
}

// Sub returns h - prev: what was observed in between.
func (h Histogram) Sub(prev Histogram) Histogram {
	return Histogram{Count: h.Count - prev.Count, Sum: h.Sum - prev.Sum}
}

// Mean is the mean observation, 0 without any.
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / float64(h.Count)
}

// Scrape is a parsed /metrics page.
type Scrape map[string]*dto.MetricFamily

// ParseScrape parses the Prometheus text format.
func ParseScrape(text string) (Scrape, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return Scrape(fams), nil
}

// Histogram returns the series of histogram name selected by s (zero if absent: a
// labelled histogram has no series before its first observation).
func (sc Scrape) Histogram(name string, s Series) Histogram {
	m := sc.metric(name, s)
	if m == nil || m.GetHistogram() == nil {
		return Histogram{}
	}
	return Histogram{Count: m.GetHistogram().GetSampleCount(), Sum: m.GetHistogram().GetSampleSum()}
}

// Gauge returns the gauge name selected by s, and whether it exists.
func (sc Scrape) Gauge(name string, s Series) (float64, bool) {
	m := sc.metric(name, s)
	if m == nil || m.GetGauge() == nil {
		return 0, false
	}
	return m.GetGauge().GetValue(), true
}

func (sc Scrape) metric(name string, s Series) *dto.Metric {
	fam := sc[name]
	if fam == nil {
		return nil
	}
	for _, m := range fam.GetMetric() {
		matched := 0
		for _, l := range m.GetLabel() {
			if v, ok := s[l.GetName()]; ok && v == l.GetValue() {
				matched++
			}
		}
		if matched == len(s) {
			return m
		}
	}
	return nil
}
