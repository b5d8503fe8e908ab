package deploy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/shardproxy/shardproxy/metrics"
)

// runbooksFile is where every alert's runbook is, one section per alert.
const runbooksFile = "../docs/runbooks.md"

// runbookURLPrefix is how every runbook_url starts; the anchor is the section's.
const runbookURLPrefix = "https://github.com/shardproxy/shardproxy/blob/main/docs/runbooks.md#"

// releaseLabel is the label kube-prometheus-stack's default ruleSelector and
// podMonitorSelector match (release: <the Helm release>), set to the chart's usual
// release name.
var releaseLabel = map[string]string{"release": "kube-prometheus-stack"}

// scrapeInterval is the PodMonitor's interval and the rule evaluation interval here.
const scrapeInterval = 30 * time.Second

// scrapes is how many scrapes a scenario has: 40 minutes, room for the longest
// "for" (15m) after the longest range (10m) has filled with the fault.
const scrapes = 80

// faultFrom is the scrape from which a scenario's fault is there (minute 10).
const faultFrom = 20

// target is the scrape target's labels as the PodMonitor gives them (job from the pods'
// app.kubernetes.io/name, node from the relabeling, and the Operator's namespace/pod).
var target = map[string]string{
	"job": "shardproxy", "instance": "192.0.2.10:10349", "node": "node-1",
	"namespace": "kube-system", "pod": "shardproxy-abcde",
}

// nodeAddressList is the published node address list as the supervisors and the writer
// label it (configmap).
const nodeAddressList = "shardproxy-system/shardproxy-nodeaddresses"

// writerTarget is the scrape target of the node address writer's replica i as its
// PodMonitor gives it (job from the pods' app.kubernetes.io/component; the pod's own
// address, on another node).
func writerTarget(i int) map[string]string {
	return map[string]string{
		"job": "node-addresses", "instance": fmt.Sprintf("10.244.2.%d:10256", 10+i), "node": fmt.Sprintf("node-%d", 2+i),
		"namespace": "shardproxy-system", "pod": fmt.Sprintf("shardproxy-node-addresses-%d", i),
	}
}

// scrapeTime is when scrape i happens.
func scrapeTime(i int) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(i) * scrapeInterval)
}

// alertRules renders monitoring/example, takes its PrometheusRule and parses and
// validates its groups as Prometheus and the Operator do (rulefmt, unknown fields
// refused: expressions parse, templates parse, durations are durations).
func alertRules(t *testing.T) (*unstructured.Unstructured, []rulefmt.Rule) {
	t.Helper()
	rules := objectsOf(render(t, monitoringExample), "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules in %s, want 1", len(rules), monitoringExample)
	}
	obj := rules[0]
	if obj.GetAPIVersion() != "monitoring.coreos.com/v1" {
		t.Errorf("PrometheusRule apiVersion %s", obj.GetAPIVersion())
	}
	spec, _, _ := unstructured.NestedMap(obj.Object, "spec")
	data, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(data, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("PrometheusRule %s: %v", obj.GetName(), err)
	}
	if groups == nil {
		t.FailNow()
	}
	var out []rulefmt.Rule
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return obj, out
}

