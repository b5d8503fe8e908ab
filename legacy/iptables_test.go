package legacy

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func fixture(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/iptables.save")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOwned(t *testing.T) {
	for _, tc := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"nat", "KUBE-SVC-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-SVL-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-SEP-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-EXT-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-FW-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-XLB-ABCDEFGHIJKLMNOP", true},
		{"nat", "KUBE-MARK-MASQ", true},
		{"nat", "KUBE-POSTROUTING", true},
		{"nat", "KUBE-NODE-PORT", true},
		{"nat", "KUBE-LOAD-BALANCER", true},
		{"filter", "KUBE-PROXY-FIREWALL", true},
		{"filter", "KUBE-IPVS-OUT-FILTER", true},
		{"mangle", "KUBE-PROXY-CANARY", true},
		// kubelet's
		{"filter", "KUBE-FIREWALL", false},
		{"nat", "KUBE-KUBELET-CANARY", false},
		{"nat", "KUBE-MARK-DROP", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		// other components' KUBE-*
		{"filter", "KUBE-ROUTER-INPUT", false},
		{"filter", "KUBE-POD-FW-ABCDEFGHIJKLMNOP", false},
		{"filter", "KUBE-NWPLCY-ABCDEFGHIJKLMNOP", false},
		// per-Service prefixes only in nat, and never the bare prefix
		{"filter", "KUBE-SVC-ABCDEFGHIJKLMNOP", false},
		{"nat", "KUBE-SVC-", false},
		{"mangle", "KUBE-SERVICES", false},
		{"raw", "KUBE-SERVICES", false},
		{"nat", "DOCKER", false},
	} {
		if got := Owned(tc.table, tc.chain); got != tc.want {
			t.Errorf("Owned(%s, %s) = %v, want %v", tc.table, tc.chain, got, tc.want)
		}
	}
}

