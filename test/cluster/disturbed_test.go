package cluster

import (
	"slices"
	"testing"
	"time"
)

// TestUnexcusedFailures: a failed request is excused only if it was sent while its
// Service had no ready endpoint, widened by excuseBefore and excuseAfter; a backend
// that changed while another stayed ready excuses nothing.
func TestUnexcusedFailures(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	samples := func(pairs ...float64) []readySample {
		var out []readySample
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, readySample{at(pairs[i]), int(pairs[i+1])})
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		samples  []readySample // (seconds, ready) pairs
		end      float64
		failures []time.Time
		want     []time.Time // unexcused
	}{
		{
			name:    "endpoints ready throughout: nothing is excused",
			samples: samples(0, 2), end: 30,
			failures: []time.Time{at(5), at(6)}, want: []time.Time{at(5), at(6)},
		},
		{
			name:    "sent while no endpoint was ready: excused",
			samples: samples(0, 2, 10, 0, 12, 2), end: 30,
			failures: []time.Time{at(10), at(11), at(12)},
		},
		{
			name:    "a backend replaced while the other stayed ready excuses nothing",
			samples: samples(0, 2, 10, 1, 15, 2), end: 30,
			failures: []time.Time{at(11), at(14)}, want: []time.Time{at(11), at(14)},
		},
		{
			name:    "the margin before the window, and no more",
			samples: samples(0, 2, 10, 0, 12, 2), end: 30,
			failures: []time.Time{at(10).Add(-excuseBefore), at(10).Add(-excuseBefore - time.Millisecond)},
			want:     []time.Time{at(10).Add(-excuseBefore - time.Millisecond)},
		},
		{
			name:    "the margin after the window, and no more",
			samples: samples(0, 2, 10, 0, 12, 2), end: 30,
			failures: []time.Time{at(12).Add(excuseAfter), at(12).Add(excuseAfter + time.Millisecond)},
			want:     []time.Time{at(12).Add(excuseAfter + time.Millisecond)},
		},
		{
			name:    "no endpoint until the recording ended",
			samples: samples(0, 2, 10, 0), end: 20,
			failures: []time.Time{at(15), at(20).Add(excuseAfter), at(20).Add(excuseAfter + time.Millisecond)},
			want:     []time.Time{at(20).Add(excuseAfter + time.Millisecond)},
		},
		{
			name:    "between two windows",
			samples: samples(0, 2, 10, 0, 11, 2, 20, 0, 21, 2), end: 30,
			failures: []time.Time{at(10.5), at(16), at(20.5)}, want: []time.Time{at(16)},
		},
		{
			name:    "a failure without a time is never excused",
			samples: samples(0, 0), end: 30,
			failures: []time.Time{{}}, want: []time.Time{{}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			windows := noReadyWindows(tc.samples, at(tc.end), excuseBefore, excuseAfter)
			if got := unexcused(tc.failures, windows); !slices.Equal(got, tc.want) {
				t.Errorf("unexcused %v, want %v (windows %v)", got, tc.want, windows)
			}
		})
	}
}

// TestNoReadyWindowsMergeOverlaps: windows that overlap once widened are one.
func TestNoReadyWindowsMergeOverlaps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	s := []readySample{{t0, 0}, {t0.Add(time.Second), 1}, {t0.Add(2 * time.Second), 0}, {t0.Add(3 * time.Second), 2}}
	got := noReadyWindows(s, t0.Add(time.Minute), excuseBefore, excuseAfter)
	want := []window{{t0.Add(-excuseBefore), t0.Add(3*time.Second + excuseAfter)}}
	if !slices.Equal(got, want) {
		t.Errorf("windows %v, want %v", got, want)
	}
}

// TestReadyTimelineRecordsChanges: a timeline keeps one sample per change of the count,
// nothing after Stop, and judges failures against what it recorded.
func TestReadyTimelineRecordsChanges(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tl := &ReadyTimeline{name: "ns/web", stop: func() {}}
	for i, ready := range []int{2, 2, 0, 0, 1} {
		tl.observe(t0.Add(time.Duration(i)*time.Second), ready)
	}
	tl.Stop()
	tl.observe(time.Now().Add(time.Hour), 0)
	want := []readySample{{t0, 2}, {t0.Add(2 * time.Second), 0}, {t0.Add(4 * time.Second), 1}}
	if !slices.Equal(tl.samples, want) {
		t.Errorf("samples %v, want %v", tl.samples, want)
	}
	bad, _ := tl.Unexcused([]time.Time{t0.Add(3 * time.Second), t0.Add(10 * time.Second)})
	if !slices.Equal(bad, []time.Time{t0.Add(10 * time.Second)}) {
		t.Errorf("unexcused %v, want only the failure at +10s", bad)
	}
}

// TestParseUnixTime reads the pod loop's date +%s.%N.
func TestParseUnixTime(t *testing.T) {
	for in, want := range map[string]time.Time{
		"1700000000.123456789": time.Unix(1700000000, 123456789),
		"1700000000.5":         time.Unix(1700000000, 500000000),
		"1700000000":           time.Unix(1700000000, 0),
		"%s.%N":                {},
		"":                     {},
	} {
		if got := parseUnixTime(in); !got.Equal(want) {
			t.Errorf("parseUnixTime(%q) = %v, want %v", in, got, want)
		}
	}
}
