package config

import (
	"slices"
	"strings"
	"testing"
)

const liveBase = `apiVersion: shardproxy.io/v1alpha1
kind: SupervisorConfig
nodeName: node-1
instances:
- name: default
  default: true
  slot: 0
- name: team-a
  proxyNames: [team-a]
  slot: 1
  tenant: {namespaces: [a]}
`

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse([]byte(yaml), "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFixedChanges: the node-wide fields a changed file changes, with defaults filled
// in (the masquerade bit's default moves with the default instance); instances and
// sharedTenants change live.
func TestFixedChanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		next string
		want []string
	}{
		{"same", liveBase, nil},
		{"instances only", liveBase + "- name: team-b\n  proxyNames: [team-b]\n  slot: 2\n  tenant: {namespaces: [b]}\n", nil},
		{"sharedTenants", strings.Replace(liveBase, "nodeName: node-1\n", "nodeName: node-1\nsharedTenants: true\n", 1), nil},
		{"the defaults written out", strings.Replace(liveBase, "nodeName: node-1\n", "nodeName: node-1\ntablePrefix: shardproxy\nhealthzBindAddress: 0.0.0.0:10256\n", 1), nil},
		{"ports and prefix", strings.Replace(liveBase, "nodeName: node-1\n", "nodeName: node-1\ntablePrefix: shardproxy-x\nhealthzBindAddress: 0.0.0.0:10257\n", 1),
			[]string{"healthzBindAddress", "tablePrefix"}},
		{"the default instance removed moves the masquerade bit's default", strings.Replace(liveBase, "- name: default\n  default: true\n  slot: 0\n", "", 1),
			[]string{"masqueradeBit"}},
		{"conntrack", liveBase + "conntrack: {min: 1}\n", []string{"conntrack"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FixedChanges(mustParse(t, liveBase), mustParse(t, tc.next)); !slices.Equal(got, tc.want) {
				t.Errorf("FixedChanges = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestWatchesOtherNodes: the all-Node watch only where it protects something: an
// instance serves user addresses and reserveOtherNodeAddresses is on.
func TestWatchesOtherNodes(t *testing.T) {
	withRanges := strings.Replace(liveBase, "tenant: {namespaces: [a]}", "tenant: {namespaces: [a], loadBalancerCIDRs: [192.0.2.0/24]}", 1)
	for _, tc := range []struct {
		name, yaml      string
		want, published bool
	}{
		{"no instance serves user addresses", liveBase, false, false},
		{"an instance serves load-balancer IPs", withRanges, true, false},
		{"an instance serves external IPs", strings.Replace(liveBase, "tenant: {namespaces: [a]}", "tenant: {namespaces: [a], externalIPCIDRs: [192.0.2.0/24]}", 1), true, false},
		{"turned off", withRanges + "reserveOtherNodeAddresses: false\n", false, false},
		{"from the published list", withRanges + "otherNodeAddresses: published\n", true, true},
		{"published, but no instance serves user addresses", liveBase + "otherNodeAddresses: published\n", false, false},
		{"published, turned off", withRanges + "otherNodeAddresses: published\nreserveOtherNodeAddresses: false\n", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.yaml)
			if got := c.WatchesOtherNodes(); got != tc.want {
				t.Errorf("WatchesOtherNodes = %v, want %v", got, tc.want)
			}
			if got := c.PublishedNodeAddresses(); got != tc.published {
				t.Errorf("PublishedNodeAddresses = %v, want %v", got, tc.published)
			}
		})
	}
}
