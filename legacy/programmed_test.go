package legacy

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The testdata/nft files are `nft -j` output of a real kube-proxy v1.36.3 in nftables
// mode beside shardproxy (test/e2e/coexist), with the Services coexist/rec-web-nft (two
// IPv4 endpoints), coexist/rec-noep (no endpoints), coexist/rec-lb (dual-stack
// LoadBalancer, Local policy, IPv4 endpoints only) and default/kubernetes.
const (
	nftTablesArgs = "-j list tables"
	nftIPServices = "-j list map ip kube-proxy service-ips"
	nftIPNoEP     = "-j list map ip kube-proxy no-endpoint-services"
	nftIP6Service = "-j list map ip6 kube-proxy service-ips"
	nftIP6NoEP    = "-j list map ip6 kube-proxy no-endpoint-services"
)

// fakeNFT is an Exec with nft installed, answering `nft args` from out (by the joined
// args; any other fails as nft does for a missing object), and iptables from the
// embedded fake.
type fakeNFT struct {
	*fakeIPTables
	out map[string]string
}

func (f fakeNFT) LookPath(name string) error {
	if name == "nft" {
		return nil
	}
	return f.fakeIPTables.LookPath(name)
}

func (f fakeNFT) Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	if name != "nft" {
		return f.fakeIPTables.Run(ctx, stdin, name, args...)
	}
	out, ok := f.out[strings.Join(args, " ")]
	if !ok {
		return nil, fmt.Errorf("nft %s: exit status 1: Error: No such file or directory", strings.Join(args, " "))
	}
	return []byte(out), nil
}

// recordedNFT returns the recorded outputs, by args.
func recordedNFT(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for args, file := range map[string]string{
		nftTablesArgs: "tables.json",
		nftIPServices: "ip-service-ips.json", nftIPNoEP: "ip-no-endpoint-services.json",
		nftIP6Service: "ip6-service-ips.json", nftIP6NoEP: "ip6-no-endpoint-services.json",
	} {
		data, err := os.ReadFile(filepath.Join("testdata", "nft", file))
		if err != nil {
			t.Fatal(err)
		}
		out[args] = string(data)
	}
	return out
}

// nftMap is `nft -j list map FAMILY kube-proxy NAME` holding elems (JSON [key, value]).
func nftMap(family, name string, elems ...string) string {
	return fmt.Sprintf(`{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, `+
		`{"map": {"family": %q, "name": %q, "table": "kube-proxy", "map": "verdict", "elem": [%s]}}]}`,
		family, name, strings.Join(elems, ", "))
}

const ipv4Tables = `{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, ` +
	`{"table": {"family": "ip", "name": "shardproxy-team-a", "handle": 3}}, {"table": {"family": "ip", "name": "kube-proxy", "handle": 4}}]}`

