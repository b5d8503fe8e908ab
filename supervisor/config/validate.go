package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/shardproxy/shardproxy/tables"
)

// maxInterfaceNameLength is IFNAMSIZ-1: the longest Linux interface name.
const maxInterfaceNameLength = 15

// Validate reports every problem in c at once, joined with errors.Join, each as
// "field.path: problem". It expects Default to have run; unset pointers are skipped
// rather than reported, except the required instances[].slot.
func (c *Config) Validate() error {
	var p problems

	switch {
	case c.NodeName == "":
		p.add("nodeName", "required: set it, or NODE_NAME in the environment")
	default:
		if msgs := content.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
			p.add("nodeName", "%q is not a valid node name: %s", c.NodeName, strings.Join(msgs, "; "))
		}
	}

	healthz, healthzOK := p.hostPort("healthzBindAddress", c.HealthzBindAddress)
	metrics, metricsOK := p.hostPort("metricsBindAddress", c.MetricsBindAddress)
	if healthzOK && metricsOK && healthz.port == metrics.port &&
		(healthz.host == metrics.host || healthz.unspecified() || metrics.unspecified()) {
		p.add("metricsBindAddress", "%q overlaps healthzBindAddress %q", c.MetricsBindAddress, c.HealthzBindAddress)
	}

	c.ClientConnection.validate(&p)
	c.validateMasqueradeBit(&p)

	if c.StatusNamespace != StatusDisabled {
		if msgs := content.IsDNS1123Label(c.StatusNamespace); len(msgs) > 0 {
			p.add("statusNamespace", "%q is not a namespace name (or \"-\" for none): %s", c.StatusNamespace, strings.Join(msgs, "; "))
		}
	}
	switch c.OtherNodeAddresses {
	case OtherNodeAddressesWatch, "":
	case OtherNodeAddressesPublished:
		if c.StatusNamespace == StatusDisabled {
			p.add("otherNodeAddresses", "%q needs statusNamespace, the namespace of the published list, not %q", c.OtherNodeAddresses, StatusDisabled)
		}
	default:
		p.add("otherNodeAddresses", "%q is not one of %q, %q", c.OtherNodeAddresses, OtherNodeAddressesWatch, OtherNodeAddressesPublished)
	}
	prefixOK := true
	switch {
	case c.TablePrefix == "":
		p.add("tablePrefix", "required")
		prefixOK = false
	default:
		if msgs := content.IsDNS1123Label(c.TablePrefix); len(msgs) > 0 {
			p.add("tablePrefix", "%q is not valid: %s", c.TablePrefix, strings.Join(msgs, "; "))
			prefixOK = false
		} else if !strings.HasPrefix(c.TablePrefix, TablePrefixStart) {
			p.add("tablePrefix", "%q does not start with %q: table names of other components (kube-proxy, CNI plugins) must be out of reach of the supervisor's cleanup of unconfigured tables",
				c.TablePrefix, TablePrefixStart)
			prefixOK = false
		}
	}

	p.cidrList("reservedCIDRs", c.ReservedCIDRs)
	c.Conntrack.validate(&p, "conntrack")
	c.validateInstances(&p, prefixOK)
	c.validateTenants(&p)
	return errors.Join(p...)
}

// validateMasqueradeBit refuses a bit out of range or one another component marks
// with: the kubelet's drop bit always, kube-proxy's masquerade bit when it runs beside.
func (c *Config) validateMasqueradeBit(p *problems) {
	if c.MasqueradeBit == nil {
		return
	}
	switch bit := *c.MasqueradeBit; {
	case bit < 0 || bit > 31:
		p.add("masqueradeBit", "%d is out of range [0, 31]", bit)
	case bit == KubeletDropBit:
		other := KubeProxyMasqueradeBit
		if !c.hasDefaultInstance() {
			other = DefaultMasqueradeBitAlongside
		}
		p.add("masqueradeBit", "%d is the drop mark of KUBE-MARK-DROP (the kubelet's --iptables-drop-bit default): "+
			"kubelets before 1.27 drop packets carrying it, and other components may still; choose another bit, such as %d",
			bit, other)
	case bit == KubeProxyMasqueradeBit && !c.hasDefaultInstance():
		p.add("masqueradeBit", "%d is kube-proxy's masquerade bit (--iptables-masquerade-bit default), and with no default instance "+
			"kube-proxy runs beside this supervisor and serves the unlabeled Services: choose a bit of shardproxy's own that no other "+
			"component on the node uses, such as %d (the default here)", bit, DefaultMasqueradeBitAlongside)
	}
}

