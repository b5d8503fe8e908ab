package servicecidr_test

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/tables"
	"github.com/shardproxy/shardproxy/tables/servicecidr"
	"github.com/shardproxy/shardproxy/test/netns"
)

// kernelFamily holds one family's addresses for TestDropInRealKernel.
type kernelFamily struct {
	fam tables.Family
	// cidr is the ServiceCIDR; the client (the node's default route) answers on all of it.
	cidr netip.Prefix
	// inside is a second ServiceCIDR inside cidr, as a cluster growing its range has.
	inside netip.Prefix
	// unallocated, kubeProxy, kubeProxyEmpty, own and ownEmpty are addresses in cidr:
	// nobody's, kube-proxy's Service with and without endpoints, and an instance's.
	unallocated, kubeProxy, kubeProxyEmpty, own, ownEmpty string
	remote, pod1                                          string
	// ipX is the nft expression family.
	ipX string
}

// TestDropInRealKernel sends real traffic through a node holding the node table: a
// connection to an unallocated address of a ServiceCIDR, which the node's default route
// would carry to a client that answers on the whole range, is dropped (from a pod and
// from the node itself); a Service a kube-proxy translates (its own table, upstream's
// priorities) still works and its reject for a Service without endpoints still refuses;
// an instance's own Services still work and its reject still refuses.
func TestDropInRealKernel(t *testing.T) {
	for _, kf := range []kernelFamily{
		{fam: tables.IPv4, cidr: netip.MustParsePrefix("10.96.0.0/16"), inside: netip.MustParsePrefix("10.96.0.0/24"), ipX: "ip",
			unallocated: "10.96.0.50", kubeProxy: "10.96.0.20", kubeProxyEmpty: "10.96.0.21", own: "10.96.0.30", ownEmpty: "10.96.0.31",
			remote: netns.RemoteIPv4, pod1: netns.Pod1IPv4},
		{fam: tables.IPv6, cidr: netip.MustParsePrefix("fd00:96::/112"), inside: netip.MustParsePrefix("fd00:96::/120"), ipX: "ip6",
			unallocated: "fd00:96::50", kubeProxy: "fd00:96::20", kubeProxyEmpty: "fd00:96::21", own: "fd00:96::30", ownEmpty: "fd00:96::31",
			remote: netns.RemoteIPv6, pod1: netns.Pod1IPv6},
	} {
		t.Run(kf.fam.String(), func(t *testing.T) { testDropInRealKernel(t, kf) })
	}
}

func testDropInRealKernel(t *testing.T, kf kernelFamily) {
	tp := netns.New(t)
	ipCmd := "-4"
	if kf.fam == tables.IPv6 {
		ipCmd = "-6"
	}
	// The world behind the default route answers on every address of the range.
	if _, err := tp.Exec(tp.Client, "ip", ipCmd, "route", "add", "local", kf.cidr.String(), "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	tp.StartServer(tp.Client, "outside", "tcp", 80)
	tp.StartServer(tp.Remote, "remote", "tcp", 8080)
	tp.StartServer(tp.Pod1, "pod1", "tcp", 8080)
	if r, err := tp.Dial(tp.Pod2, "tcp", kf.unallocated, 80); err != nil || r.Server != "outside" {
		t.Fatalf("without the node table: %+v, %v; want the outside listener to answer (the leak this table stops)", r, err)
	}

	loadKubeProxy(t, tp, kf)
	loadInstance(t, tp, kf)
	doIn(t, tp, func() error {
		nft, err := tables.NewNFT(kf.fam, servicecidr.TableName("shardproxy"))
		if err != nil {
			return err
		}
		return servicecidr.Write(context.Background(), nft, kf.fam, []netip.Prefix{kf.cidr, kf.inside})
	})

	t.Run("unallocated address from a pod is dropped", func(t *testing.T) {
		_, err := tp.DialWith(tp.Pod2, "tcp", kf.unallocated, 80, netns.DialOptions{Timeout: time.Second})
		if !netns.IsTimeout(err) {
			t.Errorf("got %v, want a timeout (dropped)", err)
		}
	})
	t.Run("unallocated address from the node is dropped", func(t *testing.T) {
		_, err := tp.DialWith(tp.Node, "tcp", kf.unallocated, 80, netns.DialOptions{Timeout: time.Second})
		// A drop on output fails the sender's connect with EPERM at once.
		if !errors.Is(err, syscall.EPERM) && !netns.IsTimeout(err) {
			t.Errorf("got %v, want EPERM or a timeout (dropped)", err)
		}
	})
	for _, from := range []string{tp.Pod2, tp.Node} {
		t.Run("kube-proxy's Service works from "+from, func(t *testing.T) {
			if r, err := tp.Dial(from, "tcp", kf.kubeProxy, 80); err != nil || r.Server != "remote" {
				t.Errorf("got %+v, %v; want remote", r, err)
			}
		})
		t.Run("own Service works from "+from, func(t *testing.T) {
			if r, err := tp.Dial(from, "tcp", kf.own, 80); err != nil || r.Server != "pod1" {
				t.Errorf("got %+v, %v; want pod1", r, err)
			}
		})
	}
	t.Run("kube-proxy's and our rejects of Services without endpoints still refuse", func(t *testing.T) {
		for _, addr := range []string{kf.kubeProxyEmpty, kf.ownEmpty} {
			if _, err := tp.Dial(tp.Pod2, "tcp", addr, 80); !netns.IsRefused(err) {
				t.Errorf("%s: got %v, want refused", addr, err)
			}
		}
	})
	t.Run("the counter shows the drops", func(t *testing.T) {
		out, err := tp.Exec(tp.Node, "nft", "list", "table", kf.ipX, servicecidr.TableName("shardproxy"))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`counter packets [1-9]`).MatchString(out) {
			t.Errorf("no drop counted:\n%s", out)
		}
	})
}

