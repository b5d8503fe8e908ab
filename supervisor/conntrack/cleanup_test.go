package conntrack

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"

	"github.com/shardproxy/shardproxy/tables"
)

// Addresses of the unit tests. A "frontend" is where a client sends; a flow DNATed to an
// endpoint has the endpoint as its reply source.
const (
	client     = "10.0.0.1:40000"
	clusterIP  = "172.30.0.10"
	externalIP = "192.168.0.10"
	lbIP       = "203.0.113.10"
	nodeIP     = "192.168.100.1"
	otherIP    = "172.30.0.99"
	epA        = "10.244.1.2:5353"
	epB        = "10.244.2.2:5353"

	client6     = "[fd00::1]:40000"
	clusterIP6  = "fd00:96::10"
	externalIP6 = "fd00:192::10"
	lbIP6       = "fd00:203::10"
	nodeIP6     = "fd00:100::1"
	epA6        = "[fd00:10:244:1::2]:5353"
	epB6        = "[fd00:10:244:2::2]:5353"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(s string) tables.Endpoint {
	a := ap(s)
	return tables.Endpoint{IP: a.Addr(), Port: a.Port()}
}

// flow is a flow from client to frontend DNATed to backend ("" for not DNATed).
func flow(proto tables.Protocol, from, frontend, backend string) *netlink.ConntrackFlow {
	if backend == "" {
		backend = frontend
	}
	return NewFlow(proto, ap(from), ap(frontend), ap(backend))
}

func udp(frontend, backend string) *netlink.ConntrackFlow {
	return flow(tables.UDP, client, frontend, backend)
}

func udp6(frontend, backend string) *netlink.ConntrackFlow {
	return flow(tables.UDP, client6, frontend, backend)
}

// synSent is a TCP flow from client whose SYN never got an answer.
func synSent(frontend, backend string) *netlink.ConntrackFlow {
	return synSentFrom(client, frontend, backend)
}

func synSentFrom(from, frontend, backend string) *netlink.ConntrackFlow {
	f := flow(tables.TCP, from, frontend, backend)
	f.ProtoInfo = &netlink.ProtoInfoTCP{State: tcpSynSent}
	return f
}

// sctpWithoutPorts is an SCTP flow as netlink v1.3.1 reports it: every port zero.
func sctpWithoutPorts(frontend, backend string) *netlink.ConntrackFlow {
	f := flow(tables.SCTP, client, frontend, backend)
	f.Forward.SrcPort, f.Forward.DstPort, f.Reverse.SrcPort, f.Reverse.DstPort = 0, 0, 0, 0
	return f
}

// dnsPort returns a UDP Service port on 53 with NodePort 30053, reachable on a cluster
// IP, an external IP and a load balancer IP, with endpoints A and B, changed by mods.
func dnsPort(mods ...func(*tables.ServicePort)) *tables.ServicePort {
	sp := &tables.ServicePort{
		Name:             tables.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: tables.UDP},
		Protocol:         tables.UDP,
		Port:             53,
		NodePort:         30053,
		ClusterIP:        ip(clusterIP),
		ExternalIPs:      []netip.Addr{ip(externalIP)},
		LoadBalancerIPs:  []netip.Addr{ip(lbIP)},
		ClusterEndpoints: []tables.Endpoint{ep(epA), ep(epB)},
		LocalEndpoints:   []tables.Endpoint{ep(epA)},
		HasEndpoints:     true,
	}
	for _, mod := range mods {
		mod(sp)
	}
	return sp
}

// dnsPort6 is dnsPort in IPv6.
func dnsPort6(mods ...func(*tables.ServicePort)) *tables.ServicePort {
	sp := dnsPort(func(sp *tables.ServicePort) {
		sp.ClusterIP = ip(clusterIP6)
		sp.ExternalIPs = []netip.Addr{ip(externalIP6)}
		sp.LoadBalancerIPs = []netip.Addr{ip(lbIP6)}
		sp.ClusterEndpoints = []tables.Endpoint{ep(epA6), ep(epB6)}
		sp.LocalEndpoints = []tables.Endpoint{ep(epA6)}
	})
	for _, mod := range mods {
		mod(sp)
	}
	return sp
}