// TestAlertRulesDocumented: every alert has a severity, a summary and a description, and
// a runbook_url whose anchor is a section of docs/runbooks.md; every alert of the
// issue's list is there; the PrometheusRule and the PodMonitor carry the label
// kube-prometheus-stack selects by default.
func TestAlertRulesDocumented(t *testing.T) {
	obj, rules := alertRules(t)
	doc, err := os.ReadFile(runbooksFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			anchors[markdownAnchor(h)] = true
		}
	}
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: no %s", r.Alert, a)
			}
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURLPrefix)
		if !ok {
			t.Errorf("%s: runbook_url %q does not start with %s", r.Alert, r.Annotations["runbook_url"], runbookURLPrefix)
		}
		if anchor != strings.ToLower(r.Alert) || !anchors[anchor] {
			t.Errorf("%s: runbook_url anchor %q: want a section %q in %s", r.Alert, anchor, "## "+r.Alert, runbooksFile)
		}
	}
	for _, want := range []string{
		"ShardproxyDown", "ShardproxyAbsent", "ShardproxyInstanceDown", "ShardproxyInstanceStale",
		"ShardproxySyncErrors", "ShardproxyPartialSyncSlow", "ShardproxyServicesRefusedByGuard",
		"ShardproxyConntrackCleanupFailing", "ShardproxyNodeAddressWriterNoLeader",
		"ShardproxyNodeAddressWriterPublishFailing", "ShardproxyPublishedNodeAddressesDown",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}
	pms := objectsOf(render(t, monitoringExample), "PodMonitor")
	for _, o := range append(pms, obj) {
		for k, v := range releaseLabel {
			if got := o.GetLabels()[k]; got != v {
				t.Errorf("%s %s: label %s=%q, want %q (kube-prometheus-stack's default selector)", o.GetKind(), o.GetName(), k, got, v)
			}
		}
	}
}

// markdownAnchor is the anchor GitHub gives a heading: lower case, spaces to dashes,
// punctuation dropped.
func markdownAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestAlertsQueryExportedMetrics: every series an alert reads is one the metrics package
// exports (histogram suffixes only on histograms) or Prometheus' own up, with labels it
// has: a renamed metric or label fails here, by name, before the evaluation below.
func TestAlertsQueryExportedMetrics(t *testing.T) {
	_, rules := alertRules(t)
	fams := registeredFamilies(t)
	maps.Copy(fams, nodeAddressFamilies(t))
	for _, r := range rules {
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
		if err != nil {
			t.Errorf("%s: %v", r.Alert, err)
			continue
		}
		for _, sel := range parser.ExtractSelectors(expr) {
			var name string
			var others []string
			for _, mt := range sel {
				switch mt.Name {
				case labels.MetricName:
					name = mt.Value
				case "job", "instance", "node", "namespace", "pod":
					// The scrape target's, from the PodMonitor.
				default:
					others = append(others, mt.Name)
				}
			}
			if name == "up" {
				continue
			}
			fam, base := familyOf(fams, name)
			if fam == nil {
				t.Errorf("%s: %s is not a metric the metrics package exports", r.Alert, name)
				continue
			}
			if base != name && fam.GetType() != dto.MetricType_HISTOGRAM {
				t.Errorf("%s: %s, but %s is a %s, not a histogram", r.Alert, name, base, fam.GetType())
			}
			for _, l := range others {
				if !hasLabel(fam, l) {
					t.Errorf("%s: selects on %s, which %s does not have", r.Alert, l, base)
				}
			}
		}
	}
}

// nodeAddressFamilies returns the metric families of the published node address list:
// a metrics.Metrics' reading it and a metrics.NodeAddressWriter's that has published it,
// by name.
func nodeAddressFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	m := metrics.New()
	m.SetPublishedNodeAddresses(nodeAddressList, true, 3)
	w := metrics.NewNodeAddressWriter(nodeAddressList)
	w.Published(3, time.Now())
	out := map[string]*dto.MetricFamily{}
	for _, g := range []prometheus.Gatherer{m.Registry(), w.Registry()} {
		fams, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			out[f.GetName()] = f
		}
	}
	return out
}

// scenario drives a metrics.Metrics, scrape after scrape, into one state.
type scenario struct {
	name string
	// drive changes the metrics before scrape i (0 ≤ i < scrapes).
	drive func(m *metrics.Metrics, i int)
	// writer drives the node address writer's two replicas, each a target of its own,
	// before scrape i; nil: no writer runs.
	writer func(w []*metrics.NodeAddressWriter, i int)
	// down: from faultFrom on the target does not answer (up 0, no series); absent: it is
	// never scraped at all.
	down, absent bool
	// want are the alerts that fire at the end, each with the labels it must carry.
	want map[string]map[string]string
}