// validateTenants checks what two tenants must not share. A namespace: a user there
// could pick either instance by label, and with it the other tenant's address ranges.
// An address of externalIPCIDRs, or of loadBalancerCIDRs: the guard would not keep the
// tenants' Services apart. One tenant's external range may overlap another's
// load-balancer range: the two guards filter different writers (Service users, the
// load-balancer controller), and a collision of two claims is settled per address at
// run time, the holder keeping it. Each conflict is reported on the later entry,
// naming the earlier one. SharedTenants allows it all.
func (c *Config) validateTenants(p *problems) {
	if c.SharedTenants {
		return
	}
	owner := map[string]int{} // namespace -> the first instance listing it
	for i := range c.Instances {
		for j, ns := range c.Instances[i].Tenant.Namespaces {
			if len(content.IsDNS1123Label(ns)) > 0 {
				continue // reported by Instance.validate
			}
			k, taken := owner[ns]
			switch {
			case !taken:
				owner[ns] = i
			case k != i: // twice in one instance is Instance.validate's
				p.add(fmt.Sprintf("instances[%d].tenant.namespaces[%d]", i, j),
					"%q is already listed by instance %s: a namespace belongs to one tenant (its users could choose either instance, and its address ranges, by label)",
					ns, c.instanceRef(k))
			}
		}
	}

	c.validateDisjoint(p, "externalIPCIDRs", func(t *Tenant) []string { return t.ExternalIPCIDRs })
	c.validateDisjoint(p, "loadBalancerCIDRs", func(t *Tenant) []string { return t.LoadBalancerCIDRs })
}

// validateDisjoint reports each range of the tenant field that overlaps (holds, or is
// inside) one of another instance's, once for each other instance.
func (c *Config) validateDisjoint(p *problems, field string, list func(*Tenant) []string) {
	type claim struct {
		instance int
		path     string
		prefix   netip.Prefix
	}
	var claims []claim
	for i := range c.Instances {
		for j, s := range list(&c.Instances[i].Tenant) {
			pr, err := netip.ParsePrefix(s)
			if err != nil || pr.Masked() != pr || pr.Addr().Is4In6() {
				continue // reported by Instance.validate
			}
			claims = append(claims, claim{i, fmt.Sprintf("instances[%d].tenant.%s[%d]", i, field, j), pr})
		}
	}
	for b, later := range claims {
		named := map[int]bool{} // one error for each other instance overlapped
		for _, earlier := range claims[:b] {
			if earlier.instance == later.instance || named[earlier.instance] || !earlier.prefix.Overlaps(later.prefix) {
				continue
			}
			named[earlier.instance] = true
			p.add(later.path, "%q overlaps %q of instance %s (%s): two tenants' Services could claim one address",
				later.prefix, earlier.prefix, c.instanceRef(earlier.instance), earlier.path)
		}
	}
}

func (ct *Conntrack) validate(p *problems, path string) {
	if ct.MaxPerCore != nil && *ct.MaxPerCore < 0 {
		p.add(path+".maxPerCore", "must not be negative")
	}
	if ct.Min != nil && *ct.Min < 0 {
		p.add(path+".min", "must not be negative")
	}
	for _, d := range []struct {
		name string
		d    *Duration
	}{
		{"tcpEstablishedTimeout", ct.TCPEstablishedTimeout},
		{"tcpCloseWaitTimeout", ct.TCPCloseWaitTimeout},
		{"udpTimeout", ct.UDPTimeout},
		{"udpStreamTimeout", ct.UDPStreamTimeout},
	} {
		if d.d != nil && d.d.Duration < 0 {
			p.add(path+"."+d.name, "must not be negative")
		}
	}
}