func endpoints(eps ...string) func(*tables.ServicePort) {
	return func(sp *tables.ServicePort) {
		sp.ClusterEndpoints = nil
		for _, e := range eps {
			sp.ClusterEndpoints = append(sp.ClusterEndpoints, ep(e))
		}
		sp.LocalEndpoints = nil
		sp.HasEndpoints = len(eps) > 0
	}
}

func protocol(p tables.Protocol) func(*tables.ServicePort) {
	return func(sp *tables.ServicePort) {
		sp.Protocol = p
		sp.Name.Protocol = p
	}
}

func hostPort(host string, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

func TestCleanup(t *testing.T) {
	tests := []struct {
		name          string
		before, after []*tables.ServicePort
		// flows is the table before the cleanup, by name; gone names those deleted.
		flows     map[string]*netlink.ConntrackFlow
		gone      []string
		wantCalls []string
	}{
		{
			name:   "removed endpoint loses its flows through every frontend, others keep theirs",
			before: []*tables.ServicePort{dnsPort()},
			after:  []*tables.ServicePort{dnsPort(endpoints(epB))},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP":        udp(hostPort(clusterIP, "53"), epA),
				"A via external IP":       udp(hostPort(externalIP, "53"), epA),
				"A via LB IP":             udp(hostPort(lbIP, "53"), epA),
				"A via NodePort":          udp(hostPort(nodeIP, "30053"), epA),
				"B via cluster IP":        udp(hostPort(clusterIP, "53"), epB),
				"B via NodePort":          udp(hostPort(nodeIP, "30053"), epB),
				"A via another Service":   udp(hostPort(otherIP, "53"), epA),
				"A via another port":      udp(hostPort(clusterIP, "54"), epA),
				"cluster IP, not DNATed":  udp(hostPort(clusterIP, "53"), ""),
				"A from a second client":  flow(tables.UDP, "10.0.0.2:1", hostPort(clusterIP, "53"), epA),
				"TCP A via cluster IP":    flow(tables.TCP, client, hostPort(clusterIP, "53"), epA),
				"SCTP A via cluster IP":   flow(tables.SCTP, client, hostPort(clusterIP, "53"), epA),
				"IPv6 flow to IPv6 twins": udp6(hostPort(clusterIP6, "53"), epA6),
			},
			gone:      []string{"A via cluster IP", "A via external IP", "A via LB IP", "A via NodePort", "A from a second client"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "removed endpoint of a TCP port keeps every flow, without touching the table",
			before: []*tables.ServicePort{dnsPort(protocol(tables.TCP))},
			after:  []*tables.ServicePort{dnsPort(protocol(tables.TCP), endpoints(epB))},
			flows: map[string]*netlink.ConntrackFlow{
				"TCP A via cluster IP": flow(tables.TCP, client, hostPort(clusterIP, "53"), epA),
				"TCP A via NodePort":   flow(tables.TCP, client, hostPort(nodeIP, "30053"), epA),
				"UDP A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
			},
		},
		{
			name:   "removed endpoint of an SCTP port loses its SCTP flows only",
			before: []*tables.ServicePort{dnsPort(protocol(tables.SCTP))},
			after:  []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints(epB))},
			flows: map[string]*netlink.ConntrackFlow{
				"SCTP A via cluster IP": flow(tables.SCTP, client, hostPort(clusterIP, "53"), epA),
				"SCTP A via NodePort":   flow(tables.SCTP, client, hostPort(nodeIP, "30053"), epA),
				"UDP A via cluster IP":  udp(hostPort(clusterIP, "53"), epA),
				"TCP A via cluster IP":  flow(tables.TCP, client, hostPort(clusterIP, "53"), epA),
			},
			gone:      []string{"SCTP A via cluster IP", "SCTP A via NodePort"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "SCTP flows without ports are matched on the addresses of the Service and the gone endpoint",
			before: []*tables.ServicePort{dnsPort(protocol(tables.SCTP))},
			after:  []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints(epB))},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP":      sctpWithoutPorts(hostPort(clusterIP, "53"), epA),
				"A via LB IP":           sctpWithoutPorts(hostPort(lbIP, "53"), epA),
				"A via NodePort":        sctpWithoutPorts(hostPort(nodeIP, "30053"), epA),
				"B via cluster IP":      sctpWithoutPorts(hostPort(clusterIP, "53"), epB),
				"A via another Service": sctpWithoutPorts(hostPort(otherIP, "53"), epA),
			},
			gone:      []string{"A via cluster IP", "A via LB IP"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "SCTP flows without ports keep an endpoint whose address is still in use",
			before: []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints(epA))},
			after:  []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints("10.244.1.2:5354"))},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": sctpWithoutPorts(hostPort(clusterIP, "53"), epA),
			},
			wantCalls: []string{"ListEntries IPv4"},
		},
		{
			name:   "SCTP first endpoints delete flows without ports that bypassed NAT to the cluster IP only",
			before: []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints())},
			after:  []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints(epA))},
			flows: map[string]*netlink.ConntrackFlow{
				"cluster IP, not DNATed":  sctpWithoutPorts(hostPort(clusterIP, "53"), ""),
				"external IP, not DNATed": sctpWithoutPorts(hostPort(externalIP, "53"), ""),
				"A via cluster IP":        sctpWithoutPorts(hostPort(clusterIP, "53"), epA),
			},
			gone:      []string{"cluster IP, not DNATed"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "first endpoints delete the flows that bypassed NAT to the port",
			before: []*tables.ServicePort{dnsPort(endpoints())},
			after:  []*tables.ServicePort{dnsPort(endpoints(epA))},
			flows: map[string]*netlink.ConntrackFlow{
				"cluster IP, not DNATed":          udp(hostPort(clusterIP, "53"), ""),
				"external IP, not DNATed":         udp(hostPort(externalIP, "53"), ""),
				"LB IP, not DNATed":               udp(hostPort(lbIP, "53"), ""),
				"NodePort, not DNATed":            udp(hostPort(nodeIP, "30053"), ""),
				"A via cluster IP, after sync":    udp(hostPort(clusterIP, "53"), epA),
				"cluster IP, other port":          udp(hostPort(clusterIP, "54"), ""),
				"another Service IP, not DNATed":  udp(hostPort(otherIP, "53"), ""),
				"TCP to cluster IP, not DNATed":   flow(tables.TCP, client, hostPort(clusterIP, "53"), ""),
				"IPv6 cluster IP twin not DNATed": udp6(hostPort(clusterIP6, "53"), ""),
			},
			gone: []string{
				"cluster IP, not DNATed", "external IP, not DNATed", "LB IP, not DNATed", "NodePort, not DNATed",
			},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:  "new Service port with endpoints deletes the flows that bypassed NAT to it",
			after: []*tables.ServicePort{dnsPort()},
			flows: map[string]*netlink.ConntrackFlow{
				"cluster IP, not DNATed": udp(hostPort(clusterIP, "53"), ""),
				"NodePort, not DNATed":   udp(hostPort(nodeIP, "30053"), ""),
				"B via cluster IP":       udp(hostPort(clusterIP, "53"), epB),
			},
			gone:      []string{"cluster IP, not DNATed", "NodePort, not DNATed"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "new Service port without endpoints keeps every flow",
			before: nil,
			after:  []*tables.ServicePort{dnsPort(endpoints())},
			flows: map[string]*netlink.ConntrackFlow{
				"cluster IP, not DNATed": udp(hostPort(clusterIP, "53"), ""),
			},
		},
		{
			name:   "port that had endpoints keeps flows that were not DNATed when it gains more",
			before: []*tables.ServicePort{dnsPort(endpoints(epA))},
			after:  []*tables.ServicePort{dnsPort(endpoints(epA, epB))},
			flows: map[string]*netlink.ConntrackFlow{
				"cluster IP, not DNATed": udp(hostPort(clusterIP, "53"), ""),
				"NodePort, not DNATed":   udp(hostPort(nodeIP, "30053"), ""),
				"A via cluster IP":       udp(hostPort(clusterIP, "53"), epA),
			},
		},
		{
			name:   "deleted Service loses the flows to its endpoints",
			before: []*tables.ServicePort{dnsPort()},
			after:  nil,
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP":       udp(hostPort(clusterIP, "53"), epA),
				"B via LB IP":            udp(hostPort(lbIP, "53"), epB),
				"B via NodePort":         udp(hostPort(nodeIP, "30053"), epB),
				"cluster IP, not DNATed": udp(hostPort(clusterIP, "53"), ""),
				"A via another Service":  udp(hostPort(otherIP, "53"), epA),
			},
			gone:      []string{"A via cluster IP", "B via LB IP", "B via NodePort"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "port losing its cluster IP counts as deleted",
			before: []*tables.ServicePort{dnsPort()},
			after:  []*tables.ServicePort{dnsPort(func(sp *tables.ServicePort) { sp.ClusterIP = netip.Addr{} })},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
			},
			gone:      []string{"A via cluster IP"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "endpoint moving between the cluster and the local list keeps its flows",
			before: []*tables.ServicePort{dnsPort()},
			after: []*tables.ServicePort{dnsPort(func(sp *tables.ServicePort) {
				sp.ClusterEndpoints = []tables.Endpoint{ep(epB)}
				sp.LocalEndpoints = []tables.Endpoint{ep(epA)}
			})},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
			},
		},
		{
			name:   "endpoint changing its port loses the flows to the old port",
			before: []*tables.ServicePort{dnsPort(endpoints(epA))},
			after:  []*tables.ServicePort{dnsPort(endpoints("10.244.1.2:5354"))},
			flows: map[string]*netlink.ConntrackFlow{
				"A:5353 via cluster IP": udp(hostPort(clusterIP, "53"), epA),
				"A:5354 via cluster IP": udp(hostPort(clusterIP, "53"), "10.244.1.2:5354"),
			},
			gone:      []string{"A:5353 via cluster IP"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "Service port changing its port number loses flows to removed endpoints on the old one",
			before: []*tables.ServicePort{dnsPort()},
			after:  []*tables.ServicePort{dnsPort(endpoints(epB), func(sp *tables.ServicePort) { sp.Port = 5300 })},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP:53": udp(hostPort(clusterIP, "53"), epA),
				"B via cluster IP:53": udp(hostPort(clusterIP, "53"), epB),
			},
			gone:      []string{"A via cluster IP:53"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "IPv6 removed endpoint loses its flows, the IPv4 twin keeps its own",
			before: []*tables.ServicePort{dnsPort(), dnsPort6()},
			after:  []*tables.ServicePort{dnsPort(), dnsPort6(endpoints(epB6))},
			flows: map[string]*netlink.ConntrackFlow{
				"A6 via cluster IP":   udp6(hostPort(clusterIP6, "53"), epA6),
				"A6 via external IP":  udp6(hostPort(externalIP6, "53"), epA6),
				"A6 via LB IP":        udp6(hostPort(lbIP6, "53"), epA6),
				"A6 via NodePort":     udp6(hostPort(nodeIP6, "30053"), epA6),
				"B6 via cluster IP":   udp6(hostPort(clusterIP6, "53"), epB6),
				"A6 via other port":   udp6(hostPort(clusterIP6, "54"), epA6),
				"IPv4 A via cluster":  udp(hostPort(clusterIP, "53"), epA),
				"IPv4 A via NodePort": udp(hostPort(nodeIP, "30053"), epA),
			},
			gone:      []string{"A6 via cluster IP", "A6 via external IP", "A6 via LB IP", "A6 via NodePort"},
			wantCalls: []string{"ListEntries IPv6", "DeleteFilters IPv6"},
		},
		{
			name:   "IPv6 first endpoints delete the flows that bypassed NAT",
			before: []*tables.ServicePort{dnsPort6(endpoints())},
			after:  []*tables.ServicePort{dnsPort6(endpoints(epA6))},
			flows: map[string]*netlink.ConntrackFlow{
				"cluster IP, not DNATed": udp6(hostPort(clusterIP6, "53"), ""),
				"NodePort, not DNATed":   udp6(hostPort(nodeIP6, "30053"), ""),
				"A6 via cluster IP":      udp6(hostPort(clusterIP6, "53"), epA6),
			},
			gone:      []string{"cluster IP, not DNATed", "NodePort, not DNATed"},
			wantCalls: []string{"ListEntries IPv6", "DeleteFilters IPv6"},
		},
		{
			name:   "both families changing list and delete each family once",
			before: []*tables.ServicePort{dnsPort(), dnsPort6(endpoints())},
			after:  []*tables.ServicePort{dnsPort(endpoints(epB)), dnsPort6(endpoints(epA6))},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP":            udp(hostPort(clusterIP, "53"), epA),
				"IPv6 cluster IP not DNATed":  udp6(hostPort(clusterIP6, "53"), ""),
				"IPv6 A6 via cluster IP":      udp6(hostPort(clusterIP6, "53"), epA6),
				"IPv4 cluster IP, not DNATed": udp(hostPort(clusterIP, "53"), ""),
			},
			gone: []string{"A via cluster IP", "IPv6 cluster IP not DNATed"},
			wantCalls: []string{
				"ListEntries IPv4", "DeleteFilters IPv4", "ListEntries IPv6", "DeleteFilters IPv6",
			},
		},
		{
			name:   "unchanged ports leave the table alone",
			before: []*tables.ServicePort{dnsPort(), dnsPort6()},
			after:  []*tables.ServicePort{dnsPort(), dnsPort6()},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
			},
		},
		{
			name:  "new TCP port deletes the unanswered flows that bypassed NAT to it, nothing else",
			after: []*tables.ServicePort{dnsPort(protocol(tables.TCP))},
			flows: map[string]*netlink.ConntrackFlow{
				"SYN to cluster IP, not DNATed":     synSent(hostPort(clusterIP, "53"), ""),
				"SYN to external IP, not DNATed":    synSent(hostPort(externalIP, "53"), ""),
				"SYN to LB IP, not DNATed":          synSent(hostPort(lbIP, "53"), ""),
				"SYN to NodePort, not DNATed":       synSent(hostPort(nodeIP, "30053"), ""),
				"answered, not DNATed":              flow(tables.TCP, "10.0.0.2:1", hostPort(lbIP, "53"), ""),
				"SYN DNATed to A":                   synSent(hostPort(clusterIP, "53"), epA),
				"SYN to another port":               synSent(hostPort(clusterIP, "54"), ""),
				"SYN to another Service":            synSent(hostPort(otherIP, "53"), ""),
				"UDP to cluster IP, not DNATed":     udp(hostPort(clusterIP, "53"), ""),
				"IPv6 SYN to the cluster IP's twin": synSentFrom(client6, hostPort(clusterIP6, "53"), ""),
			},
			gone: []string{
				"SYN to cluster IP, not DNATed", "SYN to external IP, not DNATed", "SYN to LB IP, not DNATed", "SYN to NodePort, not DNATed",
			},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			// Its rules reject the SYN now, but the entry would outlive the first
			// endpoints, which bring no new address to clean up for.
			name:  "new TCP port without endpoints deletes them too",
			after: []*tables.ServicePort{dnsPort(protocol(tables.TCP), endpoints())},
			flows: map[string]*netlink.ConntrackFlow{
				"SYN to cluster IP, not DNATed": synSent(hostPort(clusterIP, "53"), ""),
			},
			gone:      []string{"SYN to cluster IP, not DNATed"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name: "TCP port with a new LB IP deletes the unanswered flows to that address only",
			before: []*tables.ServicePort{dnsPort(protocol(tables.TCP), func(sp *tables.ServicePort) {
				sp.LoadBalancerIPs = nil
			})},
			after: []*tables.ServicePort{dnsPort(protocol(tables.TCP))},
			flows: map[string]*netlink.ConntrackFlow{
				"SYN to LB IP, not DNATed":      synSent(hostPort(lbIP, "53"), ""),
				"SYN to cluster IP, not DNATed": synSent(hostPort(clusterIP, "53"), ""),
				"SYN to NodePort, not DNATed":   synSent(hostPort(nodeIP, "30053"), ""),
			},
			gone:      []string{"SYN to LB IP, not DNATed"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name:   "TCP port getting its first endpoints leaves the table alone",
			before: []*tables.ServicePort{dnsPort(protocol(tables.TCP), endpoints())},
			after:  []*tables.ServicePort{dnsPort(protocol(tables.TCP))},
			flows: map[string]*netlink.ConntrackFlow{
				"SYN to cluster IP, not DNATed": synSent(hostPort(clusterIP, "53"), ""),
			},
		},
		{
			name:   "nothing stale lists once and deletes nothing",
			before: []*tables.ServicePort{dnsPort()},
			after:  []*tables.ServicePort{dnsPort(endpoints(epB))},
			flows: map[string]*netlink.ConntrackFlow{
				"B via cluster IP":      udp(hostPort(clusterIP, "53"), epB),
				"A via another Service": udp(hostPort(otherIP, "53"), epA),
			},
			wantCalls: []string{"ListEntries IPv4"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkCleanup(t, tc.flows, tc.gone, tc.wantCalls, func(c *Cleaner) (int, error) {
				return c.Cleanup(context.Background(), tc.before, tc.after)
			})
		})
	}
}

