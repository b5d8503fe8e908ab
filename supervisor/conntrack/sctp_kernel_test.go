package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	vnetns "github.com/vishvananda/netns"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/test/netns"
	"github.com/shardproxy/shardproxy/test/testutil"
)

// sctpFlow is one SCTP entry of conntrack -L: the original source port (the client's own
// port: nothing rewrites it on the way to a pod), the reply source (the endpoint it was
// DNATed to) and its state.
type sctpFlow struct {
	clientPort string
	endpoint   netip.Addr
	state      string
}

func (f sctpFlow) String() string {
	return fmt.Sprintf("%s from client port %s to %s", f.state, f.clientPort, f.endpoint)
}

// listSCTPFlows returns the SCTP entries of a family in namespace ns.
func listSCTPFlows(t *testing.T, ns string, family tables.Family) []sctpFlow {
	t.Helper()
	fam := "ipv4"
	if family == tables.IPv6 {
		fam = "ipv6"
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "conntrack", "-L", "-p", "sctp", "-f", fam).Output()
	if err != nil {
		t.Fatalf("conntrack -L -p sctp -f %s: %v", fam, err)
	}
	var flows []sctpFlow
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) < 4 || fields[0] != "sctp" {
			continue
		}
		f := sctpFlow{state: fields[3]}
		var srcs, sports []string
		for _, field := range fields {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "src":
				srcs = append(srcs, v)
			case "sport":
				sports = append(sports, v)
			}
		}
		if len(srcs) < 2 || len(sports) < 1 {
			t.Fatalf("unexpected conntrack line %q", line)
		}
		f.clientPort = sports[0]
		f.endpoint = netip.MustParseAddr(srcs[1])
		flows = append(flows, f)
	}
	return flows
}

// TestKernelCleanupOfRealSCTPFlows opens real SCTP associations from a pod through
// shardproxy's rules to a Service's two endpoints, holds them, then removes one endpoint
// and runs the Cleaner on the node: the entries of the associations DNATed to the
// removed endpoint are deleted, those to the endpoint still serving are kept, and new
// associations reach only the one left. It needs a kernel with SCTP: see
// netns.RequireSCTP (the host's CI layer leaves it out by name, hack/kernels.sh runs it).
func TestKernelCleanupOfRealSCTPFlows(t *testing.T) {
	testutil.RequireKernel(t, "ip", "nft", "conntrack")
	netns.RequireSCTP(t)
	for _, fam := range []tables.Family{tables.IPv4, tables.IPv6} {
		t.Run(fam.String(), func(t *testing.T) { kernelCleanupOfRealSCTPFlows(t, fam) })
	}
}

