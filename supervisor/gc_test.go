package supervisor

import (
	"slices"
	"testing"
)

func TestTuneGC(t *testing.T) {
	for _, tc := range []struct {
		gogc    string
		want    int
		wantSet int // 0: not called
	}{
		{"", DefaultGCPercent, DefaultGCPercent},
		{"100", -1, 0},
		{"off", -1, 0},
	} {
		set := 0
		got := TuneGC(func(k string) string {
			if k == "GOGC" {
				return tc.gogc
			}
			return ""
		}, func(p int) int { set = p; return 100 })
		if got != tc.want || set != tc.wantSet {
			t.Errorf("GOGC=%q: TuneGC = %d, set %d; want %d, set %d", tc.gogc, got, set, tc.want, tc.wantSet)
		}
	}
}

// TestGCTargetDuringFullSyncs: the target is FullSyncGCPercent from the first full sync
// that starts until the last that ends, however they overlap, and DefaultGCPercent
// otherwise; a done called twice counts once. With GOGC set there is no hook.
func TestGCTargetDuringFullSyncs(t *testing.T) {
	if NewGCTarget(-1, func(int) int { return 0 }) != nil {
		t.Error("a hook with GOGC set")
	}
	var set []int
	fullSync := NewGCTarget(DefaultGCPercent, func(p int) int { set = append(set, p); return 0 })
	a := fullSync()
	b := fullSync()
	a()
	a()
	if want := []int{FullSyncGCPercent}; !slices.Equal(set, want) {
		t.Fatalf("with one of two full syncs done: set %v, want %v", set, want)
	}
	b()
	c := fullSync()
	c()
	if want := []int{FullSyncGCPercent, DefaultGCPercent, FullSyncGCPercent, DefaultGCPercent}; !slices.Equal(set, want) {
		t.Errorf("set %v, want %v", set, want)
	}
}