// healthy is a node whose instance team-a syncs every scrape in a millisecond, with the
// odd failure a retry fixes and a slow full sync, which no alert is about.
func healthy(m *metrics.Metrics, i int) {
	if i == 0 {
		m.InitInstance("team-a")
		m.SetBuildInfo("v0.0.0-test")
	}
	now := scrapeTime(i)
	m.SetInstanceUp("team-a", true)
	m.SetInstanceStale("team-a", false)
	m.SetOwned("team-a", 40, 120)
	for _, fam := range []string{metrics.IPv4, metrics.IPv6} {
		m.SetLastQueued("team-a", fam, now)
		m.ObserveSync("team-a", fam, i%20 == 0, time.Millisecond)
		m.SetLastSync("team-a", fam, now)
	}
	if i == 30 {
		m.SyncFailed("team-a", metrics.IPv4)
		m.SyncFailed("team-a", metrics.IPv6)
		m.ObserveSync("team-a", metrics.IPv4, true, 12*time.Second)
	}
	m.ConntrackDeleted("team-a", metrics.IPv4, 2)
	m.ObserveConntrackReconcile(metrics.IPv4, time.Millisecond)
	m.HealthzResult(200)
}

// faulty is healthy plus fault from faultFrom on.
func faulty(fault func(m *metrics.Metrics, i int)) func(m *metrics.Metrics, i int) {
	return func(m *metrics.Metrics, i int) {
		healthy(m, i)
		if i >= faultFrom {
			fault(m, i)
		}
	}
}

// published is healthy with otherNodeAddresses: published: the list of 3 Nodes read.
func published(m *metrics.Metrics, i int) {
	healthy(m, i)
	m.SetPublishedNodeAddresses(nodeAddressList, true, 3)
}

// leading is a node address writer in a cluster whose addresses do not change: replica
// 0 leads and published the list at the start, replica 1 stands by.
func leading(w []*metrics.NodeAddressWriter, i int) {
	if i == 0 {
		for r, wr := range w {
			wr.SetBuildInfo("v0.0.0-test")
			wr.SetLeader(r == 0)
		}
		w[0].Published(3, scrapeTime(i))
	}
}

// writing is leading with a Node added at scrape 55: its write fails and the retry, a
// second later, works; nothing is published after it. A rule that took the failure in
// a window longer than the one of the last publish would fire at the end.
func writing(w []*metrics.NodeAddressWriter, i int) {
	leading(w, i)
	if i == 55 {
		w[0].PublishFailed()
		w[0].Published(4, scrapeTime(i).Add(-scrapeInterval+time.Second))
	}
}

// writerFaulty is leading plus fault from faultFrom on.
func writerFaulty(fault func(w []*metrics.NodeAddressWriter, i int)) func(w []*metrics.NodeAddressWriter, i int) {
	return func(w []*metrics.NodeAddressWriter, i int) {
		leading(w, i)
		if i >= faultFrom {
			fault(w, i)
		}
	}
}