func kernelCleanupOfRealSCTPFlows(t *testing.T, fam tables.Family) {
	a := func(v4, v6 string) netip.Addr {
		if fam == tables.IPv6 {
			return netip.MustParseAddr(v6)
		}
		return netip.MustParseAddr(v4)
	}
	tp := netns.New(t)
	tp.StartServer(tp.Pod1, "pod1", "sctp", 9000)
	tp.StartServer(tp.Remote, "remote", "sctp", 9000)
	pod1 := tables.Endpoint{IP: a(netns.Pod1IPv4, netns.Pod1IPv6), Port: 9000}
	remote := tables.Endpoint{IP: a(netns.RemoteIPv4, netns.RemoteIPv6), Port: 9000}
	svcIP := a("172.31.0.60", "fd00:31::60")
	port := func(eps ...tables.Endpoint) *tables.ServicePort {
		return &tables.ServicePort{
			Name:     tables.ServicePortName{Namespace: "ns", Name: "sig", Port: "sctp", Protocol: tables.SCTP},
			Protocol: tables.SCTP, Port: 9000, NodePort: 30900, ClusterIP: svcIP,
			ClusterEndpoints: eps, HasEndpoints: len(eps) > 0,
		}
	}
	before, after := port(pod1, remote), port(remote)
	name := tables.ServiceName{Namespace: "ns", Name: "sig"}

	// shardproxy's rules, synced from inside the node namespace (nft runs there).
	cfg := tables.Config{
		Family: fam, TablePrefix: "shardproxy", Instance: "ct", MasqueradeBit: 14,
		Local:       tables.LocalTraffic{Mode: tables.LocalClusterCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix(netns.ClusterPodCIDRv4), netip.MustParsePrefix(netns.ClusterPodCIDRv6)}},
		NodePortIPs: []netip.Addr{netip.MustParseAddr(netns.NodeIPv4), netip.MustParseAddr(netns.NodeIPv6)},
		NodeIPs:     []netip.Addr{netip.MustParseAddr(netns.NodeIPv4), netip.MustParseAddr(netns.NodeIPv6)},
	}
	var syncer *tables.Syncer
	sync := func(sp *tables.ServicePort) {
		t.Helper()
		if err := tp.Do(tp.Node, func() error {
			if syncer == nil {
				nft, err := tables.NewNFT(fam, cfg.TableName())
				if err != nil {
					return err
				}
				if syncer, err = tables.NewSyncer(cfg, nft); err != nil {
					return err
				}
			}
			_, err := syncer.Full(context.Background(), map[tables.ServiceName][]*tables.ServicePort{name: {sp}})
			return err
		}); err != nil {
			t.Fatalf("syncing the rules: %v", err)
		}
	}
	sync(before)

	// Associations held open until each endpoint has at least one (the endpoint is a
	// random choice), so every entry stays established.
	held := map[string][]*netns.SCTPAssociation{}
	for i := 0; i < 40 && (len(held["pod1"]) == 0 || len(held["remote"]) == 0); i++ {
		assoc, err := tp.OpenSCTP(tp.Pod2, svcIP.String(), 9000, netns.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = assoc.Close() })
		held[assoc.Reply.Server] = append(held[assoc.Reply.Server], assoc)
	}
	if len(held["pod1"]) == 0 || len(held["remote"]) == 0 || len(held) != 2 {
		t.Fatalf("associations reached %v, want pod1 and remote", held)
	}
	byPort := func(flows []sctpFlow) map[string]sctpFlow {
		m := map[string]sctpFlow{}
		for _, f := range flows {
			m[f.clientPort] = f
		}
		return m
	}
	portOf := func(as *netns.SCTPAssociation) string { return strconv.Itoa(int(as.Local.Port())) }
	flows := byPort(listSCTPFlows(t, tp.Node, fam))
	for server, as := range held {
		want := map[string]netip.Addr{"pod1": pod1.IP, "remote": remote.IP}[server]
		for _, assoc := range as {
			f, ok := flows[portOf(assoc)]
			if !ok || f.endpoint != want || f.state != "ESTABLISHED" {
				t.Fatalf("association from port %s to %s: conntrack entry %v (found %v), want ESTABLISHED from %s; all: %v",
					portOf(assoc), server, f, ok, want, flows)
			}
		}
	}

	// pod1 stops serving: the rules drop it, then the Cleaner deletes its flows.
	sync(after)
	handle, err := vnetns.GetFromName(tp.Node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = handle.Close() })
	ct, err := NewAt(handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ct.Close)
	deleted, err := NewCleaner(ct).Cleanup(context.Background(), []*tables.ServicePort{before}, []*tables.ServicePort{after})
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if deleted != len(held["pod1"]) {
		t.Errorf("Cleanup deleted %d flows, want %d (the associations to pod1)", deleted, len(held["pod1"]))
	}
	left := byPort(listSCTPFlows(t, tp.Node, fam))
	for _, assoc := range held["pod1"] {
		if f, ok := left[portOf(assoc)]; ok {
			t.Errorf("the flow of the association from port %s to the removed pod1 is still there: %v", portOf(assoc), f)
		}
	}
	for _, assoc := range held["remote"] {
		if f, ok := left[portOf(assoc)]; !ok || f.endpoint != remote.IP {
			t.Errorf("the flow of the association from port %s to remote, still serving, is gone (%v, %v)", portOf(assoc), f, ok)
		}
	}
	for i := 0; i < 4; i++ {
		r, err := tp.Dial(tp.Pod2, "sctp", svcIP.String(), 9000)
		if err != nil || r.Server != "remote" {
			t.Fatalf("new association after pod1 left: %+v, %v; want remote", r, err)
		}
	}
}
