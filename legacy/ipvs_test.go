package legacy

import (
	"bytes"
	"context"
	"net"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// The kernels these tests run on have no IPVS, so the IPVS logic is tested against
// fakeIPVS only; kube-ipvs0 and ipsets are also tested for real in kernel_test.go.

func vs(addr string, port uint16) VirtualService {
	return VirtualService{Address: net.ParseIP(addr), Protocol: 6, Port: port}
}

func TestIPVSCleanup(t *testing.T) {
	for _, tc := range []struct {
		name        string
		services    []VirtualService
		noIPVS      bool
		links       map[string][]string
		kinds       map[string]string
		sets        []string
		wantDeleted []string
		wantKept    []string
		wantLinks   []string
		wantSets    []string
		wantReport  []string
	}{
		{
			name: "kube-proxy's virtual services, kube-ipvs0 and ipsets go; the rest stays",
			services: []VirtualService{
				vs("10.96.0.10", 80),       // ClusterIP on kube-ipvs0
				vs("fd00:96::10", 80),      // IPv6 ClusterIP on kube-ipvs0
				vs("192.0.2.10", 443),      // load-balancer IP on kube-ipvs0
				vs("192.168.100.1", 30080), // NodePort on a node address
				vs("fd00:100::1", 30080),   // IPv6 NodePort
				vs("192.168.100.1", 80),    // keepalived on the node address: not a NodePort
				vs("203.0.113.5", 30080),   // not a local address
				{FWMark: 7, Protocol: 0},   // firewall-mark service
				{Address: net.ParseIP("10.96.0.11"), Protocol: 17, Port: 53}, // UDP ClusterIP
			},
			links: map[string][]string{
				DummyInterface: {"10.96.0.10", "10.96.0.11", "fd00:96::10", "192.0.2.10"},
				"eth0":         {"192.168.100.1", "fd00:100::1"},
				"lo":           {"127.0.0.1", "::1"},
			},
			sets: []string{"KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP", "KUBE-IPVS-IPS", "KUBE-ROUTER-POD-SUBNETS", "my-set"},
			wantDeleted: []string{
				"TCP 10.96.0.10:80", "TCP 192.0.2.10:443", "TCP 192.168.100.1:30080",
				"TCP [fd00:100::1]:30080", "TCP [fd00:96::10]:80", "UDP 10.96.0.11:53",
			},
			wantKept:  []string{"TCP 192.168.100.1:80", "TCP 203.0.113.5:30080", "fwmark 7"},
			wantLinks: []string{"eth0", "lo"},
			wantSets:  []string{"KUBE-ROUTER-POD-SUBNETS", "my-set"},
			wantReport: []string{
				"ipvs: removed virtual service TCP 10.96.0.10:80",
				"ipvs: kept virtual service fwmark 7 (not kube-proxy's)",
				"ipvs: removed interface kube-ipvs0",
				"ipvs: removed ipsets KUBE-CLUSTER-IP KUBE-NODE-PORT-TCP KUBE-IPVS-IPS",
			},
		},
		{
			name:       "no IPVS in the kernel: the interface and ipsets still go",
			noIPVS:     true,
			links:      map[string][]string{DummyInterface: {"10.96.0.10"}, "eth0": {"192.168.100.1"}},
			sets:       []string{"KUBE-LOOP-BACK"},
			wantLinks:  []string{"eth0"},
			wantReport: []string{"ipvs: the kernel has no IPVS loaded: no virtual services to remove", "ipvs: removed interface kube-ipvs0"},
		},
		{
			name:        "a kube-ipvs0 that is not a dummy is not kube-proxy's: it and its addresses' services stay",
			services:    []VirtualService{vs("10.96.0.10", 80), vs("192.168.100.1", 30080)},
			links:       map[string][]string{DummyInterface: {"10.96.0.10"}, "eth0": {"192.168.100.1"}},
			kinds:       map[string]string{DummyInterface: "bridge"},
			wantDeleted: []string{"TCP 192.168.100.1:30080"},
			wantKept:    []string{"TCP 10.96.0.10:80"},
			wantLinks:   []string{"eth0", DummyInterface},
			wantReport:  []string{"ipvs: warning: kube-ipvs0 is a bridge interface, not the dummy kube-proxy creates: left alone"},
		},
		{
			name:       "nothing left: nothing removed",
			links:      map[string][]string{"eth0": {"192.168.100.1"}},
			wantLinks:  []string{"eth0"},
			wantReport: []string{"ipvs: no virtual services to remove", "ipvs: no interface kube-ipvs0"},
		},
		{
			name:       "IPVS loaded with only others' virtual services: none to remove, they stay",
			services:   []VirtualService{{FWMark: 7, Protocol: 0}},
			links:      map[string][]string{"eth0": {"192.168.100.1"}},
			wantKept:   []string{"fwmark 7"},
			wantLinks:  []string{"eth0"},
			wantReport: []string{"ipvs: no virtual services to remove", "ipvs: kept virtual service fwmark 7 (not kube-proxy's)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ipvs := &fakeIPVS{services: tc.services, noIPVS: tc.noIPVS}
			links := &fakeLinks{links: tc.links, kinds: tc.kinds}
			sets := &fakeIPSets{names: tc.sets}
			var out bytes.Buffer
			err := Cleanup(context.Background(), Options{
				Mode: ModeIPVS, Exec: newFake(map[Tool]string{"iptables-nft": ""}), Out: &out,
				IPVS: ipvs, Links: links, IPSets: sets, ProcRoot: emptyProc(t), Probe: noProbe,
			})
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(ipvs.deleted)
			if diff := cmp.Diff(tc.wantDeleted, ipvs.deleted); diff != "" {
				t.Errorf("deleted virtual services (-want +got):\n%s", diff)
			}
			var kept []string
			for _, s := range ipvs.services {
				kept = append(kept, s.String())
			}
			sort.Strings(kept)
			if diff := cmp.Diff(tc.wantKept, kept); diff != "" {
				t.Errorf("kept virtual services (-want +got):\n%s", diff)
			}
			var gotLinks []string
			for l := range links.links {
				gotLinks = append(gotLinks, l)
			}
			sort.Strings(gotLinks)
			if diff := cmp.Diff(tc.wantLinks, gotLinks); diff != "" {
				t.Errorf("interfaces left (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSets, sets.names, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("ipsets left (-want +got):\n%s", diff)
			}
			for _, want := range tc.wantReport {
				if !strings.Contains(out.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestIPVSModeCleansIPTablesFirst(t *testing.T) {
	// The ipsets can only go once no rule references them; the fake checks nothing of the
	// sort, so check the order of operations through the report instead.
	f := newFake(map[Tool]string{"iptables-nft": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
`})
	var out bytes.Buffer
	err := Cleanup(context.Background(), Options{
		Mode: ModeIPVS, Exec: f, Out: &out, IPVS: &fakeIPVS{}, Links: &fakeLinks{links: map[string][]string{}},
		IPSets: &fakeIPSets{names: []string{"KUBE-CLUSTER-IP"}}, ProcRoot: emptyProc(t), Probe: noProbe,
	})
	if err != nil {
		t.Fatal(err)
	}
	report := out.String()
	chains, sets := strings.Index(report, "kube-proxy chains from table nat"), strings.Index(report, "ipsets KUBE-CLUSTER-IP")
	if chains < 0 || sets < 0 || chains > sets {
		t.Errorf("want the chains removed before the ipsets:\n%s", report)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"iptables": ModeIPTables, "ipvs": ModeIPVS} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "nftables", "IPTABLES"} {
		if _, err := ParseMode(bad); err == nil {
			t.Errorf("ParseMode(%q): no error", bad)
		}
	}
}
