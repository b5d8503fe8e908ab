package tables

import (
	"fmt"
	"net/netip"
	"time"
)

// Family is the IP family one table pair member serves.
type Family int

const (
	// IPv4 is served by the `ip` table.
	IPv4 Family = 4
	// IPv6 is served by the `ip6` table.
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Contains reports whether addr belongs to this family.
func (f Family) Contains(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	if f == IPv6 {
		return addr.Is6() && !addr.Is4In6()
	}
	return addr.Is4()
}

// Protocol is a transport protocol a Service port can use.
type Protocol string

const (
	// TCP is the default Service protocol.
	TCP Protocol = "tcp"
	// UDP needs conntrack cleanup when endpoints change.
	UDP Protocol = "udp"
	// SCTP is programmed like TCP and UDP.
	SCTP Protocol = "sctp"
)

// ServicePortName identifies one port of one Service.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the port's name; empty for a single unnamed port
	Protocol  Protocol
}

// String returns "namespace/name:port" the way kube-proxy prints it.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return fmt.Sprintf("%s/%s", n.Namespace, n.Name)
	}
	return fmt.Sprintf("%s/%s:%s", n.Namespace, n.Name, n.Port)
}

// Endpoint is one backend address of a Service port.
type Endpoint struct {
	IP   netip.Addr
	Port uint16
}

// String returns "ip:port" ("[ip]:port" for IPv6).
func (e Endpoint) String() string {
	return netip.AddrPortFrom(e.IP, e.Port).String()
}

// ServicePort is everything the compiler needs about one Service port in one IP family:
// every address it is reached on and the endpoints behind it, already filtered by
// readiness and topology. It carries no Kubernetes API types on purpose, so the compiler
// can be driven by plain data (tests, `render`).
type ServicePort struct {
	Name     ServicePortName
	Protocol Protocol
	// Port is .spec.ports[].port, served on the cluster IP, external IPs and LB IPs.
	Port uint16
	// NodePort is .spec.ports[].nodePort; zero when the port has none.
	NodePort uint16

	// ClusterIP is the Service's cluster IP of this family; invalid when it has none,
	// in which case the Service gets no rules in this family at all.
	ClusterIP       netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// SourceRanges is .spec.loadBalancerSourceRanges of this family; it firewalls the
	// LoadBalancerIPs (only them, as upstream does).
	SourceRanges []netip.Prefix

	// InternalLocal is internalTrafficPolicy: Local.
	InternalLocal bool
	// ExternalLocal is externalTrafficPolicy: Local.
	ExternalLocal bool

	// AffinityTimeout is the ClientIP session affinity timeout; zero means no affinity.
	// Affinity comes first: a remembered client returns to its endpoint, and only new
	// clients are placed by LoadBalancing.
	AffinityTimeout time.Duration
	// LoadBalancing is how new connections pick an endpoint; "" is LBRandom.
	LoadBalancing LBMode

	// ClusterEndpoints are the endpoints "Cluster" traffic policy uses: ready (or, when
	// none is ready anywhere, serving and terminating) and filtered by topology.
	ClusterEndpoints []Endpoint
	// LocalEndpoints are this node's endpoints for "Local" traffic policy: ready, or
	// serving and terminating when none local is ready.
	LocalEndpoints []Endpoint
	// HasEndpoints says the Service has a usable endpoint somewhere in the cluster; false
	// means traffic to it is rejected, true with no endpoint for a policy means dropped.
	HasEndpoints bool

	// Claim decides who keeps an entry (address . protocol . port) several Services
	// want: the older claim. The same for every port of a Service.
	Claim Claim
}

// Claim is the age of a Service's claim on its addresses: its creation time, then its
// UID. Never its name, which a user chooses; Services with equal claims (none set, in
// tests and `render` of objects without them) fall back to namespace/name order.
type Claim struct {
	Created time.Time
	UID     string
}

