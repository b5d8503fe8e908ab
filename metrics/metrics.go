// Package metrics exposes shardproxy's Prometheus metrics: the kube-proxy
// series that existing dashboards and alerts are written against, with
// upstream's labels (ip_family on the per-family series, as kube-proxy
// v1.34+ labels them) and each split by an extra "proxy_instance" label, plus
// shardproxy's own series about the proxy instances a node's supervisor runs.
//
// The label is proxy_instance, not instance: Prometheus sets "instance" (and "job") on
// every series it scrapes, so a series' own "instance" would be renamed
// exported_instance by every default scrape configuration, and with honor_labels it
// would replace the scrape target and merge the nodes' series.
//
// Everything lives on a registry owned by a Metrics value; nothing is
// registered globally, so tests and several supervisors in one process do
// not collide. Callers use the typed methods and never see label order.
package metrics

import (
	"net/http"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const (
	// kubeProxySubsystem keeps upstream's "kubeproxy_" prefix so that
	// dashboards and alerts written for kube-proxy keep matching.
	kubeProxySubsystem = "kubeproxy"
	// shardproxyNamespace prefixes the series that only shardproxy has.
	shardproxyNamespace = "shardproxy"

	// labelInstance names the proxy instance; never a target label of Prometheus
	// (instance, job), see the package comment.
	labelInstance      = "proxy_instance"
	labelTrafficPolicy = "traffic_policy"
	labelCode          = "code"
	labelIPFamily      = "ip_family"
	labelKind          = "kind"
	labelFrom          = "from"
	labelTo            = "to"
	labelVersion       = "version"
	labelGoVersion     = "go_version"
	labelGuard         = "guard"
	labelHash          = "hash"
	labelResult        = "result"
	labelConfigMap     = "configmap"

	kindFull    = "full"
	kindPartial = "partial"

	// IPv4 and IPv6 are the values of the ip_family label, as upstream spells them
	// (the API's IPFamily).
	IPv4 = "IPv4"
	IPv6 = "IPv6"

	trafficPolicyInternal = "internal"
	trafficPolicyExternal = "external"

	// GuardNamespace and GuardAddress are the values of the guard label of
	// shardproxy_guard_refusals_total: the instance does not accept Services from the
	// Service's namespace (it is not programmed), or the user-set addresses it dropped
	// (outside its tenant ranges, or another Service's by the node-wide precedence).
	GuardNamespace = "namespace"
	GuardAddress   = "address"
)

// Metrics holds every shardproxy collector and the registry they are
// registered on. All methods are safe for concurrent use.
type Metrics struct {
	registry *prometheus.Registry
	handler  http.Handler

	// kube-proxy compatible, per instance.
	syncLatency            *prometheus.HistogramVec
	syncFullLatency        *prometheus.HistogramVec
	syncPartialLatency     *prometheus.HistogramVec
	lastSync               *prometheus.GaugeVec
	lastQueued             *prometheus.GaugeVec
	networkProgramming     *prometheus.HistogramVec
	endpointChangesPending *prometheus.GaugeVec
	endpointChangesTotal   *prometheus.CounterVec
	serviceChangesPending  *prometheus.GaugeVec
	serviceChangesTotal    *prometheus.CounterVec
	noLocalEndpoints       *prometheus.GaugeVec
	syncFailures           *prometheus.CounterVec
	cleanupFailures        *prometheus.CounterVec

	// kube-proxy compatible, node-wide.
	healthz                    *prometheus.CounterVec
	livez                      *prometheus.CounterVec
	conntrackReconcilerDeleted *prometheus.CounterVec
	conntrackReconcilerLatency *prometheus.HistogramVec

	// shardproxy's own.
	instanceUp        *prometheus.GaugeVec
	instanceStale     *prometheus.GaugeVec
	instanceRestarts  *prometheus.CounterVec
	instanceServices  *prometheus.GaugeVec
	instanceEndpoints *prometheus.GaugeVec
	handovers         *prometheus.CounterVec
	conntrackDeleted  *prometheus.CounterVec
	conntrackFailures *prometheus.CounterVec
	guardRefusals     *prometheus.CounterVec
	syncOperations    *prometheus.HistogramVec
	buildInfo         *prometheus.GaugeVec
	configInfo        *prometheus.GaugeVec
	configApplied     prometheus.Gauge
	configReloads     *prometheus.CounterVec
	// nodeAddressesUp and nodeAddressesNodes: the published node address list, where
	// otherNodeAddresses is "published" (no series otherwise).
	nodeAddressesUp    *prometheus.GaugeVec
	nodeAddressesNodes *prometheus.GaugeVec

	// rest counts and times the API client's requests (restclient.go).
	rest restClientMetrics

	// instanceVectors are the vectors with a proxy_instance label, as perInstance and
	// perInstanceTimestamp register them: ForgetInstance and InitInstance go through
	// them, so a metric is defined in one place, New.
	instanceVectors []instanceVector
}

// syncLatencyBuckets matches upstream kube-proxy: 1ms doubling to ~16s.
func syncLatencyBuckets() []float64 {
	return prometheus.ExponentialBuckets(0.001, 2, 15)
}

// networkProgrammingBuckets matches upstream kube-proxy's
// NetworkProgrammingLatency buckets: fine-grained under a minute, then
// coarser up to five minutes. Upstream joins them with component-base's
// MergeBuckets, which starts from a 0 bound, so its histogram has an le="0"
// bucket, and so has this one.
func networkProgrammingBuckets() []float64 {
	b := []float64{0}
	b = append(b, prometheus.LinearBuckets(0.25, 0.25, 2)...)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	b = append(b, prometheus.LinearBuckets(120, 30, 7)...)
	return b
}

// syncOperationsBuckets covers 1 to 65536 nft operations per transaction;
// a full sync of a large instance can reach tens of thousands.
func syncOperationsBuckets() []float64 {
	return prometheus.ExponentialBuckets(1, 2, 17)
}

// New returns a Metrics whose collectors, plus the Go runtime and process
// collectors, are registered on a fresh registry of its own.
//
// Each metric is defined by one statement, in the add*Series method of its group:
// perInstance, perInstanceTimestamp or nodeWide registers it and makes InitInstance and
// ForgetInstance cover it.
func New() *Metrics {
	m := &Metrics{registry: newProcessRegistry()}
	m.addSyncSeries()
	m.addProxyNodeSeries()
	m.addInstanceSeries()
	m.addInfoSeries()
	m.rest = newRESTClientMetrics(m)
	m.handler = handlerFor(m.registry)
	return m
}

// newProcessRegistry returns a fresh registry with the Go runtime and process
// collectors, as every shardproxy process serves them.
func newProcessRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}