func TestCleanupErrors(t *testing.T) {
	errBoom := errors.New("boom")
	before := []*tables.ServicePort{dnsPort(), dnsPort6()}
	after := []*tables.ServicePort{dnsPort(endpoints(epB)), dnsPort6(endpoints(epB6))}
	stale4 := udp(hostPort(clusterIP, "53"), epA)
	stale6 := udp6(hostPort(clusterIP6, "53"), epA6)

	tests := []struct {
		name        string
		setup       func(*Fake)
		ctx         func() context.Context
		wantErr     string
		wantDeleted int
		wantCalls   []string
	}{
		{
			name:      "failed list is reported for each family",
			setup:     func(f *Fake) { f.ListErr = errBoom },
			wantErr:   "listing IPv4 conntrack flows: boom",
			wantCalls: []string{"ListEntries IPv4", "ListEntries IPv6"},
		},
		{
			name:      "failed delete is reported with what was being deleted",
			setup:     func(f *Fake) { f.DeleteErr = errBoom },
			wantErr:   "deleting 1 stale IPv6 conntrack flows (0 deleted): boom",
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4", "ListEntries IPv6", "DeleteFilters IPv6"},
		},
		{
			name: "canceled context stops before the table is touched",
			ctx: func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			wantErr: "cleaning up IPv4 conntrack flows: context canceled",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := NewFake(stale4, stale6)
			if tc.setup != nil {
				tc.setup(fake)
			}
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			deleted, err := NewCleaner(fake).Cleanup(ctx, before, after)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Cleanup error = %v, want one containing %q", err, tc.wantErr)
			}
			if tc.setup != nil && !errors.Is(err, errBoom) {
				t.Errorf("Cleanup error %v does not wrap the table's error", err)
			}
			if deleted != tc.wantDeleted {
				t.Errorf("Cleanup returned %d deleted, want %d", deleted, tc.wantDeleted)
			}
			if diff := cmp.Diff(tc.wantCalls, fake.Calls()); diff != "" {
				t.Errorf("calls to the table (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExactFilterMatchesOnlyItsFlows checks the delete cannot widen the decision: a flow
// that differs from a stale one in any field of either tuple is not matched.
func TestExactFilterMatchesOnlyItsFlows(t *testing.T) {
	stale := udp(hostPort(clusterIP, "53"), epA)
	filter := exactFilter{keyOf(stale): {}}
	if !filter.MatchConntrackFlow(udp(hostPort(clusterIP, "53"), epA)) {
		t.Errorf("filter does not match a copy of its flow")
	}
	v4mapped := udp(hostPort(clusterIP, "53"), epA)
	v4mapped.Forward.DstIP = v4mapped.Forward.DstIP.To16()
	if !filter.MatchConntrackFlow(v4mapped) {
		t.Errorf("filter does not match its flow spelled with 16-byte IPv4 addresses")
	}
	for name, mutate := range map[string]func(*netlink.ConntrackFlow){
		"protocol":    func(f *netlink.ConntrackFlow) { f.Forward.Protocol = 6 },
		"zone":        func(f *netlink.ConntrackFlow) { f.Zone = 1 },
		"client port": func(f *netlink.ConntrackFlow) { f.Forward.SrcPort++ },
		"frontend":    func(f *netlink.ConntrackFlow) { f.Forward.DstPort++ },
		"endpoint":    func(f *netlink.ConntrackFlow) { f.Reverse.SrcPort++ },
		"reply dst":   func(f *netlink.ConntrackFlow) { f.Reverse.DstIP = ip("10.0.0.2").AsSlice() },
	} {
		f := udp(hostPort(clusterIP, "53"), epA)
		mutate(f)
		if filter.MatchConntrackFlow(f) {
			t.Errorf("filter matches a flow with another %s: %s", name, FlowString(f))
		}
	}
}

// dnsName is the name of dnsPort's port.
var dnsName = tables.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: tables.UDP}

// serving returns a Serving holding eps for dnsPort's port.
func serving(eps ...string) Serving {
	out := Serving{}
	for _, e := range eps {
		out[dnsName] = append(out[dnsName], ep(e))
	}
	return out
}

// TestCleanupServing: endpoints that still serve (terminating pods) keep their flows
// although the endpoint lists left them out, and lose them once they stop serving.
func TestCleanupServing(t *testing.T) {
	tests := []struct {
		name      string
		change    Change
		flows     map[string]*netlink.ConntrackFlow
		gone      []string
		wantCalls []string
	}{
		{
			name: "endpoint that starts terminating keeps its flows while it serves",
			change: Change{
				Before:  []*tables.ServicePort{dnsPort()},
				After:   []*tables.ServicePort{dnsPort(endpoints(epB))},
				Serving: serving(epA),
			},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
				"A via NodePort":   udp(hostPort(nodeIP, "30053"), epA),
				"B via cluster IP": udp(hostPort(clusterIP, "53"), epB),
			},
		},
		{
			name: "terminating endpoint that stops serving loses its flows",
			change: Change{
				Before:     []*tables.ServicePort{dnsPort(endpoints(epB))},
				After:      []*tables.ServicePort{dnsPort(endpoints(epB))},
				WasServing: serving(epA),
			},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
				"A via NodePort":   udp(hostPort(nodeIP, "30053"), epA),
				"B via cluster IP": udp(hostPort(clusterIP, "53"), epB),
			},
			gone:      []string{"A via cluster IP", "A via NodePort"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name: "endpoint serving on another port of the Service does not keep this port's flows",
			change: Change{
				Before: []*tables.ServicePort{dnsPort()},
				After:  []*tables.ServicePort{dnsPort(endpoints(epB))},
				Serving: Serving{
					{Namespace: "kube-system", Name: "dns", Port: "metrics", Protocol: tables.UDP}: {ep(epA)},
					{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: tables.TCP}:     {ep(epA)},
				},
			},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": udp(hostPort(clusterIP, "53"), epA),
			},
			gone:      []string{"A via cluster IP"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name: "endpoint serving in the other family does not keep this family's flows",
			change: Change{
				Before:  []*tables.ServicePort{dnsPort(), dnsPort6()},
				After:   []*tables.ServicePort{dnsPort(endpoints(epB)), dnsPort6(endpoints(epB6))},
				Serving: serving(epA6),
			},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP":      udp(hostPort(clusterIP, "53"), epA),
				"IPv6 A via cluster IP": udp6(hostPort(clusterIP6, "53"), epA6),
			},
			gone:      []string{"A via cluster IP"},
			wantCalls: []string{"ListEntries IPv4", "DeleteFilters IPv4"},
		},
		{
			name: "SCTP flows without ports keep the address of a serving endpoint",
			change: Change{
				Before: []*tables.ServicePort{dnsPort(protocol(tables.SCTP))},
				After:  []*tables.ServicePort{dnsPort(protocol(tables.SCTP), endpoints(epB))},
				Serving: Serving{
					{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: tables.SCTP}: {ep(epA)},
				},
			},
			flows: map[string]*netlink.ConntrackFlow{
				"A via cluster IP": sctpWithoutPorts(hostPort(clusterIP, "53"), epA),
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkCleanup(t, tc.flows, tc.gone, tc.wantCalls, func(c *Cleaner) (int, error) {
				return c.CleanupChange(context.Background(), tc.change)
			})
		})
	}
}

// checkCleanup runs cleanup over a fake table holding flows (by name) and checks that
// exactly the flows named in gone were deleted, that it said so, and which calls it made.
func checkCleanup(t *testing.T, flows map[string]*netlink.ConntrackFlow, gone, wantCalls []string, cleanup func(*Cleaner) (int, error)) {
	t.Helper()
	names := make(map[*netlink.ConntrackFlow]string, len(flows))
	var initial []*netlink.ConntrackFlow
	for _, name := range slices.Sorted(maps.Keys(flows)) {
		names[flows[name]] = name
		initial = append(initial, flows[name])
	}
	fake := NewFake(initial...)
	deleted, err := cleanup(NewCleaner(fake))
	if err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	left := map[*netlink.ConntrackFlow]bool{}
	for _, f := range fake.Flows() {
		left[f] = true
	}
	var got []string
	for _, f := range initial {
		if !left[f] {
			got = append(got, names[f])
		}
	}
	want := slices.Clone(gone)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("deleted flows (-want +got):\n%s", diff)
	}
	if deleted != len(gone) {
		t.Errorf("cleanup returned %d deleted, want %d", deleted, len(gone))
	}
	if diff := cmp.Diff(wantCalls, fake.Calls()); diff != "" {
		t.Errorf("calls to the table (-want +got):\n%s", diff)
	}
}
