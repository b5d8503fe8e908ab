package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardproxy/shardproxy/tables"
)

type countingApplier struct{ calls int }

func (a *countingApplier) Apply(context.Context, *tables.Diff) error { a.calls++; return nil }

func TestNetlinkFaults(t *testing.T) {
	if netlinkFaults(func(string) string { return "" }) != nil {
		t.Error("without the variable, the default applier must stay")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		content  *string
		draw     float64
		wantFail bool
	}{
		{name: "no file injects nothing", draw: 0},
		{name: "empty file injects nothing", content: ptrTo(""), draw: 0},
		{name: "not a number injects nothing", content: ptrTo("often"), draw: 0},
		{name: "share 1 fails every transaction", content: ptrTo("1\n"), draw: 0.99, wantFail: true},
		{name: "share 0.3 fails a draw below it", content: ptrTo("0.3"), draw: 0.2, wantFail: true},
		{name: "share 0.3 passes a draw above it", content: ptrTo("0.3"), draw: 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "faults")
			_ = os.Remove(path)
			if tc.content != nil {
				if err := os.WriteFile(path, []byte(*tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			next := &countingApplier{}
			a := &faultyApplier{next: next, path: path, share: func() float64 { return tc.draw }}
			err := a.Apply(t.Context(), &tables.Diff{})
			if gotFail := err != nil; gotFail != tc.wantFail {
				t.Fatalf("Apply error %v, want failure %v", err, tc.wantFail)
			}
			if wantCalls := map[bool]int{true: 0, false: 1}[tc.wantFail]; next.calls != wantCalls {
				t.Errorf("the real applier ran %d times, want %d", next.calls, wantCalls)
			}
		})
	}
}

func ptrTo(s string) *string { return &s }
