package config

import (
	"strings"
	"testing"
)

// TestDecodeErrors: a decode error names the line, the field path and the problem in
// YAML's words, never a Go type; an unknown field suggests the nearest known one; one
// mistake is one error, however much of the file it touches.
func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string // Decode's error, line by line, exactly; none means it decodes
	}{
		// Unknown fields.
		{
			name: "a misspelled top-level field suggests the right one",
			yaml: minimal + "healthzBindAdress: 0.0.0.0:10256\n",
			want: []string{`test.yaml: line 8: healthzBindAdress: unknown field; did you mean "healthzBindAddress"?`},
		},
		{
			name: "a misspelled field of a tenant names its path",
			yaml: minimal + `- name: team-a
  proxyNames: [a]
  slot: 1
  tenant:
    namespaces: [a]
    externalIPCIDR: [192.0.2.0/24]
`,
			want: []string{`test.yaml: line 13: instances[1].tenant.externalIPCIDR: unknown field; did you mean "externalIPCIDRs"?`},
		},
		{
			name: "swapped letters are one edit",
			yaml: strings.Replace(minimal, "default: true", "defualt: true", 1),
			want: []string{`test.yaml: line 6: instances[0].defualt: unknown field; did you mean "default"?`},
		},
		{
			name: "case, dashes and underscores do not count",
			yaml: minimal + "NodeName: x\nmetrics_bind_address: 127.0.0.1:1\ntable-prefix: shardproxy\n",
			want: []string{
				`test.yaml: line 8: NodeName: unknown field; did you mean "nodeName"?`,
				`test.yaml: line 9: metrics_bind_address: unknown field; did you mean "metricsBindAddress"?`,
				`test.yaml: line 10: table-prefix: unknown field; did you mean "tablePrefix"?`,
			},
		},
		{
			name: "a field one level too high names where it belongs",
			yaml: minimal + "  namespaces: [a]\n  mode: NodeCIDR\n",
			want: []string{
				`test.yaml: line 8: instances[0].namespaces: unknown field; did you mean "tenant.namespaces"?`,
				`test.yaml: line 9: instances[0].mode: unknown field; did you mean "detectLocal.mode"?`,
			},
		},
		{
			name: "nothing near in a small mapping lists its fields",
			yaml: minimal + "  tenant: {ranges: [192.0.2.0/24]}\n",
			want: []string{`test.yaml: line 8: instances[0].tenant.ranges: unknown field; the fields here are externalIPCIDRs, loadBalancerCIDRs and namespaces`},
		},
		{
			name: "nothing near in a large mapping says only that",
			yaml: minimal + "bogus: 1\n",
			want: []string{"test.yaml: line 8: bogus: unknown field"},
		},

		// Duplicate keys.
		{
			name: "a duplicate key is one error and the rest of the file is still read",
			yaml: header + "nodeName: a\nnodeName: b\nmasqueradeBit: x\ninstances:\n- {name: a, default: true, slot: 0, sloth: 1}\n",
			want: []string{
				"test.yaml: line 4: nodeName: duplicate key, on lines 3 and 4: keep one",
				`test.yaml: line 5: masqueradeBit: want an integer, not "x"`,
				`test.yaml: line 7: instances[0].sloth: unknown field; did you mean "slot"?`,
			},
		},
		{
			name: "a key three times is one error",
			yaml: minimal + "  slot: 1\n  slot: 2\n",
			want: []string{"test.yaml: line 8: instances[0].slot: duplicate key, on lines 7, 8 and 9: keep one"},
		},
		{
			name: "a duplicate's value is not read",
			yaml: minimal + "  tenant: {namespaces: [a]}\n  tenant: {bogus: 1, namespaces: x}\n",
			want: []string{"test.yaml: line 9: instances[0].tenant: duplicate key, on lines 8 and 9: keep one"},
		},
		{
			name: "a duplicate apiVersion is not also an unsupported one",
			yaml: header + "apiVersion: v1\nnodeName: a\n",
			want: []string{"test.yaml: line 3: apiVersion: duplicate key, on lines 1 and 3: keep one"},
		},

		// Values of the wrong kind.
		{
			name: "an integer that is not one",
			yaml: strings.Replace(minimal, "slot: 0", "slot: one", 1),
			want: []string{`test.yaml: line 7: instances[0].slot: want an integer, not "one"`},
		},
		{
			name: "wrong kinds, in YAML's words",
			yaml: header + `nodeName: [a]
enableProfiling: maybe
conntrack:
  min: 99999999999
clientConnection: {qps: fast}
reservedCIDRs: 10.0.0.0/8
instances:
- name: a
  default: true
  slot: 0
  tenant: [a]
  proxyNames: [a, [b], {c: d}]
`,
			want: []string{
				"test.yaml: line 3: nodeName: want a string, not a list",
				`test.yaml: line 4: enableProfiling: want true or false, not "maybe"`,
				"test.yaml: line 6: conntrack.min: 99999999999 is out of range [-2147483648, 2147483647]",
				`test.yaml: line 7: clientConnection.qps: want a number, not "fast"`,
				`test.yaml: line 8: reservedCIDRs: want a list, not "10.0.0.0/8": write [10.0.0.0/8]`,
				"test.yaml: line 13: instances[0].tenant: want a mapping, not a list",
				"test.yaml: line 14: instances[0].proxyNames[1]: want a string, not a list",
				"test.yaml: line 14: instances[0].proxyNames[2]: want a string, not a mapping",
			},
		},
		{
			name: "a duration names its path",
			yaml: minimal + "  syncPeriod: 5\n",
			want: []string{`test.yaml: line 8: instances[0].syncPeriod: duration 5 has no unit: write it as e.g. "5s" or "5ms"`},
		},
		{
			name: "a file that is a list is one error",
			yaml: "- a\n",
			want: []string{"test.yaml: line 1: want a mapping (a SupervisorConfig), not a list"},
		},
		{
			name: "an apiVersion of the wrong kind is not also an unsupported one",
			yaml: "apiVersion: [shardproxy.io/v1alpha1]\nkind: SupervisorConfig\n",
			want: []string{"test.yaml: line 1: apiVersion: want a string, not a list"},
		},
		{
			name: "a key that is not a name",
			yaml: minimal + "[a]: 1\n",
			want: []string{"test.yaml: line 8: a key must be a field name, not a list"},
		},

		// What YAML allows.
		{
			name: "anchors, aliases and merge keys",
			yaml: header + `nodeName: node-1
instances:
- &common
  name: default
  default: true
  slot: 0
  syncPeriod: 1m
- <<: *common
  name: team-a
  default: false
  proxyNames: [a]
  slot: 1
  tenant: {namespaces: [a]}
`,
		},
		{
			name: "an unknown field in a merged mapping",
			yaml: header + `nodeName: node-1
instances:
- &common
  name: default
  default: true
  slot: 0
  sloth: 1
- <<: *common
  name: team-a
`,
			want: []string{`test.yaml: line 9: instances[0].sloth: unknown field; did you mean "slot"?`},
		},
		{
			name: "null leaves a field unset",
			yaml: minimal + "  tenant:\nconntrack: ~\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.yaml), "test.yaml")
			got := ""
			if err != nil {
				got = err.Error()
			}
			if want := strings.Join(tc.want, "\n"); got != want {
				t.Errorf("errors:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"slot", "slot", 0},
		{"", "slot", 4},
		{"sloth", "slot", 1},
		{"defualt", "default", 1},
		{"healthzbindadress", "healthzbindaddress", 1},
		{"kitten", "sitting", 3},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestDecodeAliasBomb: aliases that expand a small file into a huge tree stop the
// walk with one error, not the decoder's follow-on about the same aliases.
func TestDecodeAliasBomb(t *testing.T) {
	data := header + "nodeName: n\ninstances: [&i {name: a, slot: 0, proxyNames: [" + strings.Repeat("a,", 5000) + "a]}" +
		strings.Repeat(", *i", 5000) + "]\n"
	_, err := Decode([]byte(data), "test.yaml")
	if err == nil {
		t.Fatal("Decode accepted an alias bomb")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "test.yaml: line 4: instances[") ||
		!strings.HasSuffix(lines[0], "the document expands to more than 262144 nodes through aliases") {
		t.Errorf("error:\n%v\nwant one line: the document expands to more than 262144 nodes", err)
	}
}
