// Package config is the supervisor's configuration file: its types, strict decoding,
// defaulting and validation. It is plain data; nothing here touches the network, the
// kernel or the API server.
//
// The life of a file is Decode (strict YAML, one document), Default (fill every unset
// field), Validate (report every problem at once). Load does all three.
package config

import (
	"net"
	"os"
	"strings"
	"time"

	"github.com/shardproxy/shardproxy/tables"
)

// APIVersion and Kind identify a supervisor configuration file.
const (
	APIVersion = "shardproxy.io/v1alpha1"
	Kind       = "SupervisorConfig"
)

// Defaults filled in by Default.
const (
	DefaultHealthzBindAddress = "0.0.0.0:10256"
	DefaultMetricsBindAddress = "127.0.0.1:10249"
	DefaultMasqueradeBit      = 14
	DefaultTablePrefix        = "shardproxy"
	DefaultStatusNamespace    = "shardproxy-system"
	// StatusDisabled as StatusNamespace turns the node status off.
	StatusDisabled = "-"

	DefaultConntrackMaxPerCore            int32 = 32768
	DefaultConntrackMin                   int32 = 131072
	DefaultConntrackTCPEstablishedTimeout       = 24 * time.Hour
	DefaultConntrackTCPCloseWaitTimeout         = time.Hour

	DefaultMinSyncPeriod  = time.Second
	DefaultSyncPeriod     = 30 * time.Second
	DefaultFullSyncPeriod = time.Hour
)

// Mark bits of other components that masqueradeBit must not take (Validate).
const (
	// KubeletDropBit is KUBE-MARK-DROP's bit (the kubelet's --iptables-drop-bit
	// default): kubelets before 1.27 (KEP-3178) drop packets carrying it, and other
	// components may still use that chain.
	KubeletDropBit = 15
	// KubeProxyMasqueradeBit is kube-proxy's --iptables-masquerade-bit default; it is
	// taken while kube-proxy runs beside the supervisor, which is so when no instance
	// is the default (kube-proxy then serves the unlabeled Services).
	KubeProxyMasqueradeBit = 14
	// DefaultMasqueradeBitAlongside is the default masqueradeBit when no instance is
	// the default: the highest bit neither kube-proxy's nor the kubelet's.
	DefaultMasqueradeBitAlongside = 13
)

// The values of otherNodeAddresses.
const (
	OtherNodeAddressesWatch     = "watch"
	OtherNodeAddressesPublished = "published"
)

// NodePortAddressesPrimary is the nodePortAddresses entry meaning "the node's primary IP
// of each family" (its first InternalIP, else its first ExternalIP), as kube-proxy's
// "primary". It must be the only entry when used; it is the default.
const NodePortAddressesPrimary = "primary"

// TablePrefixStart is how every tablePrefix begins: table names of other components
// (kube-proxy, CNI plugins, firewalls) never start with it.
const TablePrefixStart = "shardproxy"

// MaxTableNameLength bounds "<tablePrefix>-<name>" so table names stay readable in
// `nft list tables` and leave room for anything derived from them.
const MaxTableNameLength = 63

