package tables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// Probe checks that this host can run an instance: nft is installed and new enough (the
// knftables constructor checks that), and the kernel accepts every rule shape the
// compiler emits, for both families. It changes nothing: the transactions are only
// checked (`nft --check`), against a table name no instance uses. newNFT opens a table:
// NewNFT on a real host.
func Probe(ctx context.Context, newNFT func(fam Family, table string) (knftables.Interface, error)) error {
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		for _, pc := range probeConfigs(fam) {
			cfg := pc.cfg
			nft, err := newNFT(fam, cfg.TableName())
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: nft is missing or unusable: %w", fam, err))
				break
			}
			s, err := NewSyncer(cfg, nft)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// Checked as a node writes it: many elements per command.
			s.SetElementsPerCommand(MaxElementsPerCommand)
			if err := s.Check(ctx, probeServices(fam)); err != nil {
				errs = append(errs, fmt.Errorf("%s (%s): the kernel refuses shardproxy's rules (needs nf_tables with concatenated intervals, numgen, hash, fib, ct and nat; Linux 5.6 or later): %w", fam, pc.name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// probeConfig is one configuration the probe checks, named for error messages.
type probeConfig struct {
	name string
	cfg  Config
}

// probeConfigs are configurations that, together, emit every rule shape the compiler
// has: each detect-local match (CIDR set, interface name, interface name prefix, each
// plain and negated), masqueradeAll, and masquerade marks at both ends of the range.
func probeConfigs(fam Family) []probeConfig {
	node := netip.MustParseAddr("192.0.2.1")
	cidr := netip.MustParsePrefix("198.18.0.0/15")
	if fam == IPv6 {
		node = netip.MustParseAddr("2001:db8::1")
		cidr = netip.MustParsePrefix("2001:db8:1::/64")
	}
	base := Config{
		Family: fam, TablePrefix: "shardproxy", Instance: "probe", MasqueradeBit: 14,
		Local:       LocalTraffic{Mode: LocalClusterCIDR, CIDRs: []netip.Prefix{cidr}},
		NodePortIPs: []netip.Addr{node}, NodeIPs: []netip.Addr{node},
		ConsistentHash: true, // the rotation chains' rules too
	}
	bridge, prefix, all := base, base, base
	bridge.Local = LocalTraffic{Mode: LocalBridgeInterface, Interface: "cbr0"}
	bridge.MasqueradeBit = 0
	prefix.Local = LocalTraffic{Mode: LocalInterfaceNamePrefix, Interface: "veth"}
	prefix.MasqueradeBit = 31
	all.MasqueradeAll = true
	all.Local = LocalTraffic{}
	return []probeConfig{
		{"ClusterCIDR", base},
		{"BridgeInterface", bridge},
		{"InterfaceNamePrefix", prefix},
		{"masqueradeAll", all},
	}
}

// probeServices uses every feature once in every load-balancing mode: both pick chain
// kinds, affinity, firewall, every protocol.
func probeServices(fam Family) map[ServiceName][]*ServicePort {
	a := func(v4, v6 string) netip.Addr {
		if fam == IPv6 {
			return netip.MustParseAddr(v6)
		}
		return netip.MustParseAddr(v4)
	}
	ep := Endpoint{IP: a("198.18.0.2", "2001:db8:1::2"), Port: 8080}
	ep2 := Endpoint{IP: a("198.18.0.3", "2001:db8:1::3"), Port: 8080}
	out := map[ServiceName][]*ServicePort{}
	for m, mode := range LBModes() {
		for i, proto := range allProtocols() {
			name := ServiceName{Namespace: "probe", Name: string(proto) + "-" + strings.ToLower(string(mode))}
			out[name] = []*ServicePort{{
				Name:             ServicePortName{Namespace: name.Namespace, Name: name.Name},
				Protocol:         proto,
				Port:             80,
				NodePort:         uint16(30000 + 10*m + i),
				ClusterIP:        a(fmt.Sprintf("198.19.%d.%d", m, i+1), fmt.Sprintf("2001:db8:2::%d:%d", m, i+1)),
				LoadBalancerIPs:  []netip.Addr{a(fmt.Sprintf("198.19.%d.%d", 10+m, i+1), fmt.Sprintf("2001:db8:3::%d:%d", m, i+1))},
				SourceRanges:     []netip.Prefix{netip.MustParsePrefix(map[bool]string{true: "2001:db8::/32", false: "192.0.2.0/24"}[fam == IPv6])},
				ExternalLocal:    i == 1,
				AffinityTimeout:  map[bool]time.Duration{true: time.Hour}[i == 2],
				LoadBalancing:    mode,
				ClusterEndpoints: []Endpoint{ep, ep2},
				LocalEndpoints:   []Endpoint{ep},
				HasEndpoints:     true,
			}}
		}
	}
	return out
}
