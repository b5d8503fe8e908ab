package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/shardproxy/shardproxy/metrics"
)

// dashboardFile is the Grafana dashboard over the metrics package's series.
var dashboardFile = filepath.Join("grafana", "shardproxy.json")

// metricName matches the names of the series shardproxy exports in a PromQL expression.
var metricName = regexp.MustCompile(`\b(?:kubeproxy|shardproxy)_[a-zA-Z0-9_]+`)

// proxyFilter is how every query of a per-instance series selects the proxy instances,
// by the series' own proxy_instance label ("instance" is Prometheus' scrape target).
const proxyFilter = `proxy_instance=~"$proxy"`

// familyFilter is how every query of a series kube-proxy labels by ip_family selects the
// families, which it keeps apart (grouping by ip_family) as upstream's dashboards do.
const familyFilter = `ip_family=~"$family"`

// grafanaVariables fills in the dashboard's variables as Grafana would, so that each
// panel's query parses as PromQL.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "2m", "$__range", "3h", "$job", ".*", "$node", ".*", "$proxy", ".*", "$family", ".*")

// registeredFamilies returns the metric families of a metrics.Metrics and of a
// metrics.NodeAddressWriter (the writer Deployment's, scraped as job "node-addresses"),
// with every series created, by name.
func registeredFamilies(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	m := metrics.New()
	m.InitInstance("a")
	m.SetLastSync("a", metrics.IPv4, time.Now())
	m.SetLastQueued("a", metrics.IPv4, time.Now())
	m.Handover("a", "b")
	m.ConntrackDeleted("a", "IPv4", 1)
	m.HealthzResult(200)
	m.LivezResult(200)
	m.SetBuildInfo("v0.0.0-test")
	m.SetConfig("0123456789abcdef", time.Now())
	m.SetPublishedNodeAddresses("shardproxy-system/shardproxy-nodeaddresses", true, 3)
	w := metrics.NewNodeAddressWriter("shardproxy-system/shardproxy-nodeaddresses")
	w.SetBuildInfo("v0.0.0-test")
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

// queries returns every PromQL expression of the dashboard: panel targets and template
// variable queries, with where each is.
func queries(t *testing.T, dash map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	panels, _ := dash["panels"].([]any)
	for _, p := range panels {
		panel, _ := p.(map[string]any)
		title, _ := panel["title"].(string)
		if panel["type"] == "row" {
			continue
		}
		targets, _ := panel["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no queries", title)
		}
		for _, tg := range targets {
			target, _ := tg.(map[string]any)
			expr, _ := target["expr"].(string)
			if expr == "" {
				t.Errorf("panel %q has a target without an expression", title)
				continue
			}
			out["panel "+title+" "+target["refId"].(string)] = expr
		}
	}
	templating, _ := dash["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	for _, v := range vars {
		variable, _ := v.(map[string]any)
		if variable["type"] != "query" {
			continue
		}
		q, _ := variable["query"].(map[string]any)
		expr, _ := q["query"].(string)
		out["variable "+variable["name"].(string)] = expr
	}
	return out
}

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	fams := registeredFamilies(t)
	if strings.Contains(string(data), "exported_") {
		t.Errorf("%s queries an exported_* label: no shardproxy series carries a Prometheus target label", dashboardFile)
	}

	used := map[string]bool{}
	for where, expr := range queries(t, dash) {
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVariables.Replace(expr)); err != nil && !strings.HasPrefix(where, "variable ") {
			t.Errorf("%s: not PromQL once Grafana's variables are filled in: %v: %s", where, err, expr)
		}
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: queries no shardproxy metric: %s", where, expr)
		}
		perInstance, perFamily := false, false
		for _, name := range names {
			fam, base := familyOf(fams, name)
			if fam == nil {
				t.Errorf("%s: %s is not a metric the metrics package registers", where, name)
				continue
			}
			if base != name && fam.GetType() != dto.MetricType_HISTOGRAM {
				t.Errorf("%s: %s, but %s is a %s, not a histogram", where, name, base, fam.GetType())
			}
			used[base] = true
			if hasLabel(fam, "proxy_instance") {
				perInstance = true
			}
			if hasLabel(fam, "ip_family") {
				perFamily = true
			}
		}
		if strings.HasPrefix(where, "variable ") {
			continue
		}
		if perInstance && !strings.Contains(expr, proxyFilter) {
			t.Errorf("%s: a per-instance series queried without %s: %s", where, proxyFilter, expr)
		}
		if perFamily && (strings.Count(expr, familyFilter) != len(names) || !strings.Contains(expr, "ip_family)") && !strings.Contains(expr, "ip_family, ")) {
			t.Errorf("%s: a per-family series queried without %s on each series or without keeping ip_family apart: %s", where, familyFilter, expr)
		}
	}

	// Every per-instance series should be on the dashboard; the Go and process
	// collectors' series are not shardproxy's to show.
	for name, fam := range fams {
		if !metricName.MatchString(name) || used[name] {
			continue
		}
		t.Errorf("%s (%s) is on no panel", name, fam.GetHelp())
	}
}

// familyOf finds the family a queried name belongs to: itself, or a histogram whose
// _bucket, _sum or _count series it is. base is the family's name.
func familyOf(fams map[string]*dto.MetricFamily, name string) (fam *dto.MetricFamily, base string) {
	if f, ok := fams[name]; ok {
		return f, name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := fams[b]; ok {
				return f, b
			}
		}
	}
	return nil, name
}

func hasLabel(fam *dto.MetricFamily, label string) bool {
	for _, m := range fam.GetMetric() {
		if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label }) {
			return true
		}
	}
	return false
}