// Config is the supervisor's configuration file (apiVersion shardproxy.io/v1alpha1,
// kind SupervisorConfig): node-wide settings and the proxy instances to run.
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`

	// NodeName is this node's Node object name. Default: $NODE_NAME, else the host
	// name, lower-cased.
	NodeName string `yaml:"nodeName"`
	// Kubeconfig is the path of a kubeconfig file; empty means in-cluster config.
	Kubeconfig string `yaml:"kubeconfig"`
	// ClientConnection paces and encodes the API client, as kube-proxy's.
	ClientConnection ClientConnection `yaml:"clientConnection"`
	// HealthzBindAddress is the ip:port of the node health server. Default 0.0.0.0:10256.
	HealthzBindAddress string `yaml:"healthzBindAddress"`
	// MetricsBindAddress is the ip:port of the metrics server. Default 127.0.0.1:10249.
	MetricsBindAddress string `yaml:"metricsBindAddress"`
	// EnableProfiling serves Go's pprof handlers under /debug/pprof/ on the metrics
	// server, as kube-proxy's enableProfiling. Default false.
	EnableProfiling bool `yaml:"enableProfiling"`
	// MasqueradeBit is the packet mark bit (0..31) that asks for masquerading; shared by
	// every instance. A pointer so that an explicit 0 survives Default. Default 14, or
	// 13 when no instance is the default (beside kube-proxy, whose bit 14 is). Never 15
	// (KubeletDropBit), nor 14 without a default instance.
	MasqueradeBit *int `yaml:"masqueradeBit"`
	// TablePrefix starts every instance's table name ("<prefix>-<instance>").
	// Default "shardproxy". It must start with "shardproxy" (TablePrefixStart), so that
	// no table name the supervisor manages can be another component's (kube-proxy's
	// "kube-proxy", a CNI plugin's): the supervisor deletes tables of its prefix that no
	// instance has.
	TablePrefix string `yaml:"tablePrefix"`
	// StatusNamespace holds this node's status ConfigMap ("shardproxy-node-<node>"),
	// which `shardproxy migrate` reads to confirm Services are programmed in shadow.
	// Default "shardproxy-system" (deploy/ creates it, with a Role for exactly this);
	// "-" turns the node status off.
	StatusNamespace string `yaml:"statusNamespace"`
	// ServiceCIDRDrop drops, node-wide, new connections to addresses inside the
	// cluster's ServiceCIDRs that no proxy on the node translated (a deleted Service, an
	// unallocated address, a Service of a proxy name nothing here runs), as upstream
	// kube-proxy does, in the supervisor's table "<tablePrefix>_node"; off by itself
	// where the API server does not serve ServiceCIDRs. A pointer so that an explicit
	// false survives Default. Default true.
	ServiceCIDRDrop *bool `yaml:"serviceCIDRDrop"`
	// ReserveOtherNodeAddresses refuses, as a Service's externalIP or load-balancer IP,
	// the addresses of every Node of the cluster (status.addresses), not only this
	// node's: such an address would send this node's traffic to that node (kubelet, SSH)
	// to the Service's endpoints instead. It costs one watch of every Node, kept to name
	// and addresses in memory, which every node makes: cluster-wide its events grow with
	// the square of the nodes. It is made only where an instance serves user addresses
	// (tenant.externalIPCIDRs or loadBalancerCIDRs); no instance serves any without them.
	// A pointer so that an explicit false survives Default. Default true.
	ReserveOtherNodeAddresses *bool `yaml:"reserveOtherNodeAddresses"`
	// OtherNodeAddresses is where reserveOtherNodeAddresses learns the other Nodes'
	// addresses. "watch" (the default): a watch of every Node, whose events (every
	// Node's status updates, at least one per Node every 5 minutes) grow with the square
	// of the nodes cluster-wide. "published": a watch of one ConfigMap,
	// "shardproxy-nodeaddresses" in statusNamespace, which `shardproxy node-addresses`
	// (one writer, leader-elected) rewrites only when an address changes: events grow
	// with the nodes. While that ConfigMap is absent or unreadable the node reserves the
	// last list it read (none at start) and says so in /status and
	// shardproxy_published_node_addresses_up. Needs statusNamespace.
	OtherNodeAddresses string `yaml:"otherNodeAddresses"`
	// SharedTenants lets instances list the same namespaces and overlapping address
	// ranges: one team with several instances, or a namespace whose Services move
	// between named instances by label. Off (the default), validation refuses both: a
	// user of a shared namespace could pick either instance, and its address ranges, by
	// label. On, each address is still arbitrated node-wide at run time (the holder
	// keeps it).
	SharedTenants bool `yaml:"sharedTenants"`
	// ReservedCIDRs are ranges no Service's externalIP or load-balancer IP may take on
	// this node (the node subnet, management hosts), at no API cost.
	ReservedCIDRs []string `yaml:"reservedCIDRs"`
	// Conntrack holds the node-wide conntrack sysctls the supervisor sets once.
	Conntrack Conntrack `yaml:"conntrack"`
	// Instances are the proxies run side by side; at least one.
	Instances []Instance `yaml:"instances"`
}

// Conntrack holds the conntrack sysctls. Every field is a pointer so that an explicit 0,
// which means "leave the sysctl alone", differs from "unset, use the default".
type Conntrack struct {
	// MaxPerCore scales nf_conntrack_max with the CPU count. Default 32768; 0 leaves it.
	MaxPerCore *int32 `yaml:"maxPerCore"`
	// Min is the floor for nf_conntrack_max. Default 131072.
	Min *int32 `yaml:"min"`
	// TCPEstablishedTimeout is nf_conntrack_tcp_timeout_established. Default 24h; 0 leaves it.
	TCPEstablishedTimeout *Duration `yaml:"tcpEstablishedTimeout"`
	// TCPCloseWaitTimeout is nf_conntrack_tcp_timeout_close_wait. Default 1h; 0 leaves it.
	TCPCloseWaitTimeout *Duration `yaml:"tcpCloseWaitTimeout"`
	// UDPTimeout is nf_conntrack_udp_timeout. Default 0: leave it.
	UDPTimeout *Duration `yaml:"udpTimeout"`
	// UDPStreamTimeout is nf_conntrack_udp_timeout_stream. Default 0: leave it.
	UDPStreamTimeout *Duration `yaml:"udpStreamTimeout"`
}

// Instance is one proxy: one pair of nftables tables serving one slice of the Services.
type Instance struct {
	// Name names the instance and its tables; a DNS-1123 label, and
	// len(tablePrefix)+1+len(name) <= MaxTableNameLength.
	Name string `yaml:"name"`
	// Default makes the instance serve Services without the
	// service.kubernetes.io/service-proxy-name label. At most one instance may.
	Default bool `yaml:"default"`
	// ProxyNames are the values of service.kubernetes.io/service-proxy-name the
	// instance serves. Each value belongs to one instance. An instance must be default,
	// have proxy names, or both.
	ProxyNames []string `yaml:"proxyNames"`
	// Slot orders the instance's base chains among the others' (0..31, unique). It is
	// required rather than defaulted so that reordering the list never moves a table.
	Slot *int `yaml:"slot"`
	// Tenant narrows what the instance accepts from the Services it serves.
	Tenant Tenant `yaml:"tenant"`
	// NodePortAddresses are the CIDRs NodePorts are served on, or the single entry
	// "primary" (the node's primary IP of each family, as kube-proxy's: its first
	// InternalIP, else its first ExternalIP), which is the default.
	NodePortAddresses []string `yaml:"nodePortAddresses"`
	// DetectLocal says how traffic from local pods is told apart.
	DetectLocal DetectLocal `yaml:"detectLocal"`
	// MasqueradeAll masquerades every packet sent to a cluster IP.
	MasqueradeAll bool `yaml:"masqueradeAll"`
	// MinSyncPeriod is the least time between two syncs; 0 syncs on every change.
	// A pointer so that an explicit 0 survives Default. Default 1s.
	MinSyncPeriod *Duration `yaml:"minSyncPeriod"`
	// SyncPeriod is the periodic resync interval, and the base of the health timeout.
	// Default 30s; must be >= minSyncPeriod.
	SyncPeriod Duration `yaml:"syncPeriod"`
	// FullSyncPeriod is how often the whole table is rewritten rather than patched.
	// Default 1h (or syncPeriod, if that is longer); must be >= syncPeriod.
	FullSyncPeriod Duration `yaml:"fullSyncPeriod"`
	// MaxServiceElements bounds what one Service may bring into the instance's table,
	// in cost units: each nftables element is one (about ports × addresses × endpoints
	// of them), a rule 4, a ClientIP-affinity set 200 (one per endpoint and port), a
	// loadBalancerSourceRanges element 88, weighed by what each costs the kernel
	// (tables/README.md, "Size limits"). A Service over it is not programmed, with a
	// ServiceTooLarge event, and the instance keeps syncing the others. 0: the default
	// (instance.DefaultMaxServiceElements, 200,000); -1: no limit.
	MaxServiceElements int `yaml:"maxServiceElements"`
	// MaxInstanceCost bounds the cost units of all the instance's Services together,
	// and with them the kernel time of a full sync under the commit lock every instance
	// shares. A Service that would take the instance over it is refused as one over
	// maxServiceElements; those already programmed keep their place. 0: the default
	// (instance.DefaultMaxInstanceCost, 4,000,000); -1: no limit.
	MaxInstanceCost int `yaml:"maxInstanceCost"`
	// LoadBalancing is how the instance's Services pick endpoints (loadbalancing.go).
	LoadBalancing LoadBalancing `yaml:"loadBalancing"`
}

// Tenant restricts an instance to part of what its Services ask for. Every guard is
// closed unless configured: a Service user cannot widen it.
type Tenant struct {
	// Namespaces are the only namespaces whose Services are served. Required for an
	// instance that is not the default; empty on the default instance means every
	// namespace (the default instance serves unlabeled Services, as kube-proxy does).
	Namespaces []string `yaml:"namespaces"`
	// ExternalIPCIDRs are the only ranges spec.externalIPs are accepted from; the others
	// are ignored. Empty means no external IPs are served.
	ExternalIPCIDRs []string `yaml:"externalIPCIDRs"`
	// LoadBalancerCIDRs are the only ranges status.loadBalancer.ingress IPs are
	// accepted from; the others are ignored. Empty means no load-balancer ingress IPs
	// are served.
	LoadBalancerCIDRs []string `yaml:"loadBalancerCIDRs"`
}

// DetectLocal configures local-traffic detection. Mode is one of the tables.LocalMode
// values ("" turns detection off); each mode but NodeCIDR needs its own field, and
// fields of other modes must be empty. NodeCIDR mode reads the Node's .spec.podCIDRs at
// run time.
type DetectLocal struct {
	// Mode is "", "ClusterCIDR", "NodeCIDR", "BridgeInterface" or "InterfaceNamePrefix".
	Mode string `yaml:"mode"`
	// ClusterCIDRs are the cluster's pod CIDRs, at most one per family (ClusterCIDR).
	ClusterCIDRs []string `yaml:"clusterCIDRs"`
	// BridgeInterface is the pods' bridge (BridgeInterface).
	BridgeInterface string `yaml:"bridgeInterface"`
	// InterfaceNamePrefix is the name prefix of pod interfaces (InterfaceNamePrefix).
	InterfaceNamePrefix string `yaml:"interfaceNamePrefix"`
}

// TableName is the name of the instance's tables: "<prefix>-<name>".
func (i *Instance) TableName(prefix string) string {
	return tables.TableName(prefix, i.Name)
}

// SupervisorIdentity names this supervisor in its tables' ownership marker
// (tables.OwnerComment): the node and the port of healthzBindAddress, the one address two
// supervisors on a node cannot share. Two supervisors with the same tablePrefix then
// tell their tables apart, and neither deletes the other's as a removed instance's.
// Changing the port changes the identity: the previous tables are then another
// supervisor's to this one (see docs/security.md).
func (c *Config) SupervisorIdentity() string {
	port := c.HealthzBindAddress
	if _, p, err := net.SplitHostPort(c.HealthzBindAddress); err == nil {
		port = p
	}
	return c.NodeName + ":" + port
}

// Default fills every unset field, taking the node name from $NODE_NAME or the host name.
func (c *Config) Default() {
	c.DefaultWith(os.Getenv, os.Hostname)
}

// DefaultWith is Default with the environment and host name lookups injected. A failing
// hostname leaves NodeName empty, which Validate reports.
func (c *Config) DefaultWith(getenv func(string) string, hostname func() (string, error)) {
	if c.NodeName == "" && getenv != nil {
		c.NodeName = strings.ToLower(strings.TrimSpace(getenv("NODE_NAME")))
	}
	if c.NodeName == "" && hostname != nil {
		if h, err := hostname(); err == nil {
			c.NodeName = strings.ToLower(strings.TrimSpace(h))
		}
	}
	c.ClientConnection.Default()
	if c.HealthzBindAddress == "" {
		c.HealthzBindAddress = DefaultHealthzBindAddress
	}
	if c.MetricsBindAddress == "" {
		c.MetricsBindAddress = DefaultMetricsBindAddress
	}
	if c.MasqueradeBit == nil {
		c.MasqueradeBit = ptr(DefaultMasqueradeBit)
		if !c.hasDefaultInstance() {
			c.MasqueradeBit = ptr(DefaultMasqueradeBitAlongside)
		}
	}
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultTablePrefix
	}
	if c.StatusNamespace == "" {
		c.StatusNamespace = DefaultStatusNamespace
	}
	if c.ServiceCIDRDrop == nil {
		c.ServiceCIDRDrop = ptr(true)
	}
	if c.ReserveOtherNodeAddresses == nil {
		c.ReserveOtherNodeAddresses = ptr(true)
	}
	if c.OtherNodeAddresses == "" {
		c.OtherNodeAddresses = OtherNodeAddressesWatch
	}

	ct := &c.Conntrack
	if ct.MaxPerCore == nil {
		ct.MaxPerCore = ptr(DefaultConntrackMaxPerCore)
	}
	if ct.Min == nil {
		ct.Min = ptr(DefaultConntrackMin)
	}
	if ct.TCPEstablishedTimeout == nil {
		ct.TCPEstablishedTimeout = &Duration{DefaultConntrackTCPEstablishedTimeout}
	}
	if ct.TCPCloseWaitTimeout == nil {
		ct.TCPCloseWaitTimeout = &Duration{DefaultConntrackTCPCloseWaitTimeout}
	}
	if ct.UDPTimeout == nil {
		ct.UDPTimeout = &Duration{}
	}
	if ct.UDPStreamTimeout == nil {
		ct.UDPStreamTimeout = &Duration{}
	}

	for i := range c.Instances {
		c.Instances[i].defaults()
	}
}

// WatchesOtherNodes tells whether the supervisor reserves the other Nodes' addresses,
// watching every Node or the published list (OtherNodeAddresses): ReserveOtherNodeAddresses
// is on and an instance serves user addresses (externalIPs or load-balancer IPs: its
// tenant lists ranges for them).
func (c *Config) WatchesOtherNodes() bool {
	if c.ReserveOtherNodeAddresses == nil || !*c.ReserveOtherNodeAddresses {
		return false
	}
	for i := range c.Instances {
		if t := c.Instances[i].Tenant; len(t.ExternalIPCIDRs) > 0 || len(t.LoadBalancerCIDRs) > 0 {
			return true
		}
	}
	return false
}

// PublishedNodeAddresses tells whether the supervisor reads the other Nodes' addresses
// from the published list rather than a watch of every Node.
func (c *Config) PublishedNodeAddresses() bool {
	return c.WatchesOtherNodes() && c.OtherNodeAddresses == OtherNodeAddressesPublished
}

// hasDefaultInstance reports whether an instance serves the unlabeled Services. When
// none does, something else on the node does: kube-proxy, in every deployment this
// project documents (deploy/overlays/alongside-kube-proxy).
func (c *Config) hasDefaultInstance() bool {
	for i := range c.Instances {
		if c.Instances[i].Default {
			return true
		}
	}
	return false
}

func (in *Instance) defaults() {
	if len(in.NodePortAddresses) == 0 {
		in.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	if in.MinSyncPeriod == nil {
		in.MinSyncPeriod = &Duration{DefaultMinSyncPeriod}
	}
	if in.SyncPeriod.Duration == 0 {
		in.SyncPeriod.Duration = DefaultSyncPeriod
	}
	if in.FullSyncPeriod.Duration == 0 {
		in.FullSyncPeriod.Duration = max(DefaultFullSyncPeriod, in.SyncPeriod.Duration)
	}
}

func ptr[T any](v T) *T { return &v }
