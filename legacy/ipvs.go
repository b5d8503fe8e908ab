package legacy

import (
	"errors"
	"fmt"
	"net"
)

// DummyInterface is the dummy interface IPVS-mode kube-proxy binds every ClusterIP,
// external IP and load-balancer IP to.
const DummyInterface = "kube-ipvs0"

// Default NodePort range of kube-apiserver (--service-node-port-range).
const (
	DefaultNodePortMin = 30000
	DefaultNodePortMax = 32767
)

// ipsets are the ipsets IPVS-mode kube-proxy creates.
var ipsets = []string{
	"KUBE-LOOP-BACK",
	"KUBE-CLUSTER-IP",
	"KUBE-EXTERNAL-IP",
	"KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER",
	"KUBE-LOAD-BALANCER-LOCAL",
	"KUBE-LOAD-BALANCER-FW",
	"KUBE-LOAD-BALANCER-SOURCE-IP",
	"KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP",
	"KUBE-NODE-PORT-LOCAL-TCP",
	"KUBE-NODE-PORT-UDP",
	"KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH",
	"KUBE-NODE-PORT-LOCAL-SCTP-HASH",
	"KUBE-HEALTH-CHECK-NODE-PORT",
	"KUBE-IPVS-IPS",
}

// VirtualService is an IPVS virtual service.
type VirtualService struct {
	Address  net.IP
	Protocol uint16 // IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP
	Port     uint16
	// FWMark is set for firewall-mark services, which have no address; kube-proxy makes
	// none.
	FWMark uint32
}

func (s VirtualService) String() string {
	if s.FWMark != 0 {
		return fmt.Sprintf("fwmark %d", s.FWMark)
	}
	proto := map[uint16]string{6: "TCP", 17: "UDP", 132: "SCTP"}[s.Protocol]
	if proto == "" {
		proto = fmt.Sprint("proto ", s.Protocol)
	}
	return fmt.Sprintf("%s %s", proto, net.JoinHostPort(s.Address.String(), fmt.Sprint(s.Port)))
}

// ErrNoIPVS is returned by IPVS implementations when the kernel has no IPVS: then no
// virtual service can exist.
var ErrNoIPVS = errors.New("the kernel has no IPVS (ip_vs is not loaded)")

// IPVS lists and deletes IPVS virtual services.
type IPVS interface {
	Services() ([]VirtualService, error)
	DeleteService(VirtualService) error
}

// Links reads and deletes network interfaces.
type Links interface {
	// Addresses returns the addresses of interface name and its kind ("dummy", "veth",
	// ...); kind is "" if there is no such interface.
	Addresses(name string) (addrs []net.IP, kind string, err error)
	// LocalAddresses returns the addresses of every interface.
	LocalAddresses() ([]net.IP, error)
	// Delete deletes interface name.
	Delete(name string) error
}

// IPSets lists and destroys ipsets.
type IPSets interface {
	Names() ([]string, error)
	Destroy(name string) error
}

// IPVSPlan is what the IPVS part of the cleanup removes.
type IPVSPlan struct {
	// Services are kube-proxy's virtual services; Kept the others, reported only.
	Services, Kept []VirtualService
	// NoIPVS is true when the kernel has no IPVS, so there are no virtual services.
	NoIPVS bool
	// Dummy is true when kube-ipvs0 exists and is a dummy interface.
	Dummy bool
	// NotDummy is the kind of a kube-ipvs0 that is not a dummy: not kube-proxy's, so it
	// stays, and its addresses do not mark virtual services as kube-proxy's.
	NotDummy string
	// IPSets are kube-proxy's ipsets that exist.
	IPSets []string
}

// NodePortRange is the range of ports a NodePort virtual service is recognized by.
type NodePortRange struct{ Min, Max uint16 }

// PlanIPVS decides which virtual services, interface and ipsets are kube-proxy's: the
// virtual services on a kube-ipvs0 address, and those on another local address with a
// port in nodePorts.
func PlanIPVS(ipvs IPVS, links Links, sets IPSets, nodePorts NodePortRange) (*IPVSPlan, error) {
	p := &IPVSPlan{}
	dummyAddrs, kind, err := links.Addresses(DummyInterface)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", DummyInterface, err)
	}
	switch kind {
	case "":
	case "dummy":
		p.Dummy = true
	default:
		p.NotDummy, dummyAddrs = kind, nil
	}
	local, err := links.LocalAddresses()
	if err != nil {
		return nil, fmt.Errorf("reading the node's addresses: %w", err)
	}
	onDummy, isLocal := ipSet(dummyAddrs), ipSet(local)
	svcs, err := ipvs.Services()
	switch {
	case errors.Is(err, ErrNoIPVS):
		p.NoIPVS = true
	case err != nil:
		return nil, fmt.Errorf("listing IPVS virtual services: %w", err)
	}
	for _, s := range svcs {
		key := ""
		if s.Address != nil {
			key = s.Address.String()
		}
		switch {
		case s.FWMark != 0 || s.Address == nil:
			p.Kept = append(p.Kept, s)
		case onDummy[key]:
			p.Services = append(p.Services, s)
		case isLocal[key] && s.Port >= nodePorts.Min && s.Port <= nodePorts.Max:
			p.Services = append(p.Services, s)
		default:
			p.Kept = append(p.Kept, s)
		}
	}
	names, err := sets.Names()
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	exist := map[string]bool{}
	for _, n := range names {
		exist[n] = true
	}
	for _, n := range ipsets {
		if exist[n] {
			p.IPSets = append(p.IPSets, n)
		}
	}
	return p, nil
}

func ipSet(ips []net.IP) map[string]bool {
	m := map[string]bool{}
	for _, ip := range ips {
		m[ip.String()] = true
	}
	return m
}

// ApplyIPVS deletes the virtual services, then kube-ipvs0, then the ipsets. Run it after
// the iptables cleanup: an ipset cannot be destroyed while a rule references it.
func ApplyIPVS(p *IPVSPlan, ipvs IPVS, links Links, sets IPSets) error {
	var errs []error
	for _, s := range p.Services {
		if err := ipvs.DeleteService(s); err != nil {
			errs = append(errs, fmt.Errorf("deleting IPVS virtual service %s: %w", s, err))
		}
	}
	if p.Dummy {
		if err := links.Delete(DummyInterface); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", DummyInterface, err))
		}
	}
	for _, n := range p.IPSets {
		if err := sets.Destroy(n); err != nil {
			errs = append(errs, fmt.Errorf("destroying ipset %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}
