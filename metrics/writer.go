package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// NodeAddressWriter is the metrics of `shardproxy node-addresses`, the writer of the
// published node address list: whether this replica leads, when it last published, how
// many publishes failed, how many Nodes the list names and how long writes waited for
// the egress budget. Its series carry the
// ConfigMap (namespace/name) as configmap, as the supervisors'
// shardproxy_published_node_addresses_* do, so the two join.
type NodeAddressWriter struct {
	registry *prometheus.Registry
	handler  http.Handler
	// configMap is the configmap label's value.
	configMap string

	leader        prometheus.Gauge
	lastPublish   *prometheus.GaugeVec
	publishErrors prometheus.Counter
	nodes         prometheus.Gauge
	budgetWait    prometheus.Histogram
	buildInfo     *prometheus.GaugeVec
}

// NewNodeAddressWriter returns the metrics of the writer of ConfigMap configMap
// (namespace/name), registered with the Go runtime and process collectors on a registry
// of their own. Every series exists from the start: the leader gauge at 0, the error
// counter at 0; the last publish's timestamp only once a publish worked (0 would read
// as "published in 1970").
func NewNodeAddressWriter(configMap string) *NodeAddressWriter {
	m := &NodeAddressWriter{registry: newProcessRegistry(), configMap: configMap}
	constLabels := prometheus.Labels{labelConfigMap: configMap}
	m.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace, Name: "node_addresses_writer_leader", ConstLabels: constLabels,
		Help: "1 while this node address writer holds the Lease and publishes the list, 0 while it stands by",
	})
	// A vector, so that its one series appears only at the first publish.
	m.lastPublish = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace, Name: "node_addresses_writer_last_publish_timestamp_seconds",
		Help: "When this writer last published the node address list (wrote it, or found it current), in seconds since the epoch",
	}, []string{labelConfigMap})
	m.publishErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: shardproxyNamespace, Name: "node_addresses_writer_publish_errors_total", ConstLabels: constLabels,
		Help: "Publishes of the node address list that failed (each is retried with backoff), and first lists of the Nodes not in within the bound",
	})
	m.nodes = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace, Name: "node_addresses_writer_nodes", ConstLabels: constLabels,
		Help: "Nodes in the node address list this writer last published",
	})
	m.budgetWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: shardproxyNamespace, Name: "node_addresses_writer_budget_wait_seconds", ConstLabels: constLabels,
		Help: "Waits of a write of the node address list for the egress budget (--max-egress), beyond the debounce: one per wait, observed when it begins",
		// From the small clusters' milliseconds to the ~51 s of 5,000 Nodes at 50 MiB/s.
		Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
	})
	m.buildInfo = newBuildInfo()
	m.registry.MustRegister(m.leader, m.lastPublish, m.publishErrors, m.nodes, m.budgetWait, m.buildInfo)
	m.handler = handlerFor(m.registry)
	return m
}

// Registry returns the registry m's collectors are registered on.
func (m *NodeAddressWriter) Registry() *prometheus.Registry { return m.registry }

// Handler returns the HTTP handler that serves m's registry. Every call returns the
// same handler.
func (m *NodeAddressWriter) Handler() http.Handler { return m.handler }

// SetBuildInfo sets shardproxy_build_info to 1 for version and the Go version.
func (m *NodeAddressWriter) SetBuildInfo(version string) { setBuildInfo(m.buildInfo, version) }

// SetLeader records whether this writer holds the Lease.
func (m *NodeAddressWriter) SetLeader(leader bool) {
	v := 0.0
	if leader {
		v = 1
	}
	m.leader.Set(v)
}

// Published records that the ConfigMap holds the list of nodes Nodes, as of at.
func (m *NodeAddressWriter) Published(nodes int, at time.Time) {
	m.lastPublish.WithLabelValues(m.configMap).Set(float64(at.UnixNano()) / 1e9)
	m.nodes.Set(float64(nodes))
}

// PublishFailed counts a failed publish.
func (m *NodeAddressWriter) PublishFailed() { m.publishErrors.Inc() }

// BudgetWait records that a write of the list waits wait for the egress budget.
func (m *NodeAddressWriter) BudgetWait(wait time.Duration) { m.budgetWait.Observe(wait.Seconds()) }