// handlerFor serves r. Build it once per registry: HandlerOpts.Registry registers
// promhttp's own error counter on r, which may happen only once.
func handlerFor(r *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(r, promhttp.HandlerOpts{Registry: r})
}

// newBuildInfo is shardproxy_build_info, as Prometheus' own <component>_build_info: a
// constant 1 whose labels say what runs, so a rollout's progress is
// count by (version) (...).
func newBuildInfo() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "build_info",
		Help:      "A metric with a constant '1' value labeled by the version of shardproxy and the Go version it was built with",
	}, []string{labelVersion, labelGoVersion})
}

// setBuildInfo makes version and this binary's Go version buildInfo's only series.
func setBuildInfo(buildInfo *prometheus.GaugeVec, version string) {
	buildInfo.Reset()
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
}

// instFamLabels label the series upstream labels by ip_family; InitInstance creates
// them for both families (ipFamilies).
func instFamLabels() []string { return []string{labelInstance, labelIPFamily} }

// ipFamilies are the ip_family values of each instance's per-family series.
func ipFamilies() [][]string { return [][]string{{IPv4}, {IPv6}} }

// addSyncSeries adds upstream kube-proxy's per-instance sync series (kubeproxy_*).
func (m *Metrics) addSyncSeries() {
	inst, instFam, families := []string{labelInstance}, instFamLabels(), ipFamilies()
	m.syncLatency = perInstance(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_duration_seconds",
		Help:      "SyncProxyRules latency in seconds",
		Buckets:   syncLatencyBuckets(),
	}, instFam), families...)
	m.syncFullLatency = perInstance(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_full_proxy_rules_duration_seconds",
		Help:      "SyncProxyRules latency in seconds for full resyncs",
		Buckets:   syncLatencyBuckets(),
	}, instFam), families...)
	m.syncPartialLatency = perInstance(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_partial_proxy_rules_duration_seconds",
		Help:      "SyncProxyRules latency in seconds for partial resyncs",
		Buckets:   syncLatencyBuckets(),
	}, instFam), families...)
	m.lastSync = perInstanceTimestamp(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_timestamp_seconds",
		Help:      "The last time proxy rules were successfully synced",
	}, instFam))
	m.lastQueued = perInstanceTimestamp(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
		Help:      "The last time a sync of proxy rules was queued",
	}, instFam))
	m.networkProgramming = perInstance(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "network_programming_duration_seconds",
		Help:      "In Cluster Network Programming Latency in seconds",
		Buckets:   networkProgrammingBuckets(),
	}, instFam), families...)
	m.endpointChangesPending = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_pending",
		Help:      "Pending proxy rules Endpoint changes",
	}, inst))
	m.endpointChangesTotal = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_total",
		Help:      "Cumulative proxy rules Endpoint changes",
	}, inst))
	m.serviceChangesPending = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_pending",
		Help:      "Pending proxy rules Service changes",
	}, inst))
	m.serviceChangesTotal = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_total",
		Help:      "Cumulative proxy rules Service changes",
	}, inst))
	// Upstream made this a gauge despite the _total suffix; the name is kept so
	// existing alerts still match.
	m.noLocalEndpoints = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_no_local_endpoints_total",
		Help:      "Number of services with a Local traffic policy and no endpoints",
	}, []string{labelInstance, labelIPFamily, labelTrafficPolicy}), product([]string{IPv4, IPv6}, []string{trafficPolicyInternal, trafficPolicyExternal})...)
	m.syncFailures = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_sync_failures_total",
		Help:      "Cumulative proxy nftables sync failures",
	}, instFam), families...)
	m.cleanupFailures = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_cleanup_failures_total",
		Help:      "Cumulative proxy nftables cleanup failures",
	}, instFam), families...)
}