var alertScenarios = []scenario{
	{name: "a healthy node fires nothing", drive: healthy},
	{
		name: "a supervisor that stops answering is down", drive: healthy, down: true,
		want: map[string]map[string]string{"ShardproxyDown": {"node": "node-1", "job": "shardproxy"}},
	},
	{
		name: "no shardproxy target at all is absent", drive: healthy, absent: true,
		want: map[string]map[string]string{"ShardproxyAbsent": {"job": "shardproxy"}},
	},
	{
		name:  "an instance that stays down",
		drive: faulty(func(m *metrics.Metrics, _ int) { m.SetInstanceUp("team-a", false) }),
		want:  map[string]map[string]string{"ShardproxyInstanceDown": {"proxy_instance": "team-a", "node": "node-1"}},
	},
	{
		name:  "an instance that stays stale",
		drive: faulty(func(m *metrics.Metrics, _ int) { m.SetInstanceStale("team-a", true) }),
		want:  map[string]map[string]string{"ShardproxyInstanceStale": {"proxy_instance": "team-a", "node": "node-1"}},
	},
	{
		name: "syncs that keep failing",
		drive: faulty(func(m *metrics.Metrics, _ int) {
			m.SyncFailed("team-a", metrics.IPv4)
			m.SyncFailed("team-a", metrics.IPv6)
		}),
		want: map[string]map[string]string{"ShardproxySyncErrors": {"proxy_instance": "team-a", "node": "node-1"}},
	},
	{
		name: "partial syncs of 3 s",
		drive: faulty(func(m *metrics.Metrics, _ int) {
			m.ObserveSync("team-a", metrics.IPv6, false, 3*time.Second)
			m.ObserveSync("team-a", metrics.IPv6, false, 3*time.Second)
		}),
		want: map[string]map[string]string{"ShardproxyPartialSyncSlow": {"proxy_instance": "team-a", "ip_family": "IPv6", "node": "node-1"}},
	},
	{
		name: "a Service refused by the namespace guard half an hour ago",
		drive: faulty(func(m *metrics.Metrics, i int) {
			if i == 40 {
				m.GuardRefused("team-a", metrics.GuardNamespace)
			}
		}),
		want: map[string]map[string]string{"ShardproxyServicesRefusedByGuard": {"proxy_instance": "team-a", "guard": "namespace"}},
	},
	{
		name: "a failed conntrack cleanup five minutes ago",
		drive: faulty(func(m *metrics.Metrics, i int) {
			if i == scrapes-10 {
				m.ConntrackCleanupFailed("team-a", metrics.IPv6)
			}
		}),
		want: map[string]map[string]string{"ShardproxyConntrackCleanupFailing": {"proxy_instance": "team-a", "ip_family": "IPv6", "node": "node-1"}},
	},
	{name: "nodes reading the published list from a leading writer fire nothing", drive: published, writer: writing},
	{
		name: "a writer whose replicas all stand by, where the nodes watch every Node, fires nothing", drive: healthy,
		writer: writerFaulty(func(w []*metrics.NodeAddressWriter, _ int) { w[0].SetLeader(false) }),
	},
	{
		name: "nodes reading the published list with no writer scraped have no leader", drive: published,
		want: map[string]map[string]string{"ShardproxyNodeAddressWriterNoLeader": {"configmap": nodeAddressList}},
	},
	{
		name: "nodes reading the published list while every writer stands by have no leader", drive: published,
		writer: writerFaulty(func(w []*metrics.NodeAddressWriter, _ int) { w[0].SetLeader(false) }),
		want:   map[string]map[string]string{"ShardproxyNodeAddressWriterNoLeader": {"configmap": nodeAddressList}},
	},
	{
		name: "a leader whose publishes keep failing", drive: published,
		writer: writerFaulty(func(w []*metrics.NodeAddressWriter, _ int) { w[0].PublishFailed() }),
		want:   map[string]map[string]string{"ShardproxyNodeAddressWriterPublishFailing": {"configmap": nodeAddressList}},
	},
	{
		// Each leader fails /healthz, is restarted and hands the Lease over: the replicas
		// take turns, two minutes each, both failing.
		name: "replicas that take turns leading, every one failing", drive: published,
		writer: writerFaulty(func(w []*metrics.NodeAddressWriter, i int) {
			lead := (i / 4) % 2
			w[lead].SetLeader(true)
			w[1-lead].SetLeader(false)
			w[lead].PublishFailed()
		}),
		want: map[string]map[string]string{"ShardproxyNodeAddressWriterPublishFailing": {"configmap": nodeAddressList}},
	},
	{
		name: "a writer failing where no node reads its list", drive: healthy,
		writer: writerFaulty(func(w []*metrics.NodeAddressWriter, _ int) { w[0].PublishFailed() }),
	},
	{
		name: "a leader that has never published and keeps failing", drive: published,
		writer: func(w []*metrics.NodeAddressWriter, i int) {
			w[0].SetLeader(true)
			w[1].SetLeader(false)
			if i >= faultFrom {
				w[0].PublishFailed()
			}
		},
		want: map[string]map[string]string{"ShardproxyNodeAddressWriterPublishFailing": {"configmap": nodeAddressList}},
	},
	{
		// Its failures are still in the window at the end: it is no longer the leader.
		name: "a leader that failed until it lost the Lease, two minutes ago, to one that publishes", drive: published,
		writer: writerFaulty(func(w []*metrics.NodeAddressWriter, i int) {
			switch {
			case i < scrapes-5:
				w[0].PublishFailed()
			case i == scrapes-5:
				w[0].SetLeader(false)
				w[1].SetLeader(true)
				w[1].Published(3, scrapeTime(i))
			}
		}),
	},
	{
		name: "a node that cannot read the published list", drive: faulty(func(m *metrics.Metrics, _ int) {
			m.SetPublishedNodeAddresses(nodeAddressList, true, 3)
			m.SetPublishedNodeAddresses(nodeAddressList, false, 3)
		}),
		writer: writing,
		want: map[string]map[string]string{"ShardproxyPublishedNodeAddressesDown": {
			"configmap": nodeAddressList, "node": "node-1", "job": "shardproxy",
		}},
	},
}