// TestProgrammedServices: the Services kube-proxy programmed are read in either mode,
// whichever is there: in iptables mode from its rule comments (a cluster IP sent to a
// KUBE-SVC chain: endpoints; a "has no endpoints" reject); in nftables mode from its
// service-ips map (a cluster IP sent to a service- or local- chain) and its
// no-endpoint-services map (a reject, commented "ns/name:port"). Load-balancer and
// external IPs, a "no local endpoints" drop, and other components' rules and tables say
// nothing.
func TestProgrammedServices(t *testing.T) {
	save, err := os.ReadFile("testdata/iptables.save")
	if err != nil {
		t.Fatal(err)
	}
	ipv6 := `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-EXT-BBBBBBBBBBBBBBBB - [0:0]
-A KUBE-SERVICES -d fd00::10/128 -p tcp -m comment --comment "ns2/v6 cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d fd00::11/128 -p tcp -m comment --comment "ns2/ext:p external IP" -m tcp --dport 80 -j KUBE-EXT-BBBBBBBBBBBBBBBB
COMMIT
`
	iptablesMode := map[Tool]string{"iptables-nft": string(save), "ip6tables-nft": ipv6}
	noKubeProxy := map[Tool]string{"iptables-nft": "", "ip6tables-nft": ""}
	recorded := recordedNFT(t)
	withoutKubeProxyTables := strings.ReplaceAll(recorded[nftTablesArgs], `"name": "kube-proxy"`, `"name": "other"`)
	recordedWant := map[string]ServiceRules{
		"coexist/rec-web-nft": {Endpoints: true},
		"coexist/rec-noep":    {NoEndpoints: true},
		// IPv4 endpoints only: the IPv6 cluster IP rejects.
		"coexist/rec-lb":     {Endpoints: true, NoEndpoints: true},
		"default/kubernetes": {Endpoints: true},
	}
	for _, tc := range []struct {
		name     string
		iptables map[Tool]string
		nft      map[string]string // nil: nft not installed
		want     map[string]ServiceRules
	}{
		{
			name:     "iptables mode",
			iptables: iptablesMode,
			want: map[string]ServiceRules{
				"ns1/web":  {Endpoints: true},
				"ns1/lb":   {Endpoints: true},
				"ns1/noep": {NoEndpoints: true},
				"ns2/v6":   {Endpoints: true},
			},
		},
		{name: "nftables mode (recorded)", iptables: noKubeProxy, nft: recorded, want: recordedWant},
		{name: "nftables mode without iptables installed", nft: recorded, want: recordedWant},
		{name: "neither mode", iptables: noKubeProxy, nft: map[string]string{nftTablesArgs: withoutKubeProxyTables}, want: map[string]ServiceRules{}},
		{name: "nothing installed", want: map[string]ServiceRules{}},
		{
			name:     "nftables mode, IPv4 only, hand-written verdicts",
			iptables: noKubeProxy,
			nft: map[string]string{
				nftTablesArgs: ipv4Tables,
				nftIPServices: nftMap("ip", nftServiceIPs,
					`[{"concat": ["10.96.0.10", "udp", 53]}, {"goto": {"target": "local-ABCD2345-kube-system/kube-dns/udp/dns"}}]`,
					`[{"concat": ["192.0.2.1", "tcp", 80]}, {"goto": {"target": "external-ABCD2345-ns/lb-only/tcp/http"}}]`,
					`[{"concat": ["10.96.0.11", "tcp", 80]}, {"goto": {"target": "not-a-service-chain"}}]`),
				nftIPNoEP: nftMap("ip", nftNoEndpoints,
					`[{"elem": {"val": {"concat": ["10.96.0.12", "tcp", 80]}, "comment": "ns/itp-local:http"}}, {"drop": null}]`,
					`[{"elem": {"val": {"concat": ["10.96.0.13", "tcp", 80]}, "comment": "ns/unnamed"}}, {"goto": {"target": "reject-chain"}}]`,
					`[{"elem": {"val": {"concat": ["10.96.0.14", "tcp", 80]}, "comment": "no-slash"}}, {"goto": {"target": "reject-chain"}}]`),
			},
			want: map[string]ServiceRules{
				"kube-system/kube-dns": {Endpoints: true},
				"ns/unnamed":           {NoEndpoints: true},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := newFake(tc.iptables)
			var ex Exec = fake
			if tc.nft != nil {
				ex = fakeNFT{fakeIPTables: fake, out: tc.nft}
			}
			got, err := ProgrammedServices(context.Background(), ex)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestProgrammedServicesNFTErrors: output nft cannot have given, or a map missing from a
// kube-proxy table, is an error naming what was being read, not an empty reading.
func TestProgrammedServicesNFTErrors(t *testing.T) {
	for _, tc := range []struct {
		name, wantErr string
		nft           map[string]string
	}{
		{"tables not JSON", "parsing nft -j list tables", map[string]string{nftTablesArgs: "table ip kube-proxy"}},
		{"map missing", "reading kube-proxy's ip map service-ips", map[string]string{nftTablesArgs: ipv4Tables}},
		{"no map in the output", "parsing kube-proxy's ip map service-ips: no map",
			map[string]string{nftTablesArgs: ipv4Tables, nftIPServices: ipv4Tables}},
		{"element not a pair", "parsing kube-proxy's ip map no-endpoint-services: map element",
			map[string]string{nftTablesArgs: ipv4Tables, nftIPServices: nftMap("ip", nftServiceIPs),
				nftIPNoEP: nftMap("ip", nftNoEndpoints, `{"concat": ["10.96.0.1", "tcp", 80]}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ProgrammedServices(context.Background(), fakeNFT{fakeIPTables: newFake(nil), out: tc.nft})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// saveFails is an Exec on which the named iptables-save commands fail as iptables-legacy-save
// does for a non-root user.
type saveFails struct {
	Exec
	fail map[string]bool
}

func (s saveFails) Run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	if s.fail[name] {
		return nil, fmt.Errorf("%s: exit status 1: Failed to list table names in /proc/net/ip_tables_names: Permission denied", name)
	}
	return s.Exec.Run(ctx, stdin, name, args...)
}

// TestProgrammedServicesUnreadableBackend: in the unprivileged pod iptables-legacy-save
// fails while iptables-nft-save reads kube-proxy's rules; what was read is returned with
// an error naming the backend that was not (before, the error alone: a rollback beside a
// kube-proxy DaemonSet in iptables mode on the real node never saw kube-proxy's rules).
func TestProgrammedServicesUnreadableBackend(t *testing.T) {
	save, err := os.ReadFile("testdata/iptables.save")
	if err != nil {
		t.Fatal(err)
	}
	legacyEmpty := map[Tool]string{"iptables-nft": string(save), "iptables-legacy": "", "ip6tables-nft": "", "ip6tables-legacy": ""}
	for _, tc := range []struct {
		name    string
		fail    []string
		want    map[string]ServiceRules
		wantErr []string
	}{
		{"legacy unreadable", []string{"iptables-legacy-save", "ip6tables-legacy-save"},
			map[string]ServiceRules{"ns1/web": {Endpoints: true}, "ns1/lb": {Endpoints: true}, "ns1/noep": {NoEndpoints: true}},
			[]string{"reading rules with iptables-legacy-save", "reading rules with ip6tables-legacy-save"}},
		{"nft unreadable", []string{"iptables-nft-save"}, map[string]ServiceRules{}, []string{"reading rules with iptables-nft-save"}},
		{"every backend readable", nil,
			map[string]ServiceRules{"ns1/web": {Endpoints: true}, "ns1/lb": {Endpoints: true}, "ns1/noep": {NoEndpoints: true}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fail := map[string]bool{}
			for _, f := range tc.fail {
				fail[f] = true
			}
			got, err := ProgrammedServices(context.Background(), saveFails{Exec: newFake(legacyEmpty), fail: fail})
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("got error %v, want one containing %q", err, want)
				}
			}
			if len(tc.wantErr) == 0 && err != nil {
				t.Errorf("got error %v, want none", err)
			}
		})
	}
}
