package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestPickExpressions: jhash gives the index the kernel computes for the source
// address; numgen compared with a number forks the rule (forkMatch: it goes on for that
// number, ends for the others); anything else fails loudly. (numgen random and inc reach
// every index: the tables package's TestModesMatchRandom traces both through endpoint
// maps.)
func TestPickExpressions(t *testing.T) {
	src4 := netip.MustParseAddr("192.0.2.9")
	src6 := netip.MustParseAddr("fd00::1:e5")
	cases := []struct {
		name string
		rule string
		src  netip.Addr
		want string // outcomes joined by "; ", or "error: <substring>"
	}{
		{"jhash picks one index", fmt.Sprintf("pre: jhash ip saddr mod 2 seed 0x1f2e3d4c %d drop", JHashMod(src4, 0x1f2e3d4c, 2)), src4, "drop"},
		{"jhash misses the other", fmt.Sprintf("pre: jhash ip saddr mod 2 seed 0x1f2e3d4c %d drop", 1-JHashMod(src4, 0x1f2e3d4c, 2)), src4,
			"accept dnat 10.244.1.2:8080 masq"},
		{"unknown numgen kind", "pre: numgen foo mod 2 0 drop", src4, "error: unknown numgen"},
		{"numgen mod 1 offset k is the constant k", "pre: numgen random mod 1 offset 3 3 drop", src4, "drop"},
		{"numgen mod 1 offset k is nothing else", "pre: numgen random mod 1 offset 3 0 drop", src4, "accept dnat 10.244.1.2:8080 masq"},
		{"numgen compared with a literal: the rule goes on or ends", "pre: numgen random mod 2 0 drop", src4, "accept dnat 10.244.1.2:8080 masq; drop"},
		{"numgen inc compared with a literal", "pre: numgen inc mod 3 2 drop", src4, "accept dnat 10.244.1.2:8080 masq; drop"},
		{"numgen compared with a number it never takes", "pre: numgen random mod 2 5 drop", src4, "accept dnat 10.244.1.2:8080 masq"},
		{"numgen offset over a range (not modelled)", "pre: numgen inc mod 2 offset 1 1 drop", src4, "error: numgen offset"},
		{"jhash of something else", "pre: jhash ether saddr mod 2 seed 0x1 0 drop", src4, "error: jhash of"},
		{"jhash without seed (random in the kernel)", "pre: jhash ip saddr mod 2 0 drop", src4, "error: expected \"seed\""},
		{"jhash of the other family", "pre: jhash ip6 saddr mod 2 seed 0x1 0 drop", src4, "error: jhash ip6 saddr of"},
		{"jhash of a masked source hashes the prefix", fmt.Sprintf("pre: jhash ip saddr & 255.255.255.0 mod 256 seed 0x1f2e3d4c %d drop",
			JHashMod(netip.MustParseAddr("192.0.2.0"), 0x1f2e3d4c, 256)), src4, "drop"},
		{"jhash of a masked IPv6 source hashes the /120", fmt.Sprintf("pre: jhash ip6 saddr & ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00 mod 256 seed 0x1f2e3d4c %d drop",
			JHashMod(netip.MustParseAddr("fd00::1:0"), 0x1f2e3d4c, 256)), src6, "drop"},
		{"jhash with a mask of the other family", "pre: jhash ip saddr & ::ff mod 2 seed 0x1 0 drop", src4, "error: want an address of its family"},
		{"the last byte XOR a constant", "pre: @nh,120,8 ^ 0x7 14 drop", src4, "drop"},
		{"the last byte XOR a constant misses other values", "pre: @nh,120,8 ^ 0x7 9 drop", src4, "accept dnat 10.244.1.2:8080 masq"},
		{"the last byte of an IPv6 source XOR a constant", "pre: @nh,184,8 ^ 0x7 0xe2 drop", src6, "drop"},
		{"another raw payload", "pre: @nh,96,8 1 drop", src4, "error: only @nh,120,8"},
		{"the IPv4 offset on an IPv6 packet", "pre: @nh,120,8 1 drop", src6, "error: only @nh,184,8"},
		{"XOR of an address (not modelled)", "pre: ip saddr ^ 0x7 1 drop", src4, "error: ^ is modelled only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := New(Env{}, fakeWith(t, tc.rule))
			if err != nil {
				t.Fatal(err)
			}
			res, err := tr.Trace(Packet{Origin: FromOutside, Src: tc.src, IIF: "eth0", Proto: "tcp", Dst: netip.MustParseAddr("10.96.0.1"), Port: 80})
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
			slices.Sort(got)
			if strings.Join(got, "; ") != tc.want {
				t.Errorf("got %q, want %q", strings.Join(got, "; "), tc.want)
			}
		})
	}
}

// TestJHashMod pins values of the kernel's jhash for IPv4 and IPv6 sources, computed by
// JHashMod once tables' TestModesThroughRealKernel had found all 1,000 clients of each
// family where the tracer predicted, and checks that consecutive addresses spread over
// every index.
func TestJHashMod(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want uint32
	}{
		{"198.18.0.1", 592},
		{"198.18.39.16", 984},
		{"fd00:198:18::1", 805},
		{"fd00:198:18::2710", 519},
	} {
		if got := JHashMod(netip.MustParseAddr(tc.addr), 0x1f2e3d4c, 1000); got != tc.want {
			t.Errorf("JHashMod(%s) = %d, want %d", tc.addr, got, tc.want)
		}
	}
	for _, base := range []string{"198.18.0.0", "fd00:198:18::"} {
		seen := map[uint32]int{}
		a := netip.MustParseAddr(base)
		for range 1000 {
			a = a.Next()
			seen[JHashMod(a, 0x1f2e3d4c, 10)]++
		}
		for i := uint32(0); i < 10; i++ {
			if seen[i] < 60 || seen[i] > 140 {
				t.Errorf("%s: index %d got %d of 1,000 consecutive addresses; want about 100", base, i, seen[i])
			}
		}
	}
}
