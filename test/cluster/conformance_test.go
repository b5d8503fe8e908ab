package cluster

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardproxy/shardproxy/test/cluster/e2ereport"
	"github.com/shardproxy/shardproxy/test/controlplane"
)

// The tests here need no cluster (they do not call need): they hold TestConformance's
// plan and its CI record to the code, in seconds, before the cluster layer's minutes.

func TestConformancePlan(t *testing.T) {
	for _, tc := range []struct {
		name, mode       string
		baseline, record bool
		want             conformancePlan
		timeout          time.Duration
		wantErr          string
	}{
		{name: "CI runs shardproxy alone against the record", want: conformancePlan{name: "ci", focus: ServicesConformanceFocus, skip: ServicesSkip, suiteTimeout: 14 * time.Minute}, timeout: 24 * time.Minute},
		{name: "CI's focus with the baseline", baseline: true, want: conformancePlan{name: "ci", focus: ServicesConformanceFocus, skip: ServicesSkip, suiteTimeout: 14 * time.Minute, baseline: true}, timeout: 38 * time.Minute},
		{name: "recording runs the baseline", record: true, want: conformancePlan{name: "ci", focus: ServicesConformanceFocus, skip: ServicesSkip, suiteTimeout: 14 * time.Minute, baseline: true, record: true}, timeout: 38 * time.Minute},
		{name: "make conformance always runs the baseline", mode: "full", want: conformancePlan{name: "full", focus: ServicesFocus, skip: ServicesSkip, suiteTimeout: 45 * time.Minute, baseline: true}, timeout: 100 * time.Minute},
		{name: "a focus of one's own has no record", mode: "hairpin", want: conformancePlan{focus: "hairpin", skip: ServicesSkip, suiteTimeout: 14 * time.Minute}, timeout: 24 * time.Minute},
		{name: "a focus of one's own cannot be recorded", mode: "hairpin", record: true, wantErr: "has no record to write"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := planConformance(tc.mode, tc.baseline, tc.record)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("plan %+v, want %+v", got, tc.want)
			}
			if got.timeout() != tc.timeout {
				t.Errorf("timeout %v, want %v", got.timeout(), tc.timeout)
			}
		})
	}
}

// TestConformanceRecord checks that CI's record is of this e2e.test, focus and skip, and
// lists ciMustRun: a change to either without a new record fails here, not ten minutes
// into the cluster layer.
func TestConformanceRecord(t *testing.T) {
	plan, err := planConformance("", false, false)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(plan.recordPath())
	if err != nil {
		t.Fatalf("%v ($%s=1 writes it)", err, recordEnv)
	}
	rec, err := e2ereport.ParseRecord(data)
	if err != nil {
		t.Fatalf("%s: %v", plan.recordPath(), err)
	}
	want := e2ereport.Selection{Version: controlplane.KubernetesVersion, Focus: ServicesConformanceFocus, Skip: ServicesSkip}
	if rec.Selection != want {
		t.Errorf("%s is of %+v, TestConformance runs %+v: rewrite it ($%s=1)", plan.recordPath(), rec.Selection, want, recordEnv)
	}
	for _, name := range ciMustRun {
		found := false
		for _, r := range rec.Tests {
			found = found || strings.HasSuffix(r.Name, name)
		}
		if !found {
			t.Errorf("%s does not list %q", plan.recordPath(), name)
		}
	}
}