// before reports whether c is older than o.
func (c Claim) before(o Claim) bool {
	if !c.Created.Equal(o.Created) {
		return c.Created.Before(o.Created)
	}
	return c.UID < o.UID
}

// internalEndpoints are the endpoints for cluster IP traffic.
func (sp *ServicePort) internalEndpoints() []Endpoint {
	if sp.InternalLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// externalEndpoints are the endpoints for traffic from outside the cluster to external
// IPs, LB IPs and NodePorts.
func (sp *ServicePort) externalEndpoints() []Endpoint {
	if sp.ExternalLocal {
		return sp.LocalEndpoints
	}
	return sp.ClusterEndpoints
}

// hasExternal reports whether the port can be reached from outside the cluster.
func (sp *ServicePort) hasExternal(nodePortIPs []netip.Addr) bool {
	return len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0 || (sp.NodePort != 0 && len(nodePortIPs) > 0)
}

// LocalTraffic says how the instance tells traffic from this node's pods apart from
// traffic from outside the cluster ("detect-local" in kube-proxy).
type LocalTraffic struct {
	// Mode is one of the LocalMode constants; LocalNone turns the detection off.
	Mode LocalMode
	// CIDRs are the pod CIDRs of this family (ClusterCIDR and NodeCIDR modes).
	CIDRs []netip.Prefix
	// Interface is the bridge name (BridgeInterface) or the name prefix
	// (InterfaceNamePrefix) of pod interfaces.
	Interface string
}

// LocalMode is a way of detecting traffic from local pods.
type LocalMode string

const (
	// LocalNone: no detection; off-cluster traffic to cluster IPs is not masqueraded
	// and pod traffic to external IPs is not short-circuited.
	LocalNone LocalMode = ""
	// LocalClusterCIDR: sources in the cluster's pod CIDRs are local.
	LocalClusterCIDR LocalMode = "ClusterCIDR"
	// LocalNodeCIDR: sources in this node's pod CIDRs are local.
	LocalNodeCIDR LocalMode = "NodeCIDR"
	// LocalBridgeInterface: packets arriving on the named bridge are local.
	LocalBridgeInterface LocalMode = "BridgeInterface"
	// LocalInterfaceNamePrefix: packets arriving on interfaces with the prefix are local.
	LocalInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// Config is one instance's settings for one family's table.
type Config struct {
	// Family picks the `ip` or `ip6` table.
	Family Family
	// TablePrefix and Instance make the table name "<prefix>-<instance>".
	TablePrefix string
	Instance    string
	// Supervisor identifies the supervisor that owns the table, in its ownership marker
	// (OwnerComment), so that another supervisor with the same prefix leaves it alone.
	Supervisor string
	// Slot orders this instance's base chains among the other instances'; see priority.go.
	Slot int
	// MasqueradeBit is the packet mark bit that asks for masquerading (default 14).
	MasqueradeBit int
	// MasqueradeAll masquerades every packet sent to a cluster IP.
	MasqueradeAll bool
	// Local detects traffic from local pods.
	Local LocalTraffic
	// NodePortIPs are the node addresses of this family NodePorts are served on
	// (nodePortAddresses resolved against the node's interfaces). Loopback addresses are
	// never used, whatever is passed.
	NodePortIPs []netip.Addr
	// NodeIPs are this node's addresses of this family; a LoadBalancerSourceRange that
	// holds one of them admits traffic from the node itself.
	NodeIPs []netip.Addr
	// ConsistentHash is whether Service ports of this instance may be consistentHash
	// (the instance's mode, or one its Services may ask for). Only then does the table
	// hold the rotation chains and their map of slots: 128 chains that an instance
	// without consistentHash would only show in every listing. A consistentHash port
	// without it still works, with the slot a hash of the whole client address (the
	// evenness of tables of other sizes).
	ConsistentHash bool
}

// TableName is the name of the instance's table in this family (see the function
// TableName).
func (c *Config) TableName() string {
	return TableName(c.TablePrefix, c.Instance)
}