// addProxyNodeSeries adds upstream kube-proxy's node-wide series: /healthz, /livez and
// the conntrack reconciler.
func (m *Metrics) addProxyNodeSeries() {
	m.healthz = nodeWide(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_healthz_total",
		Help:      "Cumulative proxy healthz HTTP status",
	}, []string{labelCode}))
	m.livez = nodeWide(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_livez_total",
		Help:      "Cumulative proxy livez HTTP status",
	}, []string{labelCode}))
	m.conntrackReconcilerDeleted = nodeWide(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_deleted_entries_total",
		Help:      "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{labelIPFamily}))
	m.conntrackReconcilerLatency = nodeWide(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_sync_duration_seconds",
		Help:      "ReconcileConntrackFlowsLatency latency in seconds",
		Buckets:   syncLatencyBuckets(),
	}, []string{labelIPFamily}))
}

// addInstanceSeries adds shardproxy's own per-instance series: up, stale, restarts,
// Services and endpoints, handovers, conntrack, guard refusals, sync operations.
func (m *Metrics) addInstanceSeries() {
	inst, instFam, families := []string{labelInstance}, instFamLabels(), ipFamilies()
	m.instanceUp = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "instance_up",
		Help:      "Whether the proxy instance is running and has synced its rules (1) or not (0)",
	}, inst))
	m.instanceStale = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "instance_stale",
		Help:      "Whether the proxy instance, while up, is behind its health bound (1): a queued update older than its health timeout, or a sync loop that finished no sync for twice it",
	}, inst))
	m.instanceRestarts = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: shardproxyNamespace,
		Name:      "instance_restarts_total",
		Help:      "Times the supervisor restarted the proxy instance",
	}, inst))
	m.instanceServices = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "instance_services",
		Help:      "Services currently owned by the proxy instance",
	}, inst))
	m.instanceEndpoints = perInstance(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "instance_endpoints",
		Help:      "Endpoints of the Services currently owned by the proxy instance",
	}, inst))
	// Labelled by two instances rather than one: ForgetInstance deletes it by hand.
	m.handovers = nodeWide(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: shardproxyNamespace,
		Name:      "handovers_total",
		Help:      "Services moved from one proxy instance to another",
	}, []string{labelFrom, labelTo}))
	m.conntrackDeleted = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: shardproxyNamespace,
		Name:      "conntrack_deleted_entries_total",
		Help:      "Conntrack entries deleted on behalf of the proxy instance",
	}, inst))
	m.conntrackFailures = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: shardproxyNamespace,
		Name:      "conntrack_cleanup_failures_total",
		Help:      "Conntrack cleanups after a sync of the proxy instance that failed: stale flows of that IP family may be left",
	}, instFam), families...)
	m.guardRefusals = perInstance(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: shardproxyNamespace,
		Name:      "guard_refusals_total",
		Help:      "Services a tenant guard of the proxy instance refused, counted when a Service's refusal begins or changes: guard=namespace (not programmed) or guard=address (user-set addresses dropped)",
	}, []string{labelInstance, labelGuard}), []string{GuardNamespace}, []string{GuardAddress})
	m.syncOperations = perInstance(m, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: shardproxyNamespace,
		Name:      "sync_operations",
		Help:      "nftables operations per sync transaction",
		Buckets:   syncOperationsBuckets(),
	}, []string{labelInstance, labelKind}), []string{kindFull}, []string{kindPartial})
}

