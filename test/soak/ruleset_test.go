package soak

import (
	"strconv"
	"strings"
	"testing"
)

// listing is `nft -j list table ip t` of a small table (nft 1.0.6), with the handles,
// element order and counter values given; the tests vary them.
func listing(handles [3]int, elems string, counter int, rules string) []byte {
	r := strings.NewReplacer("H1", itoa(handles[0]), "H2", itoa(handles[1]), "H3", itoa(handles[2]), "ELEMS", elems, "COUNTER", itoa(counter), "RULES", rules)
	return []byte(r.Replace(`{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "t", "handle": H1}},
{"map": {"family": "ip", "name": "m", "table": "t", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": H2, "map": "verdict", "elem": [ELEMS]}},
{"chain": {"family": "ip", "table": "t", "name": "c2", "handle": H3}},
RULES
{"rule": {"family": "ip", "table": "t", "chain": "c2", "handle": 8, "expr": [{"counter": {"packets": COUNTER, "bytes": 0}}]}}]}`))
}

func itoa(n int) string { return strconv.Itoa(n) }

const (
	elemA    = `[{"concat": ["10.96.0.1", "tcp", 80]}, {"goto": {"target": "c2"}}]`
	elemB    = `[{"concat": ["10.96.0.2", "udp", 53]}, {"goto": {"target": "c2"}}]`
	ruleDrop = `{"rule": {"family": "ip", "table": "t", "chain": "c2", "handle": 7, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "1.2.3.4"}}, {"drop": null}]}},`
)

func TestRulesetComparison(t *testing.T) {
	want := listing([3]int{1, 2, 3}, elemA+", "+elemB, 0, ruleDrop)
	for _, tc := range []struct {
		name      string
		got       []byte
		wantDiffs int
	}{
		{name: "same table", got: want},
		{name: "other handles, element order and counter values are the same table", got: listing([3]int{4, 5, 6}, elemB+", "+elemA, 7, ruleDrop)},
		{name: "a missing element differs", got: listing([3]int{1, 2, 3}, elemA, 0, ruleDrop), wantDiffs: 1},
		{name: "a missing rule differs, and moves the rules after it", got: listing([3]int{1, 2, 3}, elemA+", "+elemB, 0, ""), wantDiffs: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := ParseRuleset(want)
			if err != nil {
				t.Fatal(err)
			}
			g, err := ParseRuleset(tc.got)
			if err != nil {
				t.Fatal(err)
			}
			lines, total := Diff(w, g, 10)
			if total != tc.wantDiffs {
				t.Errorf("%d differences, want %d:\n%s\nwant:\n%s\ngot:\n%s", total, tc.wantDiffs, strings.Join(lines, "\n"), w, g)
			}
		})
	}
}

func TestRulesetRejectsGarbage(t *testing.T) {
	if _, err := ParseRuleset([]byte("table ip t {")); err == nil {
		t.Error("parsed nft's text format as JSON")
	}
}
