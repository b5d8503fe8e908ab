package legacy

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
)

// KernelIPVS is IPVS over generic netlink, in this process's network namespace.
type KernelIPVS struct{}

var _ IPVS = KernelIPVS{}

// handle opens an IPVS netlink handle, or returns ErrNoIPVS when the kernel has no IPVS
// family: without the ip_vs module loaded no virtual service can exist, so it is not
// loaded (moby/ipvs would modprobe it) just to find none.
func (KernelIPVS) handle() (*ipvs.Handle, error) {
	if _, err := netlink.GenlFamilyGet("IPVS"); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, ErrNoIPVS
		}
		return nil, fmt.Errorf("looking up the IPVS netlink family: %w", err)
	}
	return ipvs.New("")
}

// Services implements IPVS.
func (k KernelIPVS) Services() ([]VirtualService, error) {
	h, err := k.handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	svcs, err := h.GetServices()
	if err != nil {
		return nil, err
	}
	out := make([]VirtualService, 0, len(svcs))
	for _, s := range svcs {
		out = append(out, VirtualService{Address: s.Address, Protocol: s.Protocol, Port: s.Port, FWMark: s.FWMark})
	}
	return out, nil
}

// DeleteService implements IPVS.
func (k KernelIPVS) DeleteService(s VirtualService) error {
	h, err := k.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	family := uint16(syscall.AF_INET6)
	if s.Address.To4() != nil {
		family = syscall.AF_INET
	}
	return h.DelService(&ipvs.Service{AddressFamily: family, Address: s.Address, Protocol: s.Protocol, Port: s.Port, FWMark: s.FWMark})
}

// KernelLinks is Links over rtnetlink.
type KernelLinks struct{}

var _ Links = KernelLinks{}

// Addresses implements Links.
func (KernelLinks) Addresses(name string) ([]net.IP, string, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil, "", nil
		}
		return nil, "", err
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, link.Type(), err
	}
	return ips(addrs), link.Type(), nil
}

// LocalAddresses implements Links.
func (KernelLinks) LocalAddresses() ([]net.IP, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	return ips(addrs), nil
}

// Delete implements Links.
func (KernelLinks) Delete(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkDel(link)
}

func ips(addrs []netlink.Addr) []net.IP {
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.IP)
	}
	return out
}

// KernelIPSets is IPSets over the ipset netlink protocol.
type KernelIPSets struct{}

var _ IPSets = KernelIPSets{}

// Names implements IPSets. A kernel without ipset support has none.
func (KernelIPSets) Names() ([]string, error) {
	sets, err := netlink.IpsetListAll()
	if err != nil {
		if errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.ENOENT) {
			return nil, nil
		}
		return nil, err
	}
	names := make([]string, 0, len(sets))
	for _, s := range sets {
		names = append(names, s.SetName)
	}
	return names, nil
}

// Destroy implements IPSets.
func (KernelIPSets) Destroy(name string) error { return netlink.IpsetDestroy(name) }
