package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestValidateAcrossTenants: what two tenants must not share, each conflict one error
// with its field path and its exact message, and what they may.
func TestValidateAcrossTenants(t *testing.T) {
	// manyInstances is n labeled instances, team-0 .. team-<n-1>, on slots 0, 1, ...
	// modulo the 32 there are.
	manyInstances := func(n int) string {
		var b strings.Builder
		b.WriteString(header + "nodeName: node-1\ninstances:\n")
		for i := range n {
			fmt.Fprintf(&b, "- {name: team-%d, proxyNames: [team-%d], slot: %d, tenant: {namespaces: [ns-%d]}}\n", i, i, i%32, i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name string
		yaml string
		want []string // Validate's error, line by line, exactly; none means valid
	}{
		// Namespaces.
		{
			name: "sharedTenants: one namespace and overlapping ranges in two instances",
			yaml: strings.Replace(minimal, "instances:\n", "sharedTenants: true\ninstances:\n", 1) + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [web], externalIPCIDRs: [192.0.2.0/24]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [web], externalIPCIDRs: [192.0.2.128/25]}}
`,
		},
		{
			name: "two instances listing the same namespace",
			yaml: minimal + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [shop, web]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [db, web]}}
`,
			want: []string{`instances[2].tenant.namespaces[1]: "web" is already listed by instance "team-a": a namespace belongs to one tenant (its users could choose either instance, and its address ranges, by label)`},
		},
		{
			name: "a namespace in three instances names the first in each error",
			yaml: minimal + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [web]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [web]}}
- {name: team-c, proxyNames: [c], slot: 3, tenant: {namespaces: [web]}}
`,
			want: []string{
				`instances[2].tenant.namespaces[0]: "web" is already listed by instance "team-a": a namespace belongs to one tenant (its users could choose either instance, and its address ranges, by label)`,
				`instances[3].tenant.namespaces[0]: "web" is already listed by instance "team-a": a namespace belongs to one tenant (its users could choose either instance, and its address ranges, by label)`,
			},
		},
		{
			name: "a default instance that lists namespaces lists them",
			yaml: header + `nodeName: node-1
instances:
- {name: default, default: true, slot: 0, tenant: {namespaces: [kube-system, web]}}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [web]}}
`,
			want: []string{`instances[1].tenant.namespaces[0]: "web" is already listed by instance "default": a namespace belongs to one tenant (its users could choose either instance, and its address ranges, by label)`},
		},
		{
			name: "the default instance admits every namespace without listing one",
			yaml: minimal + "- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [web]}}\n",
		},
		{
			name: "a namespace twice in one instance is that instance's problem only",
			yaml: minimal + "- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [web, web]}}\n",
			want: []string{`instances[1].tenant.namespaces[1]: "web" is listed twice`},
		},
		{
			name: "an invalid namespace is not compared",
			yaml: minimal + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [Web]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [Web]}}
`,
			want: []string{
				`instances[1].tenant.namespaces[0]: "Web" is not a valid namespace name: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`,
				`instances[2].tenant.namespaces[0]: "Web" is not a valid namespace name: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`,
			},
		},

		// Address ranges.
		{
			name: "externalIPCIDRs inside another tenant's",
			yaml: header + `nodeName: node-1
instances:
- {name: default, default: true, slot: 0, tenant: {externalIPCIDRs: [203.0.113.0/24]}}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [192.0.2.0/24, 203.0.113.64/26]}}
`,
			want: []string{`instances[1].tenant.externalIPCIDRs[1]: "203.0.113.64/26" overlaps "203.0.113.0/24" of instance "default" (instances[0].tenant.externalIPCIDRs[0]): two tenants' Services could claim one address`},
		},
		{
			name: "externalIPCIDRs holding another tenant's",
			yaml: header + `nodeName: node-1
instances:
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [203.0.113.64/26]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [b], externalIPCIDRs: ["0.0.0.0/0"]}}
`,
			want: []string{`instances[1].tenant.externalIPCIDRs[0]: "0.0.0.0/0" overlaps "203.0.113.64/26" of instance "team-a" (instances[0].tenant.externalIPCIDRs[0]): two tenants' Services could claim one address`},
		},
		{
			name: "the same loadBalancerCIDRs in two tenants",
			yaml: minimal + `  tenant: {loadBalancerCIDRs: [198.51.100.0/24]}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], loadBalancerCIDRs: [198.51.100.0/24]}}
`,
			want: []string{`instances[1].tenant.loadBalancerCIDRs[0]: "198.51.100.0/24" overlaps "198.51.100.0/24" of instance "default" (instances[0].tenant.loadBalancerCIDRs[0]): two tenants' Services could claim one address`},
		},
		{
			name: "overlapping IPv6 loadBalancerCIDRs",
			yaml: minimal + `  tenant: {loadBalancerCIDRs: ["2001:db8::/32"]}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], loadBalancerCIDRs: ["2001:db8:a::/48"]}}
`,
			want: []string{`instances[1].tenant.loadBalancerCIDRs[0]: "2001:db8:a::/48" overlaps "2001:db8::/32" of instance "default" (instances[0].tenant.loadBalancerCIDRs[0]): two tenants' Services could claim one address`},
		},
		{
			name: "a range over two tenants' ranges names both",
			yaml: minimal + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [192.0.2.0/25]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [b], externalIPCIDRs: [192.0.2.128/25]}}
