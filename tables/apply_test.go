package tables

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// elementCommand matches one element command of a transaction's text.
var elementCommand = regexp.MustCompile(`^(add|delete) element (\S+ \S+ \S+) \{ (.*) \}$`)

// elementLines renders d as nft would get it and returns one line per element
// ("add element ip t set { key : value }"), sorted, splitting commands that carry many.
func elementLines(t *testing.T, a *NFTApplier, d *Diff) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(a.transaction(d).String(), "\n") {
		m := elementCommand.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, el := range strings.Split(m[3], ", ") {
			out = append(out, m[1]+" element "+m[2]+" { "+el+" }")
		}
	}
	slices.Sort(out)
	return out
}

// TestElementsPerCommand: many elements per command say exactly what one per command
// says, for additions (with values) and deletions (without), across set boundaries and
// command limits.
func TestElementsPerCommand(t *testing.T) {
	s, _ := newFake(t, testConfig(IPv4))
	d, _, err := s.fullDiff(generated(30), existing{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.AddElements) < 100 {
		t.Fatalf("only %d elements: nothing to batch", len(d.AddElements))
	}
	for _, tc := range []struct {
		name string
		diff *Diff
	}{
		{"additions", &Diff{AddElements: d.AddElements}},
		{"deletions", &Diff{DeleteElements: d.AddElements}},
	} {
		nft := knftables.NewFake(knftables.IPv4Family, "shardproxy-test")
		want := elementLines(t, NewNFTApplier(nft, knftables.IPv4Family, "shardproxy-test", 1), tc.diff)
		if len(want) != len(d.AddElements) {
			t.Fatalf("%s: %d element lines one per command, want %d", tc.name, len(want), len(d.AddElements))
		}
		for _, per := range []int{2, 7, MaxElementsPerCommand} {
			a := NewNFTApplier(nft, knftables.IPv4Family, "shardproxy-test", per)
			if got := elementLines(t, a, tc.diff); !cmp.Equal(want, got) {
				t.Errorf("%s, %d per command: (-one per command +batched):\n%s", tc.name, per, cmp.Diff(want, got))
			}
			if n, ops := len(d.AddElements), a.transaction(tc.diff).NumOperations(); ops >= n {
				t.Errorf("%s, %d per command: %d commands for %d elements", tc.name, per, ops, n)
			}
		}
	}
}

// TestStreamWritesTheTransaction: the script streamed to nft a chunk at a time, its
// element commands written straight from their ids, is, byte for byte, the one
// transaction knftables would run, for full and partial Diffs smaller and larger than
// a chunk.
func TestStreamWritesTheTransaction(t *testing.T) {
	s, _ := newFake(t, testConfig(IPv4))
	full, _, err := s.fullDiff(generated(300), existing{known: true, chains: []string{"stale-chain"}})
	if err != nil {
		t.Fatal(err)
	}
	if full.Len() < 3*streamChunkOps {
		t.Fatalf("the full Diff has %d operations: no several chunks to stream", full.Len())
	}
	// Two elements of every set and map the full sync fills: a delete carries no value,
	// an add to a map does.
	var eachSet []string
	perSet := map[string]int{}
	for _, id := range full.AddElements {
		if perSet[idSet(id)] < 2 {
			perSet[idSet(id)]++
			eachSet = append(eachSet, id)
		}
	}
	mapElems := 0
	for _, id := range eachSet {
		if elementFromID(id).isMap {
			mapElems++
		}
	}
	if mapElems < 4 || len(eachSet)-mapElems < 2 {
		t.Fatalf("the elements picked hold %d map and %d set elements: want both kinds", mapElems, len(eachSet)-mapElems)
	}
	for _, tc := range []struct {
		name string
		diff *Diff
	}{
		{"full sync, several chunks", full},
		{"recreate", &Diff{Recreate: true, Skeleton: full.Skeleton}},
		{"partial, a few operations", &Diff{DeleteElements: full.AddElements[:3], FlushChains: []string{"a"},
			WriteChains: []ChainRules{{Name: "b", Rules: []string{"counter"}, MayExist: true}}, AddElements: full.AddElements[3:5],
			DeleteChains: []string{"a"}, DeleteSets: []string{"s"}}},
		{"partial, deletes and adds in every set and map", &Diff{DeleteElements: eachSet, AddElements: eachSet}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, per := range []int{1, MaxElementsPerCommand} {
				a := fakeApplier(per)
				var b strings.Builder
				if err := a.stream(&b, tc.diff); err != nil {
					t.Fatal(err)
				}
				if want := a.transaction(tc.diff).String(); b.String() != want {
					t.Errorf("%d per command: streamed script differs from the transaction:\n%s", per, cmp.Diff(want, b.String()))
				}
			}
		})
	}
}

// TestStreamChunksHoldFewElements: a streamed script hands nft a chunk at a time, and a
// chunk holds at most streamChunkOps operations counting each element as one, plus one
// command's elements: never the whole table's elements, which a count of commands (of
// up to MaxElementsPerCommand elements each) let into one chunk at the full sync's
// memory peak.
func TestStreamChunksHoldFewElements(t *testing.T) {
	s, _ := newFake(t, testConfig(IPv4))
	full, _, err := s.fullDiff(generatedWith(1000, 10), existing{known: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(full.AddElements); n < 3*MaxElementsPerCommand {
		t.Fatalf("the full Diff has %d elements: fewer than three commands' worth", n)
	}
	a := fakeApplier(MaxElementsPerCommand)
	w := &chunkRecorder{}
	if err := a.stream(w, full); err != nil {
		t.Fatal(err)
	}
	const most = streamChunkOps + MaxElementsPerCommand
	if w.most > most {
		t.Errorf("a chunk of the stream held %d operations (elements counted one each), want at most %d", w.most, most)
	}
}

// chunkRecorder records the largest number of operations one write carried, an
// element of a multi-element command counting as one.
type chunkRecorder struct{ most int }

func (r *chunkRecorder) Write(p []byte) (int, error) {
	n := 0
	for line := range strings.Lines(string(p)) {
		n++
		if _, elems, ok := strings.Cut(line, "{ "); ok && strings.Contains(line, " element ") {
			n += strings.Count(elems, ", ")
		}
	}
	r.most = max(r.most, n)
	return len(p), nil
}

// TestStreamStopsAtAnInvalidOperation: an operation knftables refuses (a set without a
// type) fails the stream; knftables leaves it and what follows out of the text, which
// nft would otherwise run without them.
func TestStreamStopsAtAnInvalidOperation(t *testing.T) {
	a := fakeApplier(MaxElementsPerCommand)
	var b strings.Builder
	d := &Diff{AddSets: []*knftables.Set{{Name: "typeless"}}, WriteChains: []ChainRules{{Name: "after", Rules: []string{"counter"}}}}
	if err := a.stream(&b, d); err == nil {
		t.Errorf("a set without a type streamed without an error:\n%s", b.String())
	}
}

// fakeApplier is an NFTApplier over a new knftables Fake bound to the tests' table,
// writing per elements of a set a command when streaming.
func fakeApplier(per int) *NFTApplier {
	return NewNFTApplier(knftables.NewFake(knftables.IPv4Family, "shardproxy-test"), knftables.IPv4Family, "shardproxy-test", per)
}