// validateInstances checks each instance and what instances must not share: names,
// slots, proxy names and the default role.
func (c *Config) validateInstances(p *problems, prefixOK bool) {
	if len(c.Instances) == 0 {
		p.add("instances", "at least one instance is required")
		return
	}
	// Past the slots, some slot is used twice whatever the file says: that is this
	// error, not one for each instance.
	tooMany := len(c.Instances) > tables.MaxSlots
	if tooMany {
		p.add("instances", "%d instances, more than the %d slots of a node: each instance needs a slot of its own, "+
			"a priority no other instance has on every hook (tables/README.md, \"Hooks and priorities\")",
			len(c.Instances), tables.MaxSlots)
	}
	names := map[string]int{}
	slots := map[int]int{}
	proxyNames := map[string]int{}
	var defaults []string

	for i := range c.Instances {
		in := &c.Instances[i]
		path := fmt.Sprintf("instances[%d]", i)

		switch {
		case in.Name == "":
			p.add(path+".name", "required")
		default:
			if msgs := content.IsDNS1123Label(in.Name); len(msgs) > 0 {
				p.add(path+".name", "%q is not valid: %s", in.Name, strings.Join(msgs, "; "))
			} else if prefixOK {
				if t := in.TableName(c.TablePrefix); len(t) > MaxTableNameLength {
					p.add(path+".name", "table name %q is %d characters, more than %d: shorten the name or tablePrefix",
						t, len(t), MaxTableNameLength)
				}
			}
			if k, dup := names[in.Name]; dup {
				p.add(path+".name", "%q is used by instances[%d]", in.Name, k)
			} else {
				names[in.Name] = i
			}
		}

		switch {
		case in.Slot == nil:
			p.add(path+".slot", "required: a number in [0, %d], unique among instances", tables.MaxSlots-1)
		case *in.Slot < 0 || *in.Slot >= tables.MaxSlots:
			p.add(path+".slot", "%d is out of range [0, %d]", *in.Slot, tables.MaxSlots-1)
		default:
			if k, dup := slots[*in.Slot]; dup {
				if !tooMany {
					p.add(path+".slot", "%d is already used by %s", *in.Slot, c.instanceRef(k))
				}
			} else {
				slots[*in.Slot] = i
			}
		}

		if in.Default {
			defaults = append(defaults, c.instanceRef(i))
		}
		seen := map[string]bool{}
		for j, pn := range in.ProxyNames {
			pp := fmt.Sprintf("%s.proxyNames[%d]", path, j)
			if pn == "" {
				p.add(pp, "must not be empty")
				continue
			}
			if msgs := content.IsLabelValue(pn); len(msgs) > 0 {
				p.add(pp, "%q is not a valid label value: %s", pn, strings.Join(msgs, "; "))
				continue
			}
			switch k, taken := proxyNames[pn]; {
			case seen[pn]:
				p.add(pp, "%q is listed twice", pn)
			case taken:
				p.add(pp, "%q is already served by instance %s", pn, c.instanceRef(k))
			default:
				proxyNames[pn] = i
			}
			seen[pn] = true
		}
		if !in.Default && len(in.ProxyNames) == 0 {
			p.add(path, "serves nothing: set default: true or proxyNames")
		}
		if !in.Default && len(in.Tenant.Namespaces) == 0 {
			p.add(path+".tenant.namespaces", "required for an instance that is not the default: list the namespaces whose Services it may serve")
		}

		in.validate(p, path)
	}

	if len(defaults) > 1 {
		p.add("instances", "%s default instances (%s): at most one may serve Services without the service-proxy-name label",
			countWord(len(defaults)), joinAnd(defaults))
	}
}