// TestAlertsFire evaluates every alert of the PrometheusRule with Prometheus' PromQL
// engine over what Prometheus would have stored: the real metrics package's /metrics,
// scraped every 30 s for 40 minutes, with the PodMonitor's target labels and up. Each
// scenario drives the metrics into one state; exactly its alerts fire at the end, with
// "for" applied as the rule manager does (active at every evaluation for that long).
func TestAlertsFire(t *testing.T) {
	_, rules := alertRules(t)
	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples: 10_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute,
	})
	t.Cleanup(func() { engine.Close() })
	start := time.Unix(1_700_000_000, 0)
	end := start.Add((scrapes - 1) * scrapeInterval)

	for _, sc := range alertScenarios {
		t.Run(sc.name, func(t *testing.T) {
			db := newMemStorage()
			m := metrics.New()
			var writers []*metrics.NodeAddressWriter
			if sc.writer != nil {
				writers = []*metrics.NodeAddressWriter{metrics.NewNodeAddressWriter(nodeAddressList), metrics.NewNodeAddressWriter(nodeAddressList)}
			}
			for i := range scrapes {
				ts := start.Add(time.Duration(i) * scrapeInterval)
				sc.drive(m, i)
				switch {
				case sc.absent:
				case sc.down && i >= faultFrom:
					db.add(ts, target, map[string]string{"__name__": "up"}, 0)
				default:
					scrape(t, db, m.Handler(), target, ts)
				}
				if writers != nil {
					sc.writer(writers, i)
					for r, w := range writers {
						scrape(t, db, w.Handler(), writerTarget(r), ts)
					}
				}
			}
			firing := map[string][]labels.Labels{}
			for _, r := range rules {
				if got := evalAlert(t, engine, db, r, start, end); len(got) > 0 {
					firing[r.Alert] = got
				}
			}
			for alert, ls := range firing {
				want, ok := sc.want[alert]
				if !ok {
					t.Errorf("%s fires: %v", alert, ls)
					continue
				}
				for _, l := range ls {
					for k, v := range want {
						if l.Get(k) != v {
							t.Errorf("%s fires with %s=%q, want %q (%v)", alert, k, l.Get(k), v, l)
						}
					}
				}
			}
			for alert := range sc.want {
				if firing[alert] == nil {
					t.Errorf("%s does not fire", alert)
				}
			}
		})
	}
}

// evalAlert returns the label sets r fires for at end, evaluated every scrapeInterval
// from start: active at end and at every evaluation of the last For.
func evalAlert(t *testing.T, engine *promql.Engine, db storage.Queryable, r rulefmt.Rule, start, end time.Time) []labels.Labels {
	t.Helper()
	q, err := engine.NewRangeQuery(context.Background(), db, nil, r.Expr, start, end, scrapeInterval)
	if err != nil {
		t.Fatalf("%s: %v", r.Alert, err)
	}
	defer q.Close()
	res := q.Exec(context.Background())
	if res.Err != nil {
		t.Fatalf("%s: %v", r.Alert, res.Err)
	}
	matrix, err := res.Matrix()
	if err != nil {
		t.Fatalf("%s: %v", r.Alert, err)
	}
	var out []labels.Labels
	for _, s := range matrix {
		at := map[int64]bool{}
		for _, p := range s.Floats {
			at[p.T] = true
		}
		fires := true
		for ts := end; !ts.Before(end.Add(-time.Duration(r.For))); ts = ts.Add(-scrapeInterval) {
			fires = fires && at[ts.UnixMilli()]
		}
		if fires {
			out = append(out, s.Metric)
		}
	}
	return out
}

