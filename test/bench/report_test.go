package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/shardproxy/shardproxy/tables"
)

func TestParseModes(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []tables.LBMode
		wantErr bool
	}{
		{"random", []tables.LBMode{tables.LBRandom}, false},
		{"random, consistentHash,roundRobin", []tables.LBMode{tables.LBRandom, tables.LBConsistentHash, tables.LBRoundRobin}, false},
		{"", nil, true},
		{"random,maglev", nil, true},
	} {
		got, err := parseModes(tc.in)
		if (err != nil) != tc.wantErr || strings.Join(modeStrings(got), ",") != strings.Join(modeStrings(tc.want), ",") {
			t.Errorf("parseModes(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func modeStrings(ms []tables.LBMode) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m))
	}
	return out
}

// TestEvaluateModes: issue 6's targets are checked on the first mode only; each other
// mode's partial sync at 10k against the first's (issue 14), and the table shows modes.
func TestEvaluateModes(t *testing.T) {
	scale := func(n int, mode tables.LBMode, partialMS, fullS float64) ScaleResult {
		s := ScaleResult{Services: n, Mode: mode, FullOverFloor: 1.1}
		s.Full.Seconds = fullS
		s.Partial = []Partial{{Name: "1 endpoint changed", MedianMS: partialMS}}
		return s
	}
	rep := &Report{Scales: []ScaleResult{
		scale(10000, tables.LBRandom, 16, 2.9),
		scale(10000, tables.LBConsistentHash, 30, 60),
		scale(10000, tables.LBRoundRobin, 40, 9),
		scale(1000, tables.LBRoundRobin, 10, 1),
	}}
	evaluate(rep)
	got := map[string]bool{}
	for _, c := range rep.Checks {
		got[c.Name] = c.Pass
	}
	want := map[string]bool{
		"10k: partial sync, 1 endpoint changed, median": true,
		"10k: full sync": true,
		"10k: full sync / nft -f of the final ruleset":                            true,
		"10k consistentHash: partial sync, 1 endpoint changed, median / random's": true,
		"10k roundRobin: partial sync, 1 endpoint changed, median / random's":     false,
	}
	for name, pass := range want {
		if p, ok := got[name]; !ok || p != pass {
			t.Errorf("check %q: present %v, pass %v; want pass %v (checks %+v)", name, ok, p, pass, rep.Checks)
		}
	}
	if len(rep.Checks) != len(want) {
		t.Errorf("%d checks, want %d: %+v", len(rep.Checks), len(want), rep.Checks)
	}
	var out bytes.Buffer
	PrintTable(&out, rep)
	if !strings.Contains(out.String(), "consistentHash") {
		t.Errorf("the table does not name the modes:\n%s", out.String())
	}
}