// validate checks what concerns one instance alone.
func (in *Instance) validate(p *problems, path string) {
	seen := map[string]bool{}
	for j, ns := range in.Tenant.Namespaces {
		np := fmt.Sprintf("%s.tenant.namespaces[%d]", path, j)
		if msgs := content.IsDNS1123Label(ns); len(msgs) > 0 {
			p.add(np, "%q is not a valid namespace name: %s", ns, strings.Join(msgs, "; "))
		} else if seen[ns] {
			p.add(np, "%q is listed twice", ns)
		}
		seen[ns] = true
	}
	p.cidrList(path+".tenant.externalIPCIDRs", in.Tenant.ExternalIPCIDRs)
	p.cidrList(path+".tenant.loadBalancerCIDRs", in.Tenant.LoadBalancerCIDRs)

	cidrs := map[netip.Prefix]bool{}
	for j, a := range in.NodePortAddresses {
		ep := fmt.Sprintf("%s.nodePortAddresses[%d]", path, j)
		switch {
		case a != NodePortAddressesPrimary:
			p.cidr(ep, a, cidrs)
		case len(in.NodePortAddresses) > 1:
			p.add(ep, "%q must be the only entry", a)
		}
	}

	in.DetectLocal.validate(p, path+".detectLocal")
	in.LoadBalancing.validate(p, path+".loadBalancing")

	if in.MinSyncPeriod != nil && in.MinSyncPeriod.Duration < 0 {
		p.add(path+".minSyncPeriod", "must not be negative")
	}
	switch {
	case in.SyncPeriod.Duration <= 0:
		p.add(path+".syncPeriod", "must be positive")
	case in.MinSyncPeriod != nil && in.SyncPeriod.Duration < in.MinSyncPeriod.Duration:
		p.add(path+".syncPeriod", "%v is shorter than minSyncPeriod %v", in.SyncPeriod.Duration, in.MinSyncPeriod.Duration)
	}
	switch {
	case in.FullSyncPeriod.Duration <= 0:
		p.add(path+".fullSyncPeriod", "must be positive")
	case in.SyncPeriod.Duration > 0 && in.FullSyncPeriod.Duration < in.SyncPeriod.Duration:
		p.add(path+".fullSyncPeriod", "%v is shorter than syncPeriod %v", in.FullSyncPeriod.Duration, in.SyncPeriod.Duration)
	}
	if in.MaxServiceElements < -1 {
		p.add(path+".maxServiceElements", "%d is not a limit: use a positive number, 0 for the default or -1 for none", in.MaxServiceElements)
	}
	if in.MaxInstanceCost < -1 {
		p.add(path+".maxInstanceCost", "%d is not a limit: use a positive number, 0 for the default or -1 for none", in.MaxInstanceCost)
	}
}

func (d *DetectLocal) validate(p *problems, path string) {
	var uses string // the field the mode needs; the others must be empty
	switch tables.LocalMode(d.Mode) {
	case tables.LocalNone, tables.LocalNodeCIDR:
	case tables.LocalClusterCIDR:
		uses = "clusterCIDRs"
		if len(d.ClusterCIDRs) == 0 {
			p.add(path+".clusterCIDRs", "required with mode ClusterCIDR")
		}
		prefixes := p.cidrList(path+".clusterCIDRs", d.ClusterCIDRs)
		var v4, v6 bool
		for j, pr := range prefixes {
			if !pr.IsValid() {
				continue
			}
			first := &v6
			if pr.Addr().Is4() {
				first = &v4
			}
			if *first {
				p.add(fmt.Sprintf("%s.clusterCIDRs[%d]", path, j), "%q is a second %s CIDR: at most one per family",
					d.ClusterCIDRs[j], familyName(pr))
			}
			*first = true
		}
	case tables.LocalBridgeInterface:
		uses = "bridgeInterface"
		p.interfaceName(path+".bridgeInterface", d.BridgeInterface, "BridgeInterface")
	case tables.LocalInterfaceNamePrefix:
		uses = "interfaceNamePrefix"
		p.interfaceName(path+".interfaceNamePrefix", d.InterfaceNamePrefix, "InterfaceNamePrefix")
	default:
		p.add(path+".mode", "%q is not one of %q, %q, %q, %q (or empty for none)", d.Mode,
			tables.LocalClusterCIDR, tables.LocalNodeCIDR, tables.LocalBridgeInterface, tables.LocalInterfaceNamePrefix)
		return
	}
	for _, f := range []struct {
		name, mode string
		set        bool
	}{
		{"clusterCIDRs", string(tables.LocalClusterCIDR), len(d.ClusterCIDRs) > 0},
		{"bridgeInterface", string(tables.LocalBridgeInterface), d.BridgeInterface != ""},
		{"interfaceNamePrefix", string(tables.LocalInterfaceNamePrefix), d.InterfaceNamePrefix != ""},
	} {
		if f.set && f.name != uses {
			p.add(path+"."+f.name, "only used with mode %s, but mode is %q", f.mode, d.Mode)
		}
	}
}