// addInfoSeries adds what runs: the build and the configuration in force.
func (m *Metrics) addInfoSeries() {
	m.buildInfo = nodeWide(m, newBuildInfo())

	m.configInfo = nodeWide(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "config_info",
		Help:      "A metric with a constant '1' value labeled by the hash of the configuration file in force",
	}, []string{labelHash}))
	m.configApplied = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "config_applied_timestamp_seconds",
		Help:      "When the configuration in force was applied (at start, or by a live change), in seconds since the epoch",
	})
	m.registry.MustRegister(m.configApplied)
	m.nodeAddressesUp = nodeWide(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "published_node_addresses_up",
		Help:      "1 when the published node address list (otherNodeAddresses: published) was read and is valid, 0 while it is absent or unreadable (the last list read stays reserved)",
	}, []string{labelConfigMap}))
	m.nodeAddressesNodes = nodeWide(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: shardproxyNamespace,
		Name:      "published_node_addresses_nodes",
		Help:      "Nodes in the published node address list in use (otherNodeAddresses: published)",
	}, []string{labelConfigMap}))
	m.configReloads = nodeWide(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: shardproxyNamespace,
		Name:      "config_reloads_total",
		Help:      "Changed configuration files seen by the running supervisor, by result: applied, invalid (it does not validate) or refused (a node-wide field changed)",
	}, []string{labelResult}))
	for _, r := range []string{ReloadApplied, ReloadInvalid, ReloadRefused} {
		m.configReloads.WithLabelValues(r)
	}
}

// vector is a labelled collector whose series are of type T (a Counter, Gauge or
// Observer).
type vector[T any] interface {
	prometheus.Collector
	WithLabelValues(lvs ...string) T
	DeletePartialMatch(labels prometheus.Labels) int
}

