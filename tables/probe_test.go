package tables

import (
	"net/netip"
	"regexp"
	"testing"
)

// ruleShape replaces what varies between configurations of one rule shape (marks,
// interface names, pod CIDRs) with placeholders; an interface name prefix stays apart
// from a plain name, as nft compiles it to another expression.
func ruleShape(rule string) string {
	for _, r := range []struct{ re, with string }{
		{`0x[0-9a-f]{8}`, "MARK"},
		{`"[^"*]*\*"`, `"PREFIX*"`},
		{`"[^"*]*"`, `"NAME"`},
		{`saddr (!= )?\{ [^}]* \}`, "saddr ${1}{ CIDRS }"},
	} {
		rule = regexp.MustCompile(r.re).ReplaceAllString(rule, r.with)
	}
	return rule
}

// TestProbeCoversEveryRuleShape: the host probe asks the kernel to accept every rule
// shape the compiler can emit, whatever the detect-local mode, masqueradeAll and mark.
func TestProbeCoversEveryRuleShape(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		probed := map[string]bool{}
		for _, pc := range probeConfigs(fam) {
			for _, r := range newCompiler(&pc.cfg).skeleton(Priorities{}).Rules {
				probed[r.Chain+": "+ruleShape(r.Rule)] = true
			}
		}
		cidrs := []netip.Prefix{podCIDR4, podCIDR6}
		for _, local := range []LocalTraffic{
			{},
			{Mode: LocalClusterCIDR, CIDRs: cidrs},
			{Mode: LocalNodeCIDR, CIDRs: cidrs},
			{Mode: LocalBridgeInterface, Interface: "br0"},
			{Mode: LocalInterfaceNamePrefix, Interface: "cali"},
		} {
			for _, masqAll := range []bool{false, true} {
				for _, bit := range []int{0, 14, 31} {
					cfg := testConfig(fam)
					cfg.Local, cfg.MasqueradeAll, cfg.MasqueradeBit = local, masqAll, bit
					for _, r := range newCompiler(&cfg).skeleton(Priorities{}).Rules {
						if shape := r.Chain + ": " + ruleShape(r.Rule); !probed[shape] {
							t.Errorf("%s, local %+v, masqueradeAll %v, bit %d: the probe never checks %q",
								fam, local, masqAll, bit, shape)
						}
					}
				}
			}
		}
	}
}