// scrape stores what a scrape of the /metrics handler h at ts gives Prometheus: every
// sample with the labels of the target tgt, histograms as their _bucket, _sum and _count
// series, and up 1.
func scrape(t *testing.T, db *memStorage, h http.Handler, tgt map[string]string, ts time.Time) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	db.add(ts, tgt, map[string]string{"__name__": "up"}, 1)
	for name, f := range fams {
		for _, s := range f.GetMetric() {
			ls := map[string]string{}
			for _, l := range s.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			with := func(name string, extra ...string) map[string]string {
				out := map[string]string{"__name__": name}
				for k, v := range ls {
					out[k] = v
				}
				for i := 0; i+1 < len(extra); i += 2 {
					out[extra[i]] = extra[i+1]
				}
				return out
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				db.add(ts, tgt, with(name), s.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				db.add(ts, tgt, with(name), s.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				db.add(ts, tgt, with(name), s.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := s.GetHistogram()
				for _, b := range h.GetBucket() {
					db.add(ts, tgt, with(name+"_bucket", "le", model.FloatString(b.GetUpperBound()).String()), float64(b.GetCumulativeCount()))
				}
				db.add(ts, tgt, with(name+"_bucket", "le", "+Inf"), float64(h.GetSampleCount()))
				db.add(ts, tgt, with(name+"_sum"), h.GetSampleSum())
				db.add(ts, tgt, with(name+"_count"), float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				sm := s.GetSummary()
				db.add(ts, tgt, with(name+"_sum"), sm.GetSampleSum())
				db.add(ts, tgt, with(name+"_count"), float64(sm.GetSampleCount()))
			}
		}
	}
}

// memStorage is a storage.Queryable over float samples kept in memory: what a TSDB
// would return for the scrapes added.
type memStorage struct {
	series map[string]*memSeries
}

type memSeries struct {
	labels  labels.Labels
	samples []chunks.Sample
}

func newMemStorage() *memStorage { return &memStorage{series: map[string]*memSeries{}} }

// add appends the sample v at ts to the series ls plus the scrape target tgt's labels.
func (s *memStorage) add(ts time.Time, tgt, ls map[string]string, v float64) {
	all := map[string]string{}
	for k, val := range tgt {
		all[k] = val
	}
	for k, val := range ls {
		all[k] = val
	}
	lset := labels.FromMap(all)
	key := lset.String()
	ser := s.series[key]
	if ser == nil {
		ser = &memSeries{labels: lset}
		s.series[key] = ser
	}
	ser.samples = append(ser.samples, floatSample{t: ts.UnixMilli(), f: v})
}

// Querier implements storage.Queryable.
func (s *memStorage) Querier(mint, maxt int64) (storage.Querier, error) {
	return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
		var out []storage.Series
		for _, ser := range s.series {
			if matchesAll(ser.labels, ms) {
				out = append(out, storage.NewListSeries(ser.labels, ser.samples))
			}
		}
		sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
		return &sliceSeriesSet{series: out, i: -1}
	}}, nil
}

func matchesAll(ls labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(ls.Get(m.Name)) {
			return false
		}
	}
	return true
}

// sliceSeriesSet is a storage.SeriesSet over a sorted slice.
type sliceSeriesSet struct {
	series []storage.Series
	i      int
}

func (s *sliceSeriesSet) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *sliceSeriesSet) At() storage.Series                { return s.series[s.i] }
func (s *sliceSeriesSet) Err() error                        { return nil }
func (s *sliceSeriesSet) Warnings() annotations.Annotations { return nil }

// floatSample is one float sample, as chunks.Sample.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }

var _ storage.Queryable = &memStorage{}