// loadKubeProxy stands in for upstream kube-proxy in nftables mode: its own table, DNAT
// at dstnat, rejects at filter.
func loadKubeProxy(t *testing.T, tp *netns.Topology, kf kernelFamily) {
	t.Helper()
	script := `table ` + kf.ipX + ` kube-proxy {
	chain nat-prerouting { type nat hook prerouting priority dstnat; ` + kf.ipX + ` daddr ` + kf.kubeProxy + ` tcp dport 80 dnat to ` + bracket(kf, kf.remote) + `:8080; }
	chain nat-output { type nat hook output priority -100; ` + kf.ipX + ` daddr ` + kf.kubeProxy + ` tcp dport 80 dnat to ` + bracket(kf, kf.remote) + `:8080; }
	chain filter-forward { type filter hook forward priority filter; ct state new ` + kf.ipX + ` daddr ` + kf.kubeProxyEmpty + ` reject; }
	chain filter-output { type filter hook output priority filter; ct state new ` + kf.ipX + ` daddr ` + kf.kubeProxyEmpty + ` reject; }
}
`
	if err := tp.NFT(tp.Node, script); err != nil {
		t.Fatal(err)
	}
}

func bracket(kf kernelFamily, addr string) string {
	if kf.fam == tables.IPv6 {
		return "[" + addr + "]"
	}
	return addr
}

// loadInstance loads an instance's table with one Service with an endpoint and one
// without.
func loadInstance(t *testing.T, tp *netns.Topology, kf kernelFamily) {
	t.Helper()
	pod1 := tables.Endpoint{IP: netip.MustParseAddr(kf.pod1), Port: 8080}
	svc := func(name, ip string, eps []tables.Endpoint) []*tables.ServicePort {
		return []*tables.ServicePort{{
			Name:     tables.ServicePortName{Namespace: "ns", Name: name, Port: "http"},
			Protocol: tables.TCP, Port: 80, ClusterIP: netip.MustParseAddr(ip),
			ClusterEndpoints: eps, LocalEndpoints: eps, HasEndpoints: len(eps) > 0,
		}}
	}
	cfg := tables.Config{Family: kf.fam, TablePrefix: "shardproxy", Instance: "own", MasqueradeBit: 14}
	doIn(t, tp, func() error {
		nft, err := tables.NewNFT(kf.fam, cfg.TableName())
		if err != nil {
			return err
		}
		s, err := tables.NewSyncer(cfg, nft)
		if err != nil {
			return err
		}
		_, err = s.Full(context.Background(), map[tables.ServiceName][]*tables.ServicePort{
			{Namespace: "ns", Name: "own"}:   svc("own", kf.own, []tables.Endpoint{pod1}),
			{Namespace: "ns", Name: "empty"}: svc("empty", kf.ownEmpty, nil),
		})
		return err
	})
}

// doIn runs fn in the node's namespace: nft runs there, and netlink sockets open there.
func doIn(t *testing.T, tp *netns.Topology, fn func() error) {
	t.Helper()
	if err := tp.Do(tp.Node, fn); err != nil {
		t.Fatal(err)
	}
}
