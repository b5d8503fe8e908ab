package tracer

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// fakeWith returns a Fake table whose chains get rules ("chain: rule"): pre (filter,
// prerouting, -150), fwd (filter, forward); dnat (nat, prerouting) DNATs 10.96.0.1 to
// 10.244.1.2:8080 and marks it, and snat (nat, postrouting) masquerades marked packets.
func fakeWith(t *testing.T, rules ...string) *knftables.Fake {
	t.Helper()
	fake := knftables.NewFake(knftables.IPv4Family, "test")
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	chain := func(name string, typ knftables.BaseChainType, hook knftables.BaseChainHook, prio string) {
		p := knftables.BaseChainPriority(prio)
		tx.Add(&knftables.Chain{Name: name, Type: &typ, Hook: &hook, Priority: &p})
	}
	tx.Add(&knftables.Set{Name: "states", Type: "ct_state"})
	chain("pre", knftables.FilterType, knftables.PreroutingHook, "-150")
	chain("dnat", knftables.NATType, knftables.PreroutingHook, "-100")
	chain("fwd", knftables.FilterType, knftables.ForwardHook, "0")
	chain("snat", knftables.NATType, knftables.PostroutingHook, "100")
	for _, r := range rules {
		chain, rule, _ := strings.Cut(r, ": ")
		tx.Add(&knftables.Rule{Chain: chain, Rule: rule})
	}
	tx.Add(&knftables.Rule{Chain: "dnat", Rule: "ip daddr 10.96.0.1 meta mark set meta mark or 0x1 dnat ip to 10.244.1.2:8080"})
	tx.Add(&knftables.Rule{Chain: "snat", Rule: "meta mark & 0x1 != 0 masquerade"})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return fake
}

func TestConntrackState(t *testing.T) {
	svc := Packet{Origin: FromOutside, Src: netip.MustParseAddr("192.0.2.9"), IIF: "eth0", Proto: "tcp",
		Dst: netip.MustParseAddr("10.96.0.1"), Port: 80}
	est := func(p Packet, c Conn) Packet { p.State, p.Conn = CtEstablished, c; return p }
	toEndpoint := Conn{DNAT: netip.MustParseAddrPort("10.244.1.9:8080"), Masquerade: true}
	cases := []struct {
		name  string
		rules []string
		pkt   Packet
		want  string // outcomes joined by "; ", or "error: <substring>"
	}{
		{"a new packet is translated by the nat chains", nil, svc, "accept dnat 10.244.1.2:8080 masq"},
		{"an explicit new state is the same", nil, func() Packet { p := svc; p.State = CtNew; return p }(),
			"accept dnat 10.244.1.2:8080 masq"},
		{"an established packet skips the nat chains and keeps its connection's translation", nil,
			est(svc, toEndpoint), "accept dnat 10.244.1.9:8080 masq"},
		{"an established packet never translated stays as it is", nil, est(svc, Conn{}), "accept"},
		{"ct state new matches a new packet", []string{"pre: ct state new drop"}, svc, "drop"},
		{"ct state new does not match an established one", []string{"pre: ct state new drop"},
			est(svc, toEndpoint), "accept dnat 10.244.1.9:8080 masq"},
		{"ct state established matches an established one", []string{"pre: ct state established drop"},
			est(svc, toEndpoint), "drop"},
		{"negated state", []string{"pre: ct state != new drop"}, est(svc, toEndpoint), "drop"},
		{"a state set literal", []string{"pre: ct state { established, related } drop"}, est(svc, toEndpoint), "drop"},
		{"filter chains after DNAT see the connection's endpoint", []string{"fwd: ip daddr 10.244.1.9 reject"},
			est(svc, toEndpoint), "reject dnat 10.244.1.9:8080"},
		{"an unknown state name fails loudly", []string{"pre: ct state establish drop"}, svc,
			"error: unknown conntrack state"},
		{"a comma list without braces fails loudly", []string{"pre: ct state established,related accept"}, svc,
			"error: unknown conntrack state"},
		{"ct state in a set lookup fails loudly", []string{"pre: ct state @states drop"}, svc, "error: only state names"},
		{"ct state as a vmap key fails loudly", []string{"pre: ct state vmap { new : drop }"}, svc, "error: only state names"},
		{"an unmodelled packet state fails loudly", nil, func() Packet { p := svc; p.State = "related"; return p }(),
			"error: unsupported conntrack state"},
		{"a new packet cannot carry a translation", nil, func() Packet { p := svc; p.Conn = toEndpoint; return p }(),
			"error: no conntrack translation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := New(Env{}, fakeWith(t, tc.rules...))
			if err != nil {
				t.Fatal(err)
			}
			res, err := tr.Trace(tc.pkt)
			if want, ok := strings.CutPrefix(tc.want, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("want an error containing %q, got %v (outcomes %v)", want, err, res)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range res {
				got = append(got, o.String())
			}
			if strings.Join(got, "; ") != tc.want {
				t.Errorf("got %q, want %q", strings.Join(got, "; "), tc.want)
			}
		})
	}
}