// instanceVector is one registered vector with a proxy_instance label.
type instanceVector struct {
	// forget deletes the series of the label values given.
	forget func(prometheus.Labels) int
	// init creates an instance's series at zero; nil for timestamps.
	init func(instance string)
}

// nodeWide registers v, a vector without an instance label, on m's registry.
func nodeWide[V vector[T], T any](m *Metrics, v V) V {
	m.registry.MustRegister(v)
	return v
}

// perInstance registers v, a vector whose first label is the instance, on m's
// registry: ForgetInstance deletes its series, and InitInstance creates them at zero,
// one per combination of values in others for v's other labels (none: v has the
// instance label only).
func perInstance[V vector[T], T any](m *Metrics, v V, others ...[]string) V {
	m.registry.MustRegister(v)
	m.instanceVectors = append(m.instanceVectors, instanceVector{
		forget: v.DeletePartialMatch,
		init: func(instance string) {
			if len(others) == 0 {
				v.WithLabelValues(instance)
			}
			for _, o := range others {
				v.WithLabelValues(append([]string{instance}, o...)...)
			}
		},
	})
	return v
}

// product is every combination of one value of each list, in order.
func product(lists ...[]string) [][]string {
	out := [][]string{nil}
	for _, list := range lists {
		var next [][]string
		for _, prefix := range out {
			for _, v := range list {
				next = append(next, append(append([]string(nil), prefix...), v))
			}
		}
		out = next
	}
	return out
}

// perInstanceTimestamp is perInstance for a timestamp gauge: InitInstance leaves it
// out on purpose, as 0 would read as "last synced in 1970" and fire staleness alerts
// before the first sync.
func perInstanceTimestamp[V vector[T], T any](m *Metrics, v V) V {
	m.registry.MustRegister(v)
	m.instanceVectors = append(m.instanceVectors, instanceVector{forget: v.DeletePartialMatch})
	return v
}

// Registry returns the registry all of m's collectors are registered on,
// for callers that want to add their own or gather directly.
func (m *Metrics) Registry() *prometheus.Registry {
	return m.registry
}

// Handler returns the HTTP handler that serves m's registry in the
// Prometheus exposition format. Every call returns the same handler.
func (m *Metrics) Handler() http.Handler {
	return m.handler
}

// SetBuildInfo sets shardproxy_build_info to 1 for version and the Go version this
// binary was built with (its only series).
func (m *Metrics) SetBuildInfo(version string) { setBuildInfo(m.buildInfo, version) }

// The results of a changed configuration file, for shardproxy_config_reloads_total.
const (
	ReloadApplied = "applied"
	ReloadInvalid = "invalid"
	ReloadRefused = "refused"
)

// SetConfig records the configuration in force: its hash and when it was applied.
func (m *Metrics) SetConfig(hash string, applied time.Time) {
	m.configInfo.Reset()
	m.configInfo.WithLabelValues(hash).Set(1)
	m.configApplied.Set(float64(applied.UnixNano()) / 1e9)
}

// SetPublishedNodeAddresses records the state of the published node address list
// (namespace/name): whether it was read and is valid, and how many Nodes the list in use
// names.
func (m *Metrics) SetPublishedNodeAddresses(configMap string, up bool, nodes int) {
	v := 0.0
	if up {
		v = 1
	}
	m.nodeAddressesUp.WithLabelValues(configMap).Set(v)
	m.nodeAddressesNodes.WithLabelValues(configMap).Set(float64(nodes))
}

// ConfigReloaded counts a changed configuration file by its result (Reload*).
func (m *Metrics) ConfigReloaded(result string) {
	m.configReloads.WithLabelValues(result).Inc()
}

// InitInstance creates every per-instance series of instance at zero, so
// that rate(), increase() and absent() work before the first event (a
// counter that first appears at 1 loses that increment).
func (m *Metrics) InitInstance(instance string) {
	for _, v := range m.instanceVectors {
		if v.init != nil {
			v.init(instance)
		}
	}
}

