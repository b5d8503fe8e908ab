package config

import (
	"os"
	"testing"
)

// FuzzDecode feeds arbitrary bytes through Decode, Default and Validate: none may panic,
// and a config that validates must keep the invariants the supervisor relies on.
func FuzzDecode(f *testing.F) {
	if data, err := os.ReadFile("example.yaml"); err == nil {
		f.Add(data)
	}
	for _, s := range []string{
		minimal,
		minimal + "---\n" + minimal,
		minimal + "  syncPeriod: 5\n",
		minimal + "  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.0.0.0/16, 'fd00::/48']}\n",
		minimal + "  nodePortAddresses: [primary, 10.0.0.0/33]\n",
		header + "nodeName: n\ninstances:\n- {name: a, default: true, slot: 40}\n- {name: a, default: true, slot: 40}\n",
		header + "a: &x [*x]\n",
		header + "nodeName: n\nnodeName: m\ninstances:\n- &i {name: a, default: true, slot: 0}\n- <<: *i\n  name: b\n",
		minimal + "- {name: b, proxyNames: [b], slot: 1, tenant: {namespaces: [a], externalIPCIDRs: [10.0.0.0/8]}}\n" +
			"- {name: c, proxyNames: [c], slot: 2, tenant: {namespaces: [a], externalIPCIDRs: [10.1.0.0/16]}}\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data, "fuzz.yaml")
		if err != nil {
			return
		}
		_ = c.Validate() // before Default, with nil pointers
		c.DefaultWith(fixedEnv(nil), fixedHostname("host-1", nil))
		if err := c.Validate(); err != nil {
			return
		}
		if *c.MasqueradeBit == KubeletDropBit || (*c.MasqueradeBit == KubeProxyMasqueradeBit && !c.hasDefaultInstance()) {
			t.Fatalf("valid config with masqueradeBit %d", *c.MasqueradeBit)
		}
		names := map[string]bool{}
		slots := map[int]bool{}
		namespaces := map[string]string{}
		defaults := 0
		for i := range c.Instances {
			in := &c.Instances[i]
			if names[in.Name] || len(in.TableName(c.TablePrefix)) > MaxTableNameLength {
				t.Fatalf("valid config with a duplicate or overlong name %q", in.Name)
			}
			names[in.Name] = true
			if in.Slot == nil || *in.Slot < 0 || *in.Slot > 31 || slots[*in.Slot] {
				t.Fatalf("valid config with a bad slot in instance %q", in.Name)
			}
			slots[*in.Slot] = true
			for _, ns := range in.Tenant.Namespaces {
				if other, taken := namespaces[ns]; taken && other != in.Name {
					t.Fatalf("valid config with namespace %q in instances %q and %q", ns, other, in.Name)
				}
				namespaces[ns] = in.Name
			}
			if in.Default {
				defaults++
			}
			if in.SyncPeriod.Duration <= 0 || in.FullSyncPeriod.Duration < in.SyncPeriod.Duration {
				t.Fatalf("valid config with bad periods in instance %q", in.Name)
			}
		}
		if len(c.Instances) == 0 || defaults > 1 {
			t.Fatalf("valid config with %d instances, %d default", len(c.Instances), defaults)
		}
	})
}
