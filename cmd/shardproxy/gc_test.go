package main

import "testing"

func TestTuneGC(t *testing.T) {
	for _, tc := range []struct {
		gogc    string
		want    int
		wantSet int // 0: not called
	}{
		{"", defaultGCPercent, defaultGCPercent},
		{"100", -1, 0},
		{"off", -1, 0},
	} {
		set := 0
		got := tuneGC(func(k string) string {
			if k == "GOGC" {
				return tc.gogc
			}
			return ""
		}, func(p int) int { set = p; return 100 })
		if got != tc.want || set != tc.wantSet {
			t.Errorf("GOGC=%q: tuneGC = %d, set %d; want %d, set %d", tc.gogc, got, set, tc.want, tc.wantSet)
		}
	}
}
