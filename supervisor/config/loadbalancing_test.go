package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/tables"
)

func TestLoadBalancingConfig(t *testing.T) {
	for _, tc := range []struct {
		name        string
		yaml        string
		wantMode    tables.LBMode
		wantAllowed []tables.LBMode
		wantErr     []string
	}{
		{name: "default: random, nothing allowed", yaml: minimal, wantMode: tables.LBRandom},
		{
			name:        "a mode and allowed modes",
			yaml:        minimal + "  loadBalancing: {mode: consistentHash, allowedModes: [sourceHash, roundRobin]}\n",
			wantMode:    tables.LBConsistentHash,
			wantAllowed: []tables.LBMode{tables.LBSourceHash, tables.LBRoundRobin},
		},
		{
			name: "every problem, with its path",
			yaml: minimal + "  loadBalancing: {mode: maglev, allowedModes: [sourceHash, RoundRobin, sourceHash, \"\"]}\n",
			wantErr: []string{
				`instances[0].loadBalancing.mode: "maglev" is not one of "random", "roundRobin", "sourceHash", "consistentHash"`,
				`instances[0].loadBalancing.allowedModes[1]: "RoundRobin" is not one of`,
				`instances[0].loadBalancing.allowedModes[2]: "sourceHash" is listed twice`,
				`instances[0].loadBalancing.allowedModes[3]: "" is not one of`,
			},
		},
		{
			name:    "an unknown field",
			yaml:    minimal + "  loadBalancing: {modes: [random]}\n",
			wantErr: []string{`test.yaml: line 8: instances[0].loadBalancing.modes: unknown field; did you mean "mode"?`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := process(tc.yaml)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want %q", tc.wantErr)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not contain %q; it is:\n%v", want, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mode, allowed := c.Instances[0].LoadBalancing.Modes()
			if mode != tc.wantMode || !slices.Equal(allowed, tc.wantAllowed) {
				t.Errorf("Modes() = %q, %q; want %q, %q", mode, allowed, tc.wantMode, tc.wantAllowed)
			}
		})
	}
}

// TestExampleShowsConsistentHash: example.yaml (and deploy/'s copy of it) shows a team
// instance with consistentHash.
func TestExampleShowsConsistentHash(t *testing.T) {
	t.Setenv("NODE_NAME", "node-1")
	c, err := Load("example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range c.Instances {
		if mode, _ := in.LoadBalancing.Modes(); mode == tables.LBConsistentHash && !in.Default {
			return
		}
	}
	t.Error("no team instance with loadBalancing.mode consistentHash in example.yaml")
}
