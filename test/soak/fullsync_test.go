package soak

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/shardproxy/shardproxy/metrics"
	"github.com/shardproxy/shardproxy/test/e2e/env"
)

// watchEvent is one thing the full-sync watch is told, at a second of the soak: a
// reading of /metrics (counts), a kill of the supervisor (kill) or its start (start).
// stale marks a reading begun before the kill and start just before it.
type watchEvent struct {
	at     int
	start  bool
	kill   bool
	stale  bool
	counts map[string]syncCounts
}

func read(at int, full, failed float64) watchEvent {
	return watchEvent{at: at, counts: map[string]syncCounts{"default": {Full: full, Failed: failed}}}
}

// TestFullSyncWatch: a full sync that does not come within twice fullSyncPeriod of the
// last is a failure naming the instance and how long, also when a kill -9 (the kill
// fault's fallback) or the end of the soak cut the wait short; a failed sync (whose
// retry is full) and a process's start (whose first sync waits for its informers)
// restart the clock.
func TestFullSyncWatch(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	start := watchEvent{start: true}
	for _, tc := range []struct {
		name   string
		events []watchEvent
		end    int
		// wantGaps are the gaps over the limit: "instance length ended-by", the ending
		// by its first words.
		wantGaps    []string
		wantLongest time.Duration
	}{
		{
			name:        "full syncs every 31s pass",
			events:      []watchEvent{start, read(1, 0, 0), read(2, 2, 0), read(33, 4, 0), read(64, 6, 0)},
			end:         70,
			wantLongest: 31 * time.Second,
		},
		{
			name:        "a periodic full sync 1m51s after the last fails",
			events:      []watchEvent{start, read(2, 2, 0), read(33, 4, 0), read(144, 6, 0)},
			end:         150,
			wantGaps:    []string{"default 1m51s a full sync"},
			wantLongest: 111 * time.Second,
		},
		{
			name: "a kill -9 after 78s without a full sync fails: the fallback does not make a stall pass",
			events: []watchEvent{start, read(2, 2, 0), read(79, 2, 0), {at: 80, kill: true},
				{at: 81, start: true}, read(83, 0, 0), read(85, 2, 0), read(116, 4, 0)},
			end:         120,
			wantGaps:    []string{"default 1m18s kill -9"},
			wantLongest: 78 * time.Second,
		},
		{
			name:        "the end of the soak ends a stall, which fails",
			events:      []watchEvent{start, read(2, 2, 0), read(89, 2, 0)},
			end:         90,
			wantGaps:    []string{"default 1m28s the end of the soak"},
			wantLongest: 88 * time.Second,
		},
		{
			name:        "failed syncs restart the clock: their retry is full",
			events:      []watchEvent{start, read(2, 2, 0), read(40, 2, 2), read(70, 2, 4), read(95, 4, 4)},
			end:         100,
			wantLongest: 38 * time.Second,
		},
		{
			name:        "a slow first sync after a start is not a gap",
			events:      []watchEvent{start, read(1, 0, 0), read(50, 0, 0), read(80, 2, 0), read(111, 4, 0)},
			end:         115,
			wantLongest: 31 * time.Second,
		},
		{
			name:        "a counter that went down is an instance the supervisor restarted: its first sync is full",
			events:      []watchEvent{start, read(2, 8, 0), read(33, 2, 0), read(64, 4, 0)},
			end:         66,
			wantLongest: 31 * time.Second,
		},
		{
			name: "a reading begun before a kill is not the new process's",
			events: []watchEvent{start, read(2, 2, 0), read(30, 2, 0), {at: 31, kill: true}, {at: 31, start: true},
				{at: 32, stale: true, counts: map[string]syncCounts{"default": {Full: 2}}}, read(33, 0, 0), read(90, 2, 0)},
			end:         95,
			wantLongest: 29 * time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged []string
			w := newFullSyncWatch(2*fullSyncPeriod, []string{"default"}, func(format string, args ...any) {
				logged = append(logged, fmt.Sprintf(format, args...))
			})
			at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
			gen := w.generation()
			for _, e := range tc.events {
				switch {
				case e.start:
					w.started()
				case e.kill:
					w.stopped(at(e.at), "kill -9 of the supervisor")
				case e.stale:
					w.observe(gen, at(e.at), e.counts)
				default:
					gen = w.generation()
					w.observe(gen, at(e.at), e.counts)
				}
			}
			got := w.finish(at(tc.end))
			var gaps []string
			for i, g := range got.Gaps {
				gap := fmt.Sprintf("%s %v %s", g.Instance, g.To.Sub(g.From), g.Ended)
				// The ending is compared by its first words.
				if i < len(tc.wantGaps) && strings.HasPrefix(gap, tc.wantGaps[i]) {
					gap = tc.wantGaps[i]
				}
				gaps = append(gaps, gap)
			}
			if diff := cmp.Diff(tc.wantGaps, gaps); diff != "" {
				t.Errorf("gaps over the limit (-want +got):\n%s\nlogged:\n%s", diff, strings.Join(logged, "\n"))
			}
			if got.Longest["default"] != tc.wantLongest {
				t.Errorf("longest gap %v, want %v", got.Longest["default"], tc.wantLongest)
			}
			problems := got.Problems()
			if len(problems) != len(tc.wantGaps) {
				t.Fatalf("problems %q, want one per gap %q", problems, tc.wantGaps)
			}
			for i, p := range problems {
				want := strings.Fields(tc.wantGaps[i])
				if !strings.Contains(p, "instance "+want[0]) || !strings.Contains(p, "for "+want[1]) {
					t.Errorf("problem %q does not name instance %s and %s", p, want[0], want[1])
				}
			}
			sum := &Summary{FullSyncs: got}
			line := "SOAK " + got.String() + "\n"
			if !strings.Contains(sum.String(), line) {
				t.Errorf("summary lacks %q:\n%s", line, sum)
			}
			if pass := strings.Contains(sum.String(), "SOAK PASS\n"); pass != (len(tc.wantGaps) == 0) {
				t.Errorf("summary passes: %v, want %v:\n%s", pass, len(tc.wantGaps) == 0, sum)
			}
		})
	}
}

