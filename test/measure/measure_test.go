package measure

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // unsorted: 100..1
	}
	for _, tc := range []struct {
		name string
		v    []int
		p    float64
		want int
	}{
		{"empty", nil, 99, 0},
		{"one", []int{7}, 50, 7},
		{"p0 is the smallest", []int{3, 1, 2}, 0, 1},
		{"p100 is the largest", []int{3, 1, 2}, 100, 3},
		{"median of four is the second", []int{4, 3, 2, 1}, 50, 2},
		{"p99 of 100 is the 99th", hundred, 99, 99},
		{"p50 of 100 is the 50th", hundred, 50, 50},
		{"p95 of 20 is the 19th (float noise)", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 95, 19},
		{"p99 of 3 is the largest", []int{1, 2, 3}, 99, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.v, tc.p); got != tc.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.v, tc.p, got, tc.want)
			}
		})
	}
	if got := Percentile([]time.Duration{3 * time.Second, time.Second}, 50); got != time.Second {
		t.Errorf("durations: p50 %v, want 1s", got)
	}
	v := []int{3, 1, 2}
	Percentile(v, 50)
	if v[0] != 3 {
		t.Error("Percentile sorted its argument")
	}
}

func TestParseStat(t *testing.T) {
	// The command holds a space and a ')': fields count after the last one.
	line := "4242 (kube apiserver) (x)) S 17 4242 4242 0 -1 4194560 1000 0 0 0 250 50 30 20 20 0 12 0 100 1000000 500 18446744073709551615\n"
	st, err := ParseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Stat{PPid: 17, CPU: 3 * time.Second, ChildrenCPU: 500 * time.Millisecond}); st != want {
		t.Errorf("ParseStat = %+v, want %+v", st, want)
	}
	for _, bad := range []string{"4242 no command S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 abc 12 13 14 15"} {
		if _, err := ParseStat(bad); err == nil {
			t.Errorf("ParseStat(%q) gave no error", bad)
		}
	}
}

func TestParseStatus(t *testing.T) {
	m, err := ParseStatus("Name:\tx\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nThreads:\t4\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Memory{RSS: 1 << 20, PeakRSS: 2 << 20}); m != want {
		t.Errorf("ParseStatus = %+v, want %+v", m, want)
	}
	for _, bad := range []string{"VmRSS:\t1 kB\n", "VmHWM:\tx kB\nVmRSS:\t1 kB\n"} {
		if _, err := ParseStatus(bad); err == nil {
			t.Errorf("ParseStatus(%q) gave no error", bad)
		}
	}
}

func TestParsePss(t *testing.T) {
	got, err := ParsePss("00400000-7fff [rollup]\nRss:    2000 kB\nPss:     512 kB\nPss_Anon: 100 kB\n")
	if err != nil || got != 512<<10 {
		t.Errorf("ParsePss = %d, %v; want %d", got, err, 512<<10)
	}
	if _, err := ParsePss("Rss: 1 kB\n"); err == nil {
		t.Error("ParsePss without a Pss line gave no error")
	}
}

// TestReadsThisProcess: the readers work on a live /proc.
func TestReadsThisProcess(t *testing.T) {
	m, err := ReadMemory(0)
	if err != nil || m.RSS <= 0 || m.PeakRSS < m.RSS {
		t.Errorf("ReadMemory(self) = %+v, %v", m, err)
	}
}