// ObserveSync records that the sync of instance's rules of IP family family
// ("IPv4" or "IPv6") took d. It feeds the overall latency histogram and the
// full or partial one, as upstream does.
func (m *Metrics) ObserveSync(instance, family string, full bool, d time.Duration) {
	s := d.Seconds()
	m.syncLatency.WithLabelValues(instance, family).Observe(s)
	if full {
		m.syncFullLatency.WithLabelValues(instance, family).Observe(s)
	} else {
		m.syncPartialLatency.WithLabelValues(instance, family).Observe(s)
	}
}

// ObserveSyncOperations records that one sync of instance ran ops nft
// operations, over all its families.
func (m *Metrics) ObserveSyncOperations(instance string, full bool, ops int) {
	kind := kindPartial
	if full {
		kind = kindFull
	}
	m.syncOperations.WithLabelValues(instance, kind).Observe(float64(ops))
}

// SetLastSync records t as the time instance's rules of family were last
// synced successfully.
func (m *Metrics) SetLastSync(instance, family string, t time.Time) {
	m.lastSync.WithLabelValues(instance, family).Set(unixSeconds(t))
}

// SetLastQueued records t as the time a sync of instance's rules of family
// was last requested. Alerts compare it with the last sync to detect a hung
// proxy.
func (m *Metrics) SetLastQueued(instance, family string, t time.Time) {
	m.lastQueued.WithLabelValues(instance, family).Set(unixSeconds(t))
}

// ObserveNetworkProgramming records d, the time from a change to an
// Endpoint of family (its trigger time) until instance had programmed it.
func (m *Metrics) ObserveNetworkProgramming(instance, family string, d time.Duration) {
	m.networkProgramming.WithLabelValues(instance, family).Observe(d.Seconds())
}

// SyncFailed counts a failed nftables sync transaction of instance's rules
// of family.
func (m *Metrics) SyncFailed(instance, family string) {
	m.syncFailures.WithLabelValues(instance, family).Inc()
}

// CleanupFailed counts a failed removal of instance's stale nftables
// objects of family. The supervisor counts there each table of an instance
// removed from the configuration that it failed to delete, under that
// instance's name (upstream counts its failed deletions of stale chains).
func (m *Metrics) CleanupFailed(instance, family string) {
	m.cleanupFailures.WithLabelValues(instance, family).Inc()
}

// SetInstanceUp records whether instance is running.
func (m *Metrics) SetInstanceUp(instance string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.instanceUp.WithLabelValues(instance).Set(v)
}

// InstanceRestarted counts a restart of instance by the supervisor.
func (m *Metrics) InstanceRestarted(instance string) {
	m.instanceRestarts.WithLabelValues(instance).Inc()
}

// SetOwned records how many Services, and Endpoints of them, instance
// currently owns.
func (m *Metrics) SetOwned(instance string, services, endpoints int) {
	m.instanceServices.WithLabelValues(instance).Set(float64(services))
	m.instanceEndpoints.WithLabelValues(instance).Set(float64(endpoints))
}

// SetInstanceStale records whether instance, while up, is behind its health bound.
func (m *Metrics) SetInstanceStale(instance string, stale bool) {
	v := 0.0
	if stale {
		v = 1
	}
	m.instanceStale.WithLabelValues(instance).Set(v)
}

// Handover counts one Service moved from instance from to instance to.
func (m *Metrics) Handover(from, to string) {
	m.handovers.WithLabelValues(from, to).Inc()
}

// ConntrackDeleted counts n conntrack entries of IP family family ("IPv4"
// or "IPv6", as upstream labels it) deleted for instance. It feeds both
// shardproxy's per-instance counter and upstream's node-wide reconciler
// counter, which is labelled by ip_family only.
func (m *Metrics) ConntrackDeleted(instance string, family string, n int) {
	addCount(m.conntrackDeleted.WithLabelValues(instance), n)
	addCount(m.conntrackReconcilerDeleted.WithLabelValues(family), n)
}