// TestFullSyncWatchNeedsAFullSync: an instance the watch never saw complete a full sync
// fails the soak (its metric renamed, say), rather than having no gap to report.
func TestFullSyncWatchNeedsAFullSync(t *testing.T) {
	w := newFullSyncWatch(2*fullSyncPeriod, []string{"default", "team-a"}, t.Logf)
	w.started()
	now := time.Now()
	w.observe(w.generation(), now, map[string]syncCounts{"default": {Full: 2}})
	got := w.finish(now.Add(10 * time.Second))
	if p := got.Problems(); len(p) != 1 || !strings.Contains(p[0], "team-a") {
		t.Errorf("problems %q, want one for team-a", p)
	}
}

// TestSyncCountsOfTheSupervisorsMetrics reads the counters from what the supervisor's
// metrics package serves, so a renamed series or label fails here, not in a soak that
// would then see no full sync.
func TestSyncCountsOfTheSupervisorsMetrics(t *testing.T) {
	m := metrics.New()
	for _, inst := range []string{"default", "team-a"} {
		m.InitInstance(inst)
	}
	for range 3 {
		for _, fam := range []string{metrics.IPv4, metrics.IPv6} {
			m.ObserveSync("default", fam, true, time.Millisecond)
			m.ObserveSync("default", fam, false, time.Millisecond)
			m.ObserveSync("team-a", fam, false, time.Millisecond)
		}
	}
	m.SyncFailed("team-a", metrics.IPv4)
	m.SyncFailed("team-a", metrics.IPv6)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := syncCountsOf(env.Metrics(fams), []string{"default", "team-a", "team-b"})
	want := map[string]syncCounts{"default": {Full: 6}, "team-a": {Failed: 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

// TestSoakConfigLeavesAMargin: every instance of the soak's configuration has the
// fullSyncPeriod the watch assumes, and its full syncs' legitimate latest (fullSyncPeriod
// + syncPeriod, as a full sync rides on the next sync) stays clear of the watch's limit,
// so that a gap over the limit is a stall, not an idle instance's timing.
func TestSoakConfigLeavesAMargin(t *testing.T) {
	var instances []struct {
		Name           string `json:"name"`
		SyncPeriod     string `json:"syncPeriod"`
		FullSyncPeriod string `json:"fullSyncPeriod"`
	}
	if err := yaml.Unmarshal([]byte(instancesConfig), &instances); err != nil {
		t.Fatal(err)
	}
	if len(instances) == 0 {
		t.Fatal("no instances")
	}
	const margin = 10 * time.Second
	for _, in := range instances {
		full, err := time.ParseDuration(in.FullSyncPeriod)
		if err != nil || full != fullSyncPeriod {
			t.Errorf("%s: fullSyncPeriod %q, want %v (%v)", in.Name, in.FullSyncPeriod, fullSyncPeriod, err)
		}
		sync, err := time.ParseDuration(in.SyncPeriod)
		if err != nil {
			t.Errorf("%s: syncPeriod %q (the default, 30s, leaves no margin): %v", in.Name, in.SyncPeriod, err)
			continue
		}
		if latest := full + sync; latest > 2*fullSyncPeriod-margin {
			t.Errorf("%s: full syncs may legitimately come %v apart, within %v of the limit %v", in.Name, latest, margin, 2*fullSyncPeriod)
		}
	}
}