- {name: team-c, proxyNames: [c], slot: 3, tenant: {namespaces: [c], externalIPCIDRs: [192.0.2.0/24]}}
`,
			want: []string{
				`instances[3].tenant.externalIPCIDRs[0]: "192.0.2.0/24" overlaps "192.0.2.0/25" of instance "team-a" (instances[1].tenant.externalIPCIDRs[0]): two tenants' Services could claim one address`,
				`instances[3].tenant.externalIPCIDRs[0]: "192.0.2.0/24" overlaps "192.0.2.128/25" of instance "team-b" (instances[2].tenant.externalIPCIDRs[0]): two tenants' Services could claim one address`,
			},
		},
		{
			name: "adjacent ranges do not overlap",
			yaml: minimal + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [192.0.2.0/25], loadBalancerCIDRs: [198.51.100.0/25]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [b], externalIPCIDRs: [192.0.2.128/25], loadBalancerCIDRs: [198.51.100.128/25]}}
`,
		},
		{
			name: "every address of one family and of the other do not overlap",
			yaml: minimal + `  tenant: {externalIPCIDRs: ["0.0.0.0/0"]}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: ["::/0"]}}
`,
		},
		{
			name: "one tenant's external and load-balancer ranges may overlap",
			yaml: minimal + "  tenant: {externalIPCIDRs: [192.0.2.0/24], loadBalancerCIDRs: [192.0.2.0/25]}\n",
		},
		{
			// The two guards filter different writers (Service users and the
			// load-balancer controller); a collision between them is settled per
			// address at run time: the holder keeps it (README, "Security model").
			name: "one tenant's external range may overlap another's load-balancer range",
			yaml: minimal + `- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [192.0.2.0/24]}}
- {name: team-b, proxyNames: [b], slot: 2, tenant: {namespaces: [b], loadBalancerCIDRs: [192.0.2.0/24]}}
`,
		},
		{
			name: "an instance without ranges overlaps nothing",
			yaml: minimal + `  tenant: {externalIPCIDRs: ["0.0.0.0/0", "::/0"], loadBalancerCIDRs: ["0.0.0.0/0", "::/0"]}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a]}}
`,
		},
		{
			name: "an invalid range is not compared",
			yaml: minimal + `  tenant: {externalIPCIDRs: [10.0.0.0/8]}
- {name: team-a, proxyNames: [a], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [10.1.0.0/8, 10.2.0.0/33]}}
`,
			want: []string{
				`instances[1].tenant.externalIPCIDRs[0]: "10.1.0.0/8" has host bits set: did you mean "10.0.0.0/8"?`,
				`instances[1].tenant.externalIPCIDRs[1]: "10.2.0.0/33" is not a CIDR`,
			},
		},

		// The masquerade bit.
		{
			name: "masqueradeBit 15 is the kubelet's drop bit",
			yaml: minimal + "masqueradeBit: 15\n",
			want: []string{"masqueradeBit: 15 is the drop mark of KUBE-MARK-DROP (the kubelet's --iptables-drop-bit default): kubelets before 1.27 drop packets carrying it, and other components may still; choose another bit, such as 14"},
		},
		{
			name: "masqueradeBit 15 beside kube-proxy",
			yaml: header + "nodeName: node-1\nmasqueradeBit: 15\ninstances:\n- {name: team-a, proxyNames: [a], slot: 0, tenant: {namespaces: [a]}}\n",
			want: []string{"masqueradeBit: 15 is the drop mark of KUBE-MARK-DROP (the kubelet's --iptables-drop-bit default): kubelets before 1.27 drop packets carrying it, and other components may still; choose another bit, such as 13"},
		},
		{
			name: "masqueradeBit 14 beside kube-proxy",
			yaml: header + "nodeName: node-1\nmasqueradeBit: 14\ninstances:\n- {name: team-a, proxyNames: [a], slot: 0, tenant: {namespaces: [a]}}\n",
			want: []string{"masqueradeBit: 14 is kube-proxy's masquerade bit (--iptables-masquerade-bit default), and with no default instance kube-proxy runs beside this supervisor and serves the unlabeled Services: choose a bit of shardproxy's own that no other component on the node uses, such as 13 (the default here)"},
		},
		{
			name: "masqueradeBit 14 in place of kube-proxy",
			yaml: minimal + "masqueradeBit: 14\n",
		},
		{
			name: "masqueradeBit 13 beside kube-proxy",
			yaml: header + "nodeName: node-1\nmasqueradeBit: 13\ninstances:\n- {name: team-a, proxyNames: [a], slot: 0, tenant: {namespaces: [a]}}\n",
		},
		{
			name: "no masqueradeBit beside kube-proxy takes 13",
			yaml: header + "nodeName: node-1\ninstances:\n- {name: team-a, proxyNames: [a], slot: 0, tenant: {namespaces: [a]}}\n",
		},

		// Slots.
		{
			name: "as many instances as slots",
			yaml: manyInstances(32),
		},
		{
			name: "more instances than slots is one error, not one per shared slot",
			yaml: manyInstances(34),
			want: []string{`instances: 34 instances, more than the 32 slots of a node: each instance needs a slot of its own, a priority no other instance has on every hook (tables/README.md, "Hooks and priorities")`},
		},
		{
			name: "more instances than slots, and a slot out of range",
			yaml: manyInstances(32) + "- {name: team-32, proxyNames: [team-32], slot: 32, tenant: {namespaces: [ns-32]}}\n",
			want: []string{
				`instances: 33 instances, more than the 32 slots of a node: each instance needs a slot of its own, a priority no other instance has on every hook (tables/README.md, "Hooks and priorities")`,
				"instances[32].slot: 32 is out of range [0, 31]",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := process(tc.yaml)
			want := strings.Join(tc.want, "\n")
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != want {
				t.Errorf("errors:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
