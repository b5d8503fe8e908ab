package compare

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCPUSecondsCountsChildren: a child's CPU counts while it runs and after it was
// reaped, as kube-proxy's nft does.
func TestCPUSecondsCountsChildren(t *testing.T) {
	before, err := cpuSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	live := before
	deadline := time.Now().Add(10 * time.Second)
	for live < before+0.05 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // polling a busy child; it is not this test's CPU
		if live, err = cpuSeconds(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	reaped, err := cpuSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if live < before+0.05 {
		t.Errorf("a busy child's CPU not counted while it runs: %v then %v", before, live)
	}
	if reaped < live {
		t.Errorf("CPU went down when the child was reaped: %v then %v", live, reaped)
	}
}

// TestCPUSecondsOfThisProcess: the CPU time read from /proc grows with work done.
func TestCPUSecondsOfThisProcess(t *testing.T) {
	before, err := cpuSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	deadline := time.Now().Add(10 * time.Second)
	after := before
	for after < before+0.05 && time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x += i
		}
		if after, err = cpuSeconds(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after < before+0.05 {
		t.Errorf("CPU time %vs after 10s of spinning, was %vs (sum %d)", after, before, x)
	}
}

func sampleReport() *Report {
	return &Report{Endpoints: 10, Scales: []ScaleResult{
		{Services: 1000, Upstream: ProxyResult{FirstFullSyncSeconds: 3, PeakRSSMB: 120}, Shardproxy: ProxyResult{FirstFullSyncSeconds: 0.3, PeakRSSMB: 60}},
		{Services: 10000, Upstream: ProxyResult{FirstFullSyncSeconds: 32, PeakRSSMB: 487,
			Churn: &ChurnResult{Changes: 1200, CPUSecondsPerMinute: 30}},
			Shardproxy: ProxyResult{FirstFullSyncSeconds: 2.9, PeakRSSMB: 250,
				Churn: &ChurnResult{Changes: 1199, CPUSecondsPerMinute: 3}}},
	}}
}

func TestPrintTableShowsChurn(t *testing.T) {
	r := sampleReport()
	for i := range r.Scales {
		r.Scales[i].fillRatios()
	}
	if got := r.Scales[1].Ratios.ChurnCPU; got != 0.1 {
		t.Errorf("churn CPU ratio %v, want 0.1", got)
	}
	var b bytes.Buffer
	PrintTable(&b, r)
	out := b.String()
	if !strings.Contains(out, "CPU under churn (1200 / 1199 changes)") || !strings.Contains(out, "0.100") {
		t.Errorf("no churn row with its ratio:\n%s", out)
	}
	if strings.Count(out, "CPU under churn") != 1 {
		t.Errorf("a churn row for a scale without churn:\n%s", out)
	}
}

func TestWritePlot(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file, magic string
	}{
		{"compare.svg", "<svg"},
		{"compare.png", "\x89PNG"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(dir, "sub", tc.file)
			if err := sampleReport().WritePlot(path); err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(data[:min(len(data), 200)]), tc.magic) {
				t.Errorf("%s does not start like one: %q", tc.file, data[:min(len(data), 40)])
			}
			if tc.file == "compare.svg" {
				for _, want := range []string{"shardproxy", "kube-proxy (nftables)", "First full sync", "Peak RSS"} {
					if !strings.Contains(string(data), want) {
						t.Errorf("the SVG lacks %q", want)
					}
				}
			}
		})
	}
	if err := (&Report{}).WritePlot(filepath.Join(dir, "empty.svg")); err == nil {
		t.Error("a report without scales plotted")
	}
	if err := sampleReport().WritePlot(filepath.Join(dir, "x.gif")); err == nil {
		t.Error("an unknown format plotted")
	}
}