// ObserveConntrackReconcile records how long one conntrack cleanup of IP family
// family ("IPv4" or "IPv6") took, as upstream's reconciler histogram does for each of
// its rounds; node-wide, like the reconciler's deleted counter.
func (m *Metrics) ObserveConntrackReconcile(family string, d time.Duration) {
	m.conntrackReconcilerLatency.WithLabelValues(family).Observe(d.Seconds())
}

// ConntrackCleanupFailed counts a conntrack cleanup of IP family family that failed
// after a sync of instance (the flows it was to delete may still be there).
func (m *Metrics) ConntrackCleanupFailed(instance, family string) {
	m.conntrackFailures.WithLabelValues(instance, family).Inc()
}

// GuardRefused counts a Service that a guard of instance refused (GuardNamespace or
// GuardAddress), once when the refusal begins or changes, not on every update while it
// lasts.
func (m *Metrics) GuardRefused(instance, guard string) {
	m.guardRefusals.WithLabelValues(instance, guard).Inc()
}

// SetPendingChanges records how many Services have a Service, respectively
// an Endpoint, change waiting for instance's next sync (upstream counts
// Services with pending changes too, not events).
func (m *Metrics) SetPendingChanges(instance string, services, endpoints int) {
	m.serviceChangesPending.WithLabelValues(instance).Set(float64(services))
	m.endpointChangesPending.WithLabelValues(instance).Set(float64(endpoints))
}

// AddChanges counts Service and Endpoint changes received for instance.
func (m *Metrics) AddChanges(instance string, services, endpoints int) {
	addCount(m.serviceChangesTotal.WithLabelValues(instance), services)
	addCount(m.endpointChangesTotal.WithLabelValues(instance), endpoints)
}

// SetNoLocalEndpoints records how many of instance's Service ports of
// family have a Local internal, respectively external, traffic policy and
// no local endpoints.
func (m *Metrics) SetNoLocalEndpoints(instance, family string, internal, external int) {
	m.noLocalEndpoints.WithLabelValues(instance, family, trafficPolicyInternal).Set(float64(internal))
	m.noLocalEndpoints.WithLabelValues(instance, family, trafficPolicyExternal).Set(float64(external))
}

// HealthzResult counts a /healthz response with HTTP status code. The
// health server is node-wide, one per supervisor, so the series has no
// instance label.
func (m *Metrics) HealthzResult(code int) {
	m.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
}

// LivezResult counts a /livez response with HTTP status code. Like
// HealthzResult it is node-wide and has no instance label.
func (m *Metrics) LivezResult(code int) {
	m.livez.WithLabelValues(strconv.Itoa(code)).Inc()
}

// ForgetInstance deletes every series of instance: those labelled with it
// and the handover series it is the source or destination of. Call it
// when an instance is removed from the configuration so that its series
// do not linger; a restart keeps its series (see InstanceRestarted).
// The node-wide series (healthz, livez, the reconciler's conntrack
// counter) are not per instance and are kept.
func (m *Metrics) ForgetInstance(instance string) {
	for _, v := range m.instanceVectors {
		v.forget(prometheus.Labels{labelInstance: instance})
	}
	m.handovers.DeletePartialMatch(prometheus.Labels{labelFrom: instance})
	m.handovers.DeletePartialMatch(prometheus.Labels{labelTo: instance})
}

// unixSeconds converts t to the float seconds Prometheus timestamps use,
// keeping sub-second precision.
func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}

// addCount adds n to c; a negative n, which a counter cannot take, is a
// caller bug and is ignored rather than panicking in the data path.
func addCount(c prometheus.Counter, n int) {
	if n > 0 {
		c.Add(float64(n))
	}
}
