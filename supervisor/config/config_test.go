package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"gopkg.in/yaml.v3"
)

const header = "apiVersion: shardproxy.io/v1alpha1\nkind: SupervisorConfig\n"

// minimal is the smallest valid file, used as the base of most cases.
const minimal = header + `nodeName: node-1
instances:
- name: default
  default: true
  slot: 0
`

func fixedEnv(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func fixedHostname(name string, err error) func() (string, error) {
	return func() (string, error) { return name, err }
}

// process runs what Load does on data, with a fixed environment.
func process(data string) (*Config, error) {
	c, err := Decode([]byte(data), "test.yaml")
	if err != nil {
		return nil, err
	}
	c.DefaultWith(fixedEnv(nil), fixedHostname("host-1", nil))
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func TestDecodeDefaultValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		yaml    string
		wantErr []string // every one must appear; none means the file is valid
	}{
		{name: "minimal file is valid", yaml: minimal},
		{name: "trailing empty document is fine", yaml: minimal + "---\n"},
		{
			name:    "unknown top-level field names its line",
			yaml:    header + "nodeName: node-1\nbogus: 1\n",
			wantErr: []string{"test.yaml: line 4: bogus: unknown field"},
		},
		{
			name: "unknown instance field names its line",
			yaml: header + `instances:
- name: a
  default: true
  slot: 0
  sloth: 1
`,
			wantErr: []string{`test.yaml: line 7: instances[0].sloth: unknown field; did you mean "slot"?`},
		},
		{
			name: "unknown fields and a wrong apiVersion are reported together",
			yaml: "apiVersion: v1\nkind: SupervisorConfig\nfoo: 1\nconntrack:\n  bar: 2\n",
			wantErr: []string{
				"test.yaml: line 3: foo: unknown field",
				"test.yaml: line 5: conntrack.bar: unknown field",
				`test.yaml: apiVersion: "v1" is not supported, want "shardproxy.io/v1alpha1"`,
			},
		},
		{
			name:    "wrong apiVersion",
			yaml:    "apiVersion: shardproxy.io/v1\nkind: SupervisorConfig\n",
			wantErr: []string{`apiVersion: "shardproxy.io/v1" is not supported`},
		},
		{
			name:    "missing kind",
			yaml:    "apiVersion: shardproxy.io/v1alpha1\n",
			wantErr: []string{`kind: "" is not supported, want "SupervisorConfig"`},
		},
		{
			name:    "two documents",
			yaml:    minimal + "---\n" + minimal,
			wantErr: []string{"test.yaml: line 8: a second YAML document"},
		},
		{name: "empty file", yaml: "# nothing\n", wantErr: []string{"test.yaml: empty file"}},
		{
			name: "clientConnection problems are all listed",
			yaml: minimal + "clientConnection:\n  qps: -1\n  burst: -2\n  contentType: application/yaml\n",
			wantErr: []string{"clientConnection.qps: -1 is negative", "clientConnection.burst: -2 is negative",
				`clientConnection.contentType: "application/yaml" is not application/vnd.kubernetes.protobuf or application/json`},
		},
		{
			name:    "reservedCIDRs problems are all listed with their index",
			yaml:    minimal + "reservedCIDRs: [192.168.0.0/16, bogus, 10.0.0.1/8, 192.168.0.0/16]\n",
			wantErr: []string{`reservedCIDRs[1]: "bogus" is not a CIDR`, `reservedCIDRs[2]: "10.0.0.1/8" has host bits set`, `reservedCIDRs[3]: "192.168.0.0/16" is listed twice`},
		},
		{name: "reservedCIDRs of both families", yaml: minimal + "reservedCIDRs: [192.168.0.0/16, fd00::/64]\n"},
		{name: "otherNodeAddresses watch", yaml: minimal + "otherNodeAddresses: watch\n"},
		{name: "otherNodeAddresses published", yaml: minimal + "otherNodeAddresses: published\n"},
		{
			name:    "otherNodeAddresses of another value",
			yaml:    minimal + "otherNodeAddresses: nodes\n",
			wantErr: []string{`otherNodeAddresses: "nodes" is not one of "watch", "published"`},
		},
		{
			name:    "otherNodeAddresses published needs the status namespace",
			yaml:    minimal + "otherNodeAddresses: published\nstatusNamespace: \"-\"\n",
			wantErr: []string{`otherNodeAddresses: "published" needs statusNamespace`},
		},
		{
			name:    "clientConnection burst below qps",
			yaml:    minimal + "clientConnection:\n  qps: 20\n  burst: 5\n",
			wantErr: []string{"clientConnection.burst: 5 is below qps 20"},
		},
		{name: "syntax error", yaml: header + "instances: [\n", wantErr: []string{"test.yaml: line"}},
		{
			name:    "duplicate key",
			yaml:    minimal + "nodeName: node-2\n",
			wantErr: []string{"test.yaml: line 8: nodeName: duplicate key, on lines 3 and 8: keep one"},
		},
		{
			name:    "wrong type",
			yaml:    header + "masqueradeBit: fourteen\n",
			wantErr: []string{`test.yaml: line 3: masqueradeBit: want an integer, not "fourteen"`},
		},
		{
			name:    "top level is a list",
			yaml:    "- a\n",
			wantErr: []string{"test.yaml: line 1: want a mapping (a SupervisorConfig), not a list"},
		},

		// Durations.
		{
			name:    "duration without unit",
			yaml:    minimal + "  syncPeriod: 5\n",
			wantErr: []string{`test.yaml: line 8: instances[0].syncPeriod: duration 5 has no unit: write it as e.g. "5s"`},
		},
		{
			name:    "float duration without unit",
			yaml:    minimal + "  syncPeriod: 1.5\n",
			wantErr: []string{"line 8: instances[0].syncPeriod: duration 1.5 has no unit"},
		},
		{
			name:    "quoted number is not a duration",
			yaml:    minimal + "  syncPeriod: \"5\"\n",
			wantErr: []string{`line 8: instances[0].syncPeriod: "5" is not a duration`},
		},
		{
			name:    "garbage duration",
			yaml:    minimal + "  fullSyncPeriod: soon\n",
			wantErr: []string{`line 8: instances[0].fullSyncPeriod: "soon" is not a duration`},
		},
		{
			name:    "duration as a list",
			yaml:    minimal + "  minSyncPeriod: [1s]\n",
			wantErr: []string{`line 8: instances[0].minSyncPeriod: want a duration such as "30s", not a list`},
		},
		{
			name:    "several bad durations reported together",
			yaml:    header + "conntrack:\n  udpTimeout: 3\n  tcpCloseWaitTimeout: x\n",
			wantErr: []string{"line 4: conntrack.udpTimeout: duration 3 has no unit", `line 5: conntrack.tcpCloseWaitTimeout: "x" is not a duration`},
		},
		{
			name:    "negative minSyncPeriod",
			yaml:    minimal + "  minSyncPeriod: -1s\n",
			wantErr: []string{"instances[0].minSyncPeriod: must not be negative"},
		},
		{name: "zero minSyncPeriod is allowed", yaml: minimal + "  minSyncPeriod: 0s\n"},
		{
			name:    "negative syncPeriod",
			yaml:    minimal + "  syncPeriod: -1s\n",
			wantErr: []string{"instances[0].syncPeriod: must be positive"},
		},
		{
			name:    "syncPeriod shorter than minSyncPeriod",
			yaml:    minimal + "  minSyncPeriod: 10s\n  syncPeriod: 5s\n",
			wantErr: []string{"instances[0].syncPeriod: 5s is shorter than minSyncPeriod 10s"},
		},
		{
			name:    "fullSyncPeriod shorter than syncPeriod",
			yaml:    minimal + "  fullSyncPeriod: 10s\n",
			wantErr: []string{"instances[0].fullSyncPeriod: 10s is shorter than syncPeriod 30s"},
		},
		{
			name:    "maxServiceElements below -1",
			yaml:    minimal + "  maxServiceElements: -5\n",
			wantErr: []string{"instances[0].maxServiceElements: -5 is not a limit"},
		},
		{
			name:    "maxInstanceCost below -1",
			yaml:    minimal + "  maxInstanceCost: -2\n",
			wantErr: []string{"instances[0].maxInstanceCost: -2 is not a limit"},
		},
		{
			name: "maxInstanceCost: a limit, the default, none",
			yaml: minimal + "  maxInstanceCost: 100000\n- name: b\n  proxyNames: [b]\n  slot: 1\n  maxInstanceCost: -1\n  tenant:\n    namespaces: [b]\n",
		},
		{
			name: "maxServiceElements: a limit, the default, none",
			yaml: minimal + "  maxServiceElements: 5000\n- name: b\n  proxyNames: [b]\n  slot: 1\n  maxServiceElements: -1\n  tenant:\n    namespaces: [b]\n",
		},
		{
			name:    "negative fullSyncPeriod",
			yaml:    minimal + "  fullSyncPeriod: -1h\n",
			wantErr: []string{"instances[0].fullSyncPeriod: must be positive"},
		},
		{
			name: "negative conntrack values",
			yaml: header + "nodeName: n\nconntrack:\n  maxPerCore: -1\n  min: -2\n  tcpEstablishedTimeout: -1s\n  udpStreamTimeout: -1s\n",
			wantErr: []string{
				"conntrack.maxPerCore: must not be negative",
				"conntrack.min: must not be negative",
				"conntrack.tcpEstablishedTimeout: must not be negative",
				"conntrack.udpStreamTimeout: must not be negative",
			},
		},

		// Node-wide fields.
		{
			name:    "invalid node name",
			yaml:    strings.Replace(minimal, "node-1", "Node_1", 1),
			wantErr: []string{`nodeName: "Node_1" is not a valid node name`},
		},
		{
			name:    "healthz address without port",
			yaml:    minimal + "healthzBindAddress: foo\n",
			wantErr: []string{`healthzBindAddress: "foo" is not host:port`},
		},
		{
			name:    "metrics port out of range",
			yaml:    minimal + "metricsBindAddress: 127.0.0.1:70000\n",
			wantErr: []string{`metricsBindAddress: "127.0.0.1:70000": port "70000" is out of range [1, 65535]`},
		},
		{
			name:    "metrics port zero",
			yaml:    minimal + "metricsBindAddress: \"127.0.0.1:0\"\n",
			wantErr: []string{`metricsBindAddress: "127.0.0.1:0": port "0" is out of range`},
		},
		{
			name:    "host name instead of IP",
			yaml:    minimal + "healthzBindAddress: localhost:10256\n",
			wantErr: []string{`healthzBindAddress: "localhost:10256": host "localhost" is not an IP address`},
		},
		{name: "IPv6 and empty hosts are fine", yaml: minimal + "healthzBindAddress: \":10256\"\nmetricsBindAddress: \"[::1]:10249\"\n"},
		{
			name:    "metrics and healthz on the same port",
			yaml:    minimal + "metricsBindAddress: 127.0.0.1:10256\n",
			wantErr: []string{`metricsBindAddress: "127.0.0.1:10256" overlaps healthzBindAddress "0.0.0.0:10256"`},
		},
		{
			name:    "masqueradeBit too large",
			yaml:    minimal + "masqueradeBit: 32\n",
			wantErr: []string{"masqueradeBit: 32 is out of range [0, 31]"},
		},
		{
			name:    "masqueradeBit negative",
			yaml:    minimal + "masqueradeBit: -1\n",
			wantErr: []string{"masqueradeBit: -1 is out of range [0, 31]"},
		},
		{
			name:    "invalid table prefix",
			yaml:    minimal + "tablePrefix: Shard_Proxy\n",
			wantErr: []string{`tablePrefix: "Shard_Proxy" is not valid`},
		},
		// The supervisor deletes "<tablePrefix>-<name>" tables no instance has: a prefix
		// must not reach another component's tables.
		{
			name:    "table prefix of kube-proxy",
			yaml:    minimal + "tablePrefix: kube\n",
			wantErr: []string{`tablePrefix: "kube" does not start with "shardproxy"`},
		},
		{
			name:    "table prefix of a CNI plugin",
			yaml:    minimal + "tablePrefix: cilium\n",
			wantErr: []string{`tablePrefix: "cilium" does not start with "shardproxy"`},
		},
		{
			name:    "table prefix that merely contains shardproxy",
			yaml:    minimal + "tablePrefix: calico-shardproxy\n",
			wantErr: []string{`tablePrefix: "calico-shardproxy" does not start with "shardproxy"`},
		},
		{name: "table prefix of a second supervisor", yaml: minimal + "tablePrefix: shardproxy-blue\n"},
		{name: "table prefix with a suffix", yaml: minimal + "tablePrefix: shardproxy2\n"},
		{
			name:    "invalid status namespace",
			yaml:    minimal + "statusNamespace: Kube_System\n",
			wantErr: []string{`statusNamespace: "Kube_System" is not a namespace name`},
		},

		// Instances.
		{
			name:    "no instances",
			yaml:    header + "nodeName: n\n",
			wantErr: []string{"instances: at least one instance is required"},
		},
		{
			name:    "instance without name or slot",
			yaml:    header + "nodeName: n\ninstances:\n- default: true\n",
			wantErr: []string{"instances[0].name: required", "instances[0].slot: required: a number in [0, 31]"},
		},
		{
			name:    "invalid instance name",
			yaml:    header + "nodeName: n\ninstances:\n- {name: Team_A, default: true, slot: 0}\n",
			wantErr: []string{`instances[0].name: "Team_A" is not valid`},
		},
		{
			name: "table name too long",
			yaml: header + "nodeName: n\ninstances:\n- {name: " + strings.Repeat("a", 53) + ", default: true, slot: 0}\n",
			wantErr: []string{
				`instances[0].name: table name "shardproxy-` + strings.Repeat("a", 53) + `" is 64 characters, more than 63`,
			},
		},
		{
			name: "table name at the limit",
			yaml: header + "nodeName: n\ninstances:\n- {name: " + strings.Repeat("a", 52) + ", default: true, slot: 0}\n",
		},
		{
			name: "duplicate names",
			yaml: header + `nodeName: n
instances:
- {name: team-a, proxyNames: [a], slot: 0}
- {name: team-a, proxyNames: [b], slot: 1}
`,
			wantErr: []string{`instances[1].name: "team-a" is used by instances[0]`},
		},
		{
			name: "duplicate slots",
			yaml: header + `nodeName: n
instances:
- {name: team-a, proxyNames: [a], slot: 3}
- {name: team-b, proxyNames: [b], slot: 3}
`,
			wantErr: []string{`instances[1].slot: 3 is already used by "team-a"`},
		},
		{
			name: "slots out of range",
			yaml: header + `nodeName: n
instances:
- {name: team-a, proxyNames: [a], slot: 40}
- {name: team-b, proxyNames: [b], slot: -1}
- {name: team-c, proxyNames: [c], slot: 31}
`,
			wantErr: []string{
				"instances[0].slot: 40 is out of range [0, 31]",
				"instances[1].slot: -1 is out of range [0, 31]",
			},
		},
		{
			name: "proxy name served twice",
			yaml: header + `nodeName: n
instances:
- {name: team-a, proxyNames: [team-a], slot: 0}
- {name: team-b, proxyNames: [team-b], slot: 1}
- {name: team-c, proxyNames: [team-b], slot: 2}
`,
			wantErr: []string{`instances[2].proxyNames[0]: "team-b" is already served by instance "team-b"`},
		},
		{
			name:    "proxy name listed twice in one instance",
			yaml:    header + "nodeName: n\ninstances:\n- {name: a, proxyNames: [x, y, x], slot: 0}\n",
			wantErr: []string{`instances[0].proxyNames[2]: "x" is listed twice`},
		},
		{
			name:    "invalid proxy names",
			yaml:    header + "nodeName: n\ninstances:\n- {name: a, proxyNames: [\"\", \"not a label\"], slot: 0}\n",
			wantErr: []string{"instances[0].proxyNames[0]: must not be empty", `instances[0].proxyNames[1]: "not a label" is not a valid label value`},
		},
		{
			name: "two default instances",
			yaml: header + `nodeName: n
instances:
- {name: default, default: true, slot: 0}
- {name: other, default: true, slot: 1}
`,
			wantErr: []string{`instances: two default instances ("default" and "other")`},
		},
		{
			name: "three default instances",
			yaml: header + `nodeName: n
instances:
- {name: a, default: true, slot: 0}
- {name: b, default: true, slot: 1}
- {name: c, default: true, slot: 2}
`,
			wantErr: []string{`instances: three default instances ("a", "b" and "c")`},
		},
		{
			name:    "instance serving nothing",
			yaml:    header + "nodeName: n\ninstances:\n- {name: idle, slot: 0}\n",
			wantErr: []string{"instances[0]: serves nothing: set default: true or proxyNames"},
		},
		{name: "default instance with proxy names", yaml: header + "nodeName: n\ninstances:\n- {name: a, default: true, proxyNames: [a], slot: 0}\n"},
		{
			name: "instance that is not the default without namespaces",
			yaml: minimal + "- {name: team-a, proxyNames: [team-a], slot: 1}\n- {name: team-b, proxyNames: [team-b], slot: 2, tenant: {namespaces: []}}\n",
			wantErr: []string{
				"instances[1].tenant.namespaces: required for an instance that is not the default",
				"instances[2].tenant.namespaces: required for an instance that is not the default",
			},
		},
		{
			name: "instance that is not the default with namespaces",
			yaml: minimal + "- {name: team-a, proxyNames: [team-a], slot: 1, tenant: {namespaces: [team-a]}}\n",
		},
		{
			name: "default instance with namespaces",
			yaml: minimal + "  tenant: {namespaces: [shop]}\n",
		},

		// Tenant.
		{
			name: "bad tenant",
			yaml: minimal + `  tenant:
    namespaces: [team-a, Team-B, team-a]
    externalIPCIDRs: [192.0.2.0/24, 192.0.2.1, 192.0.2.0/24]
    loadBalancerCIDRs: [198.51.100.0/24, 198.51.100.7/24, "", 198.51.100.0/24, "::ffff:198.51.100.0/120"]
`,
			wantErr: []string{
				`instances[0].tenant.namespaces[1]: "Team-B" is not a valid namespace name`,
				`instances[0].tenant.namespaces[2]: "team-a" is listed twice`,
				`instances[0].tenant.externalIPCIDRs[1]: "192.0.2.1" is not a CIDR`,
				`instances[0].tenant.externalIPCIDRs[2]: "192.0.2.0/24" is listed twice`,
				`instances[0].tenant.loadBalancerCIDRs[1]: "198.51.100.7/24" has host bits set: did you mean "198.51.100.0/24"?`,
				`instances[0].tenant.loadBalancerCIDRs[2]: must not be empty`,
				`instances[0].tenant.loadBalancerCIDRs[3]: "198.51.100.0/24" is listed twice`,
				`instances[0].tenant.loadBalancerCIDRs[4]: "::ffff:198.51.100.0/120" is an IPv4-mapped IPv6 CIDR`,
			},
		},
		{
			name: "tenant CIDRs of both families",
			yaml: minimal + "  tenant: {externalIPCIDRs: [192.0.2.0/24, '2001:db8:a::/48'], loadBalancerCIDRs: [198.51.100.0/24, '2001:db8:b::/48']}\n",
		},

		// nodePortAddresses.
		{
			name: "bad node port addresses",
			yaml: minimal + "  nodePortAddresses: [10.0.0.0/8, 10.0.0.0/33, 10.1.2.3/16, 10.0.0.0/8, '::ffff:10.0.0.0/104']\n",
			wantErr: []string{
				`instances[0].nodePortAddresses[1]: "10.0.0.0/33" is not a CIDR`,
				`instances[0].nodePortAddresses[2]: "10.1.2.3/16" has host bits set: did you mean "10.1.0.0/16"?`,
				`instances[0].nodePortAddresses[3]: "10.0.0.0/8" is listed twice`,
				`instances[0].nodePortAddresses[4]: "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 CIDR`,
			},
		},
		{
			name:    "primary mixed with CIDRs",
			yaml:    minimal + "  nodePortAddresses: [10.0.0.0/8, primary]\n",
			wantErr: []string{`instances[0].nodePortAddresses[1]: "primary" must be the only entry`},
		},
		{
			name:    "empty CIDRs",
			yaml:    minimal + "  nodePortAddresses: [\"\"]\n  tenant: {externalIPCIDRs: [\"\"]}\n",
			wantErr: []string{"instances[0].nodePortAddresses[0]: must not be empty", "instances[0].tenant.externalIPCIDRs[0]: must not be empty"},
		},
		{name: "dual-stack node port CIDRs", yaml: minimal + "  nodePortAddresses: [10.0.0.0/8, 'fd00::/64']\n"},

		// detectLocal.
		{
			name:    "unknown detectLocal mode",
			yaml:    minimal + "  detectLocal: {mode: PodCIDR}\n",
			wantErr: []string{`instances[0].detectLocal.mode: "PodCIDR" is not one of "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix"`},
		},
		{
			name:    "ClusterCIDR without CIDRs",
			yaml:    minimal + "  detectLocal: {mode: ClusterCIDR}\n",
			wantErr: []string{"instances[0].detectLocal.clusterCIDRs: required with mode ClusterCIDR"},
		},
		{
			name: "two cluster CIDRs of one family",
			yaml: minimal + "  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.0.0.0/16, 'fd00::/48', 10.1.0.0/16, 10.2.0.0/33]}\n",
			wantErr: []string{
				`instances[0].detectLocal.clusterCIDRs[2]: "10.1.0.0/16" is a second IPv4 CIDR: at most one per family`,
				`instances[0].detectLocal.clusterCIDRs[3]: "10.2.0.0/33" is not a CIDR`,
			},
		},
		{name: "dual-stack cluster CIDRs", yaml: minimal + "  detectLocal: {mode: ClusterCIDR, clusterCIDRs: [10.0.0.0/16, 'fd00::/48']}\n"},
		{
			name:    "BridgeInterface without a bridge",
			yaml:    minimal + "  detectLocal: {mode: BridgeInterface}\n",
			wantErr: []string{"instances[0].detectLocal.bridgeInterface: required with mode BridgeInterface"},
		},
		{
			name:    "bridge name too long",
			yaml:    minimal + "  detectLocal: {mode: BridgeInterface, bridgeInterface: a-very-long-bridge0}\n",
			wantErr: []string{`instances[0].detectLocal.bridgeInterface: "a-very-long-bridge0" is longer than 15 characters`},
		},
		{
			name:    "bridge name with a slash",
			yaml:    minimal + "  detectLocal: {mode: BridgeInterface, bridgeInterface: br/0}\n",
			wantErr: []string{`instances[0].detectLocal.bridgeInterface: "br/0" is not a valid interface name: '/' is not allowed`},
		},
		{
			name:    "InterfaceNamePrefix without a prefix",
			yaml:    minimal + "  detectLocal: {mode: InterfaceNamePrefix}\n",
			wantErr: []string{"instances[0].detectLocal.interfaceNamePrefix: required with mode InterfaceNamePrefix"},
		},
		{name: "InterfaceNamePrefix", yaml: minimal + "  detectLocal: {mode: InterfaceNamePrefix, interfaceNamePrefix: veth}\n"},
		{
			name: "fields of another mode",
			yaml: minimal + "  detectLocal: {mode: NodeCIDR, clusterCIDRs: [10.0.0.0/8], bridgeInterface: cni0, interfaceNamePrefix: veth}\n",
			wantErr: []string{
				`instances[0].detectLocal.clusterCIDRs: only used with mode ClusterCIDR, but mode is "NodeCIDR"`,
				`instances[0].detectLocal.bridgeInterface: only used with mode BridgeInterface, but mode is "NodeCIDR"`,
				`instances[0].detectLocal.interfaceNamePrefix: only used with mode InterfaceNamePrefix, but mode is "NodeCIDR"`,
			},
		},
		{
			name:    "fields without a mode",
			yaml:    minimal + "  detectLocal: {bridgeInterface: cni0}\n",
			wantErr: []string{`instances[0].detectLocal.bridgeInterface: only used with mode BridgeInterface, but mode is ""`},
		},

		{
			name: "every problem in a file is reported at once",
			yaml: header + `nodeName: n
healthzBindAddress: foo
masqueradeBit: 40
instances:
- name: default
  default: true
  slot: 3
  nodePortAddresses: [10.0.0.0/33]
- name: other
  default: true
  slot: 3
- name: team-b
  proxyNames: [team-b]
  slot: 40
  minSyncPeriod: -1s
- name: team-c
  proxyNames: [team-b]
  slot: 4
- name: team-b
  slot: 5
  detectLocal: {mode: Magic}
`,
			wantErr: []string{
				`healthzBindAddress: "foo" is not host:port`,
				"masqueradeBit: 40 is out of range [0, 31]",
				`instances[0].nodePortAddresses[0]: "10.0.0.0/33" is not a CIDR`,
				`instances[1].slot: 3 is already used by "default"`,
				`instances[2].slot: 40 is out of range [0, 31]`,
				"instances[2].minSyncPeriod: must not be negative",
				`instances[3].proxyNames[0]: "team-b" is already served by instance "team-b"`,
				`instances[4].name: "team-b" is used by instances[2]`,
				"instances[4]: serves nothing: set default: true or proxyNames",
				`instances[4].detectLocal.mode: "Magic" is not one of`,
				`instances: two default instances ("default" and "other")`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := process(tc.yaml)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error:\n%v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not contain %q; it is:\n%v", want, err)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want func(c *Config) // edits the fully defaulted minimal config into the expected one
	}{
		{
			name: "minimal file gets every default",
			yaml: minimal,
			want: func(*Config) {},
		},
		{
			name: "explicit zeros stay zero",
			yaml: minimal + `  minSyncPeriod: 0s
masqueradeBit: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`,
			want: func(c *Config) {
				c.MasqueradeBit = ptr(0)
				c.Conntrack.MaxPerCore = ptr[int32](0)
				c.Conntrack.Min = ptr[int32](0)
				c.Conntrack.TCPEstablishedTimeout = &Duration{}
				c.Conntrack.TCPCloseWaitTimeout = &Duration{}
				c.Instances[0].MinSyncPeriod = &Duration{}
			},
		},
		{
			name: "explicit values are kept",
			yaml: minimal + `  nodePortAddresses: [10.0.0.0/8]
  syncPeriod: 2m
  fullSyncPeriod: 10m
masqueradeBit: 3
tablePrefix: shardproxy-blue
healthzBindAddress: 127.0.0.1:1
metricsBindAddress: 127.0.0.1:2
conntrack:
  udpTimeout: 30s
`,
			want: func(c *Config) {
				c.Instances[0].NodePortAddresses = []string{"10.0.0.0/8"}
				c.Instances[0].SyncPeriod = Duration{2 * time.Minute}
				c.Instances[0].FullSyncPeriod = Duration{10 * time.Minute}
				c.MasqueradeBit = ptr(3)
				c.TablePrefix = "shardproxy-blue"
				c.HealthzBindAddress = "127.0.0.1:1"
				c.MetricsBindAddress = "127.0.0.1:2"
				c.Conntrack.UDPTimeout = &Duration{30 * time.Second}
			},
		},
		{
			name: "clientConnection as written; JSON accepts JSON only",
			yaml: minimal + "clientConnection:\n  qps: 50\n  burst: 100\n  contentType: application/json\n",
			want: func(c *Config) {
				c.ClientConnection = ClientConnection{QPS: 50, Burst: 100, ContentType: "application/json", AcceptContentTypes: "application/json"}
			},
		},
		{
			name: "an explicit reserveOtherNodeAddresses false stays",
			yaml: "reserveOtherNodeAddresses: false\n" + minimal,
			want: func(c *Config) { c.ReserveOtherNodeAddresses = ptr(false) },
		},
		{
			name: "an explicit serviceCIDRDrop false stays",
			yaml: "serviceCIDRDrop: false\n" + minimal,
			want: func(c *Config) { c.ServiceCIDRDrop = ptr(false) },
		},
		{
			name: "beside kube-proxy (no default instance) the masquerade bit is 13, not kube-proxy's 14",
			yaml: strings.Replace(minimal, "  default: true\n", "  proxyNames: [a]\n  tenant: {namespaces: [a]}\n", 1),
			want: func(c *Config) {
				c.MasqueradeBit = ptr(13)
				c.Instances[0].Default = false
				c.Instances[0].ProxyNames = []string{"a"}
				c.Instances[0].Tenant.Namespaces = []string{"a"}
			},
		},
		{
			name: "fullSyncPeriod follows a long syncPeriod",
			yaml: minimal + "  syncPeriod: 2h\n",
			want: func(c *Config) {
				c.Instances[0].SyncPeriod = Duration{2 * time.Hour}
				c.Instances[0].FullSyncPeriod = Duration{2 * time.Hour}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := process(tc.yaml)
			if err != nil {
				t.Fatal(err)
			}
			want := &Config{
				APIVersion: APIVersion,
				Kind:       Kind,
				NodeName:   "node-1",
				ClientConnection: ClientConnection{QPS: 5, Burst: 10, ContentType: "application/vnd.kubernetes.protobuf",
					AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json"},
				HealthzBindAddress:        "0.0.0.0:10256",
				MetricsBindAddress:        "127.0.0.1:10249",
				MasqueradeBit:             ptr(14),
				TablePrefix:               "shardproxy",
				StatusNamespace:           "shardproxy-system",
				ServiceCIDRDrop:           ptr(true),
				ReserveOtherNodeAddresses: ptr(true),
				OtherNodeAddresses:        OtherNodeAddressesWatch,
				Conntrack: Conntrack{
					MaxPerCore:            ptr[int32](32768),
					Min:                   ptr[int32](131072),
					TCPEstablishedTimeout: &Duration{24 * time.Hour},
					TCPCloseWaitTimeout:   &Duration{time.Hour},
					UDPTimeout:            &Duration{},
					UDPStreamTimeout:      &Duration{},
				},
				Instances: []Instance{{
					Name:              "default",
					Default:           true,
					Slot:              ptr(0),
					NodePortAddresses: []string{"primary"},
					MinSyncPeriod:     &Duration{time.Second},
					SyncPeriod:        Duration{30 * time.Second},
					FullSyncPeriod:    Duration{time.Hour},
				}},
			}
			tc.want(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("defaulted config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDefaultNodeName(t *testing.T) {
	for _, tc := range []struct {
		name     string
		explicit string
		env      map[string]string
		hostname string
		hostErr  error
		want     string
	}{
		{name: "explicit wins", explicit: "node-x", env: map[string]string{"NODE_NAME": "node-env"}, hostname: "host", want: "node-x"},
		{name: "NODE_NAME before hostname", env: map[string]string{"NODE_NAME": " Node-Env \n"}, hostname: "host", want: "node-env"},
		{name: "hostname lower-cased", hostname: "Worker-7.Example.COM", want: "worker-7.example.com"},
		{name: "no source leaves it empty", hostErr: errors.New("no hostname"), want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{NodeName: tc.explicit}
			c.DefaultWith(fixedEnv(tc.env), fixedHostname(tc.hostname, tc.hostErr))
			if c.NodeName != tc.want {
				t.Errorf("NodeName = %q, want %q", c.NodeName, tc.want)
			}
		})
	}

	c, err := Decode([]byte(strings.Replace(minimal, "nodeName: node-1\n", "", 1)), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c.DefaultWith(fixedEnv(nil), fixedHostname("", errors.New("no hostname")))
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "nodeName: required") {
		t.Errorf("Validate() = %v, want nodeName: required", err)
	}
}

func TestLoadExample(t *testing.T) {
	t.Setenv("NODE_NAME", "node-1")
	c, err := Load("example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "node-1" {
		t.Errorf("NodeName = %q, want node-1 from NODE_NAME", c.NodeName)
	}
	type summary struct {
		Table      string
		Default    bool
		ProxyNames []string
		Slot       int
		Mode       string
	}
	var got []summary
	for i := range c.Instances {
		in := &c.Instances[i]
		got = append(got, summary{in.TableName(c.TablePrefix), in.Default, in.ProxyNames, *in.Slot, in.DetectLocal.Mode})
	}
	want := []summary{
		{"shardproxy-default", true, nil, 0, "ClusterCIDR"},
		{"shardproxy-team-a", false, []string{"team-a", "team-a-canary"}, 1, "NodeCIDR"},
		{"shardproxy-team-b", false, []string{"team-b"}, 2, "BridgeInterface"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
	if got := c.Instances[2].FullSyncPeriod.Duration; got != time.Hour {
		t.Errorf("team-b fullSyncPeriod = %v, want the 1h default", got)
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "supervisor.yaml")
	data := header + "nodeName: n\nmasqueradeBit: 99\ninstances:\n- {name: a, proxyNames: [a], slot: 0}\n"
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil {
		t.Fatal("Load succeeded, want errors")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 2 {
		t.Errorf("want 2 error lines, got:\n%v", err)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, path+": ") {
			t.Errorf("error line %q does not start with the file name", l)
		}
	}

	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load(missing) = %v, want an error naming the file", err)
	}
}

func TestRoundTrip(t *testing.T) {
	t.Setenv("NODE_NAME", "node-1")
	c, err := Load("example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	again, err := process(string(out))
	if err != nil {
		t.Fatalf("re-reading the marshalled config: %v\n%s", err, out)
	}
	if diff := cmp.Diff(c, again, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("round trip (-loaded +re-read):\n%s", diff)
	}
}

func TestTableName(t *testing.T) {
	in := Instance{Name: "team-a"}
	if got := in.TableName("shardproxy"); got != "shardproxy-team-a" {
		t.Errorf("TableName = %q, want shardproxy-team-a", got)
	}
}
