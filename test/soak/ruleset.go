package soak

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Ruleset is a table as `nft -j list table` shows it, normalised for comparison: one
// line per table, chain, set or map (without its elements), per element and per rule,
// sorted. Handles, counter values and element expiry times (kernel bookkeeping) are left out; rules keep
// their position in their chain, which is part of what they mean, and elements none.
type Ruleset []string

// ParseRuleset normalises the output of `nft -j list table`.
func ParseRuleset(data []byte) (Ruleset, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("decoding nft's JSON: %w", err)
	}
	var out Ruleset
	ruleIndex := map[string]int{}
	for _, obj := range doc.Nftables {
		for kind, raw := range obj {
			if kind == "metainfo" {
				continue
			}
			var v map[string]any
			if err := json.Unmarshal(raw, &v); err != nil {
				return nil, fmt.Errorf("decoding a %s: %w", kind, err)
			}
			strip(v)
			name, _ := v["name"].(string)
			switch kind {
			case "set", "map":
				elems, _ := v["elem"].([]any)
				delete(v, "elem")
				for _, e := range elems {
					out = append(out, kind+" "+name+" elem "+canonical(e))
				}
			case "rule":
				chain, _ := v["chain"].(string)
				name = chain + " #" + strconv.Itoa(ruleIndex[chain])
				ruleIndex[chain]++
				v = map[string]any{"expr": v["expr"]}
			}
			out = append(out, kind+" "+name+" "+canonical(v))
		}
	}
	slices.Sort(out)
	return out, nil
}

// strip removes the kernel's bookkeeping from a decoded object, recursively.
func strip(v any) {
	switch t := v.(type) {
	case map[string]any:
		for _, k := range []string{"handle", "expires", "packets", "bytes"} {
			delete(t, k)
		}
		for _, x := range t {
			strip(x)
		}
	case []any:
		for _, x := range t {
			strip(x)
		}
	}
}

// canonical is JSON with sorted keys (encoding/json sorts map keys).
func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// Diff lists what is only in want (prefixed "-") and only in got ("+"), at most limit
// lines, and how many differences there are in all.
func Diff(want, got Ruleset, limit int) (lines []string, total int) {
	i, j := 0, 0
	add := func(prefix, s string) {
		total++
		if len(lines) < limit {
			lines = append(lines, prefix+s)
		}
	}
	for i < len(want) || j < len(got) {
		switch {
		case j == len(got) || (i < len(want) && want[i] < got[j]):
			add("-", want[i])
			i++
		case i == len(want) || got[j] < want[i]:
			add("+", got[j])
			j++
		default:
			i++
			j++
		}
	}
	return lines, total
}

// String is the ruleset, one line each.
func (r Ruleset) String() string { return strings.Join(r, "\n") }
