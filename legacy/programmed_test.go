package legacy

import (
	"context"
	"maps"
	"os"
	"testing"
)

// TestProgrammedServices: the Services kube-proxy programmed are read from its rule
// comments: a cluster IP sent to a KUBE-SVC chain (endpoints), a "has no endpoints"
// reject; load-balancer and other rules, and other components' comments, say nothing.
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
	fake := newFake(map[Tool]string{"iptables-nft": string(save), "ip6tables-nft": ipv6})
	tools, err := Tools(fake)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ProgrammedServices(context.Background(), fake, tools)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ServiceRules{
		"ns1/web":  {Endpoints: true},
		"ns1/lb":   {Endpoints: true},
		"ns1/noep": {NoEndpoints: true},
		"ns2/v6":   {Endpoints: true},
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