func TestSplitWords(t *testing.T) {
	got, err := splitWords(`-s 10.0.0.0/8 -m comment --comment "cni masquerade \"pods\"" -j CNI-MASQ`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-s", "10.0.0.0/8", "-m", "comment", "--comment", `cni masquerade "pods"`, "-j", "CNI-MASQ"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	if _, err := splitWords(`--comment "open`); err == nil {
		t.Error("unterminated quote: no error")
	}
}

// fixtureAfter is what must stay of testdata/iptables.save: every chain and rule that is
// not kube-proxy's, kubelet's included.
var fixtureAfterChains = []string{
	"iptables-nft filter DOCKER",
	"iptables-nft filter FORWARD",
	"iptables-nft filter INPUT",
	"iptables-nft filter KUBE-FIREWALL",
	"iptables-nft filter KUBE-KUBELET-CANARY",
	"iptables-nft filter KUBE-ROUTER-INPUT",
	"iptables-nft filter OUTPUT",
	"iptables-nft mangle FORWARD",
	"iptables-nft mangle INPUT",
	"iptables-nft mangle KUBE-IPTABLES-HINT",
	"iptables-nft mangle KUBE-KUBELET-CANARY",
	"iptables-nft mangle OUTPUT",
	"iptables-nft mangle POSTROUTING",
	"iptables-nft mangle PREROUTING",
	"iptables-nft nat CNI-MASQ",
	"iptables-nft nat DOCKER",
	"iptables-nft nat INPUT",
	"iptables-nft nat KUBE-KUBELET-CANARY",
	"iptables-nft nat KUBE-MARK-DROP",
	"iptables-nft nat OUTPUT",
	"iptables-nft nat POSTROUTING",
	"iptables-nft nat PREROUTING",
}

var fixtureAfterRules = []string{
	`iptables-nft filter -A DOCKER -d 172.17.0.2/32 ! -i docker0 -o docker0 -p tcp -m tcp --dport 80 -j ACCEPT`,
	`iptables-nft filter -A FORWARD -o docker0 -j DOCKER`,
	`iptables-nft filter -A FORWARD -s 10.244.0.0/16 -j ACCEPT`,
	`iptables-nft filter -A INPUT -j KUBE-FIREWALL`,
	`iptables-nft filter -A INPUT -m comment --comment "kube-router netpol - 4IA2OSFRMVNDXBVV" -j KUBE-ROUTER-INPUT`,
	`iptables-nft filter -A INPUT -p tcp -m tcp --dport 22 -j ACCEPT`,
	`iptables-nft filter -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
	`iptables-nft filter -A KUBE-ROUTER-INPUT -d 10.96.0.0/12 -m comment --comment "allow traffic to primary cluster IP range - RWWNLYZYAJWRGVDE" -j RETURN`,
	`iptables-nft filter -A OUTPUT -j KUBE-FIREWALL`,
	`iptables-nft mangle -A PREROUTING -i eth9 -j MARK --set-xmark 0x10/0x10`,
	`iptables-nft nat -A CNI-MASQ ! -d 224.0.0.0/4 -j MASQUERADE`,
	`iptables-nft nat -A DOCKER -i docker0 -j RETURN`,
	`iptables-nft nat -A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000`,
	`iptables-nft nat -A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER`,
	`iptables-nft nat -A POSTROUTING -s 10.244.1.0/24 -m comment --comment "cni masquerade \"pods\"" -j CNI-MASQ`,
	`iptables-nft nat -A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE`,
	`iptables-nft nat -A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER`,
}

func TestIPTablesCleanup(t *testing.T) {
	ipvsSave := `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-A INPUT -j ACCEPT
-A FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
-A KUBE-PROXY-FIREWALL -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
COMMIT
`
	builtinOnly := []string{
		"%s filter FORWARD", "%s filter INPUT", "%s filter OUTPUT",
		"%s nat INPUT", "%s nat OUTPUT", "%s nat POSTROUTING", "%s nat PREROUTING",
	}
	expand := func(tool string, lines []string) []string {
		var out []string
		for _, l := range lines {
			out = append(out, strings.ReplaceAll(l, "%s", tool))
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		saves      map[Tool]string
		wantChains []string
		wantRules  []string
		// wantRestores is how many iptables-restore transactions run (one per table).
		wantRestores int
	}{
		{
			name:         "iptables mode: kube-proxy's chains and the jumps to them go, kubelet's and everyone else's stay",
			saves:        map[Tool]string{"iptables-nft": fixture(t)},
			wantChains:   fixtureAfterChains,
			wantRules:    fixtureAfterRules,
			wantRestores: 3,
		},
		{
			name:         "IPVS mode: its ipset-based chains go",
			saves:        map[Tool]string{"iptables-legacy": ipvsSave},
			wantChains:   expand("iptables-legacy", builtinOnly),
			wantRules:    []string{"iptables-legacy filter -A INPUT -j ACCEPT"},
			wantRestores: 2,
		},
		{
			name: "no kube-proxy chains: nothing is restored",
			saves: map[Tool]string{"iptables-nft": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A POSTROUTING -j MASQUERADE
COMMIT
`},
			wantChains: []string{"iptables-nft nat INPUT", "iptables-nft nat KUBE-KUBELET-CANARY", "iptables-nft nat OUTPUT", "iptables-nft nat POSTROUTING", "iptables-nft nat PREROUTING"},
			wantRules:  []string{"iptables-nft nat -A POSTROUTING -j MASQUERADE"},
		},
		{
			name: "a foreign chain's jump into KUBE-SERVICES goes with it; the chain and its other rules stay",
			saves: map[Tool]string{"ip6tables-nft": `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:MY-PRE - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]
-A PREROUTING -j MY-PRE
-A MY-PRE -d fd00::1/128 -j RETURN
-A MY-PRE -j KUBE-SERVICES
-A MY-PRE -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:96::1/128 -p tcp -m tcp --dport 80 -j KUBE-SVC-ABCDEFGHIJKLMNOP
-A KUBE-SVC-ABCDEFGHIJKLMNOP -j KUBE-SERVICES
COMMIT
`},
			wantChains: []string{"ip6tables-nft nat INPUT", "ip6tables-nft nat MY-PRE", "ip6tables-nft nat OUTPUT", "ip6tables-nft nat POSTROUTING", "ip6tables-nft nat PREROUTING"},
			wantRules: []string{
				"ip6tables-nft nat -A MY-PRE -d fd00::1/128 -j RETURN",
				"ip6tables-nft nat -A PREROUTING -j MY-PRE",
			},
			wantRestores: 1,
		},
		{
			name: "every backend and family is cleaned",
			saves: map[Tool]string{
				"iptables-nft":     ipvsSave,
				"iptables-legacy":  ipvsSave,
				"ip6tables-nft":    ipvsSave,
				"ip6tables-legacy": ipvsSave,
			},
			wantChains: append(append(append(expand("ip6tables-legacy", builtinOnly), expand("ip6tables-nft", builtinOnly)...),
				expand("iptables-legacy", builtinOnly)...), expand("iptables-nft", builtinOnly)...),
			wantRules: []string{
				"ip6tables-legacy filter -A INPUT -j ACCEPT", "ip6tables-nft filter -A INPUT -j ACCEPT",
				"iptables-legacy filter -A INPUT -j ACCEPT", "iptables-nft filter -A INPUT -j ACCEPT",
			},
			wantRestores: 8,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(tc.saves)
			var out bytes.Buffer
			err := Cleanup(context.Background(), Options{Mode: ModeIPTables, Exec: f, Out: &out, ProcRoot: emptyProc(t), Probe: noProbe})
			if err != nil {
				t.Fatalf("Cleanup: %v\nrestores:\n%s", err, strings.Join(f.restores, "\n"))
			}
			if diff := cmp.Diff(tc.wantChains, f.chains()); diff != "" {
				t.Errorf("chains after cleanup (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantRules, f.rules()); diff != "" {
				t.Errorf("rules after cleanup (-want +got):\n%s", diff)
			}
			if len(f.restores) != tc.wantRestores {
				t.Errorf("%d restores, want %d:\n%s", len(f.restores), tc.wantRestores, strings.Join(f.restores, "\n"))
			}
			t.Logf("report:\n%s", out.String())

			// A second run finds nothing.
			f.restores = nil
			if err := Cleanup(context.Background(), Options{Mode: ModeIPTables, Exec: f, ProcRoot: emptyProc(t), Probe: noProbe}); err != nil {
				t.Fatalf("second Cleanup: %v", err)
			}
			if len(f.restores) != 0 {
				t.Errorf("second run restored:\n%s", strings.Join(f.restores, "\n"))
			}
		})
	}
}

func TestIPTablesCleanupDryRunChangesNothing(t *testing.T) {
	f := newFake(map[Tool]string{"iptables-nft": fixture(t)})
	before := f.rules()
	var out bytes.Buffer
	if err := Cleanup(context.Background(), Options{Mode: ModeIPTables, DryRun: true, Exec: f, Out: &out, ProcRoot: emptyProc(t), Probe: noProbe}); err != nil {
		t.Fatal(err)
	}
	if len(f.restores) != 0 || !cmp.Equal(before, f.rules()) {
		t.Errorf("dry run changed the rules")
	}
	for _, want := range []string{
		"iptables-nft: would remove rule from table nat: -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
		"iptables-nft: would remove 13 kube-proxy chains from table nat: KUBE-EXT-ABCDEFGHIJKLMNOP KUBE-FW-ABCDEFGHIJKLMNOP KUBE-MARK-MASQ",
		"iptables-nft: would remove 1 kube-proxy chains from table mangle: KUBE-PROXY-CANARY",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestIPTablesCleanupReportsRestoreFailure(t *testing.T) {
	f := newFake(map[Tool]string{"iptables-nft": fixture(t)})
	f.failRestore = true
	before := f.rules()
	err := Cleanup(context.Background(), Options{Mode: ModeIPTables, Exec: f, ProcRoot: emptyProc(t), Probe: noProbe})
	if err == nil || !strings.Contains(err.Error(), "removing kube-proxy's chains from iptables-nft table nat") {
		t.Fatalf("err = %v, want the failed table named", err)
	}
	if !cmp.Equal(before, f.rules()) {
		t.Error("a failed restore changed the rules")
	}
}

func TestTools(t *testing.T) {
	for _, tc := range []struct {
		name      string
		installed []string
		want      []Tool
		wantErr   error
	}{
		{"both backends", []string{"iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy", "iptables", "ip6tables"},
			[]Tool{"iptables-nft", "iptables-legacy", "ip6tables-nft", "ip6tables-legacy"}, nil},
		{"plain commands only", []string{"iptables", "ip6tables"}, []Tool{"iptables", "ip6tables"}, nil},
		{"IPv4 only", []string{"iptables-nft"}, []Tool{"iptables-nft"}, nil},
		{"nothing installed", nil, nil, ErrNoIPTables},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeIPTables{installed: map[string]bool{}}
			for _, c := range tc.installed {
				f.installed[c+"-save"], f.installed[c+"-restore"] = true, true
			}
			got, err := Tools(f)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Error(diff)
			}
		})
	}
}

// emptyProc is a /proc with only "self", in this process's network namespace.
func emptyProc(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink("/proc/self", dir+"/self"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func noProbe(context.Context, string) string { return "" }