// instanceRef names instance k for messages: its name, quoted, or its index if it has none.
func (c *Config) instanceRef(k int) string {
	if n := c.Instances[k].Name; n != "" {
		return strconv.Quote(n)
	}
	return fmt.Sprintf("instances[%d]", k)
}

// problems collects validation errors, each "path: message".
type problems []error

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

// cidrList checks a list of CIDRs and returns them parsed, with an invalid Prefix where
// an entry is bad.
func (p *problems) cidrList(path string, list []string) []netip.Prefix {
	out := make([]netip.Prefix, len(list))
	seen := map[netip.Prefix]bool{}
	for j, s := range list {
		out[j], _ = p.cidr(fmt.Sprintf("%s[%d]", path, j), s, seen)
	}
	return out
}

// cidr checks one CIDR: it must parse, be a network address (no host bits) and not be
// in seen already; it is added to seen.
func (p *problems) cidr(path, s string, seen map[netip.Prefix]bool) (netip.Prefix, bool) {
	pr, err := netip.ParsePrefix(s)
	switch {
	case s == "":
		p.add(path, "must not be empty")
	case err != nil:
		p.add(path, "%q is not a CIDR", s)
	case pr.Addr().Is4In6():
		p.add(path, "%q is an IPv4-mapped IPv6 CIDR: write the IPv4 CIDR", s)
	case pr.Masked() != pr:
		p.add(path, "%q has host bits set: did you mean %q?", s, pr.Masked().String())
	case seen[pr]:
		p.add(path, "%q is listed twice", s)
	default:
		seen[pr] = true
		return pr, true
	}
	return netip.Prefix{}, false
}

// interfaceName checks a Linux interface name (or name prefix) for the given mode.
func (p *problems) interfaceName(path, name, mode string) {
	switch {
	case name == "":
		p.add(path, "required with mode %s", mode)
	case len(name) > maxInterfaceNameLength:
		p.add(path, "%q is longer than %d characters", name, maxInterfaceNameLength)
	case name == "." || name == "..":
		p.add(path, "%q is not a valid interface name", name)
	default:
		for _, r := range name {
			if r <= ' ' || r > '~' || strings.ContainsRune(`/:"'\*`, r) {
				p.add(path, "%q is not a valid interface name: %q is not allowed", name, r)
				return
			}
		}
	}
}

type hostPort struct {
	host netip.Addr // invalid when the host part is empty (all addresses)
	port int
}

func (h hostPort) unspecified() bool { return !h.host.IsValid() || h.host.IsUnspecified() }

// hostPort checks an "ip:port" listen address; the ip may be empty.
func (p *problems) hostPort(path, s string) (hostPort, bool) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		p.add(path, "%q is not host:port", s)
		return hostPort{}, false
	}
	var hp hostPort
	ok := true
	if host != "" {
		if hp.host, err = netip.ParseAddr(host); err != nil {
			p.add(path, "%q: host %q is not an IP address", s, host)
			ok = false
		}
	}
	if hp.port, err = strconv.Atoi(port); err != nil || hp.port < 1 || hp.port > 65535 {
		p.add(path, "%q: port %q is out of range [1, 65535]", s, port)
		ok = false
	}
	return hp, ok
}

func familyName(p netip.Prefix) string {
	if p.Addr().Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// joinAnd writes `a`, `a and b`, `a, b and c`.
func joinAnd(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func countWord(n int) string {
	switch n {
	case 2:
		return "two"
	case 3:
		return "three"
	case 4:
		return "four"
	default:
		return strconv.Itoa(n)
	}
}
