package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/shardproxy/shardproxy/supervisor/config"
)

// TestConntrackSysctls checks what the supervisor writes for the conntrack settings, with
// upstream kube-proxy's semantics: nf_conntrack_max = maxPerCore × CPUs, at least min, at
// most 1Mi; the hash table raised to max/4 only when max is set; timeouts in seconds; 0
// leaves a setting alone.
func TestConntrackSysctls(t *testing.T) {
	i32 := func(v int32) *int32 { return &v }
	dur := func(d time.Duration) *config.Duration { return &config.Duration{Duration: d} }
	defaults := func() config.Conntrack {
		c := config.Config{}
		c.DefaultWith(func(string) string { return "" }, func() (string, error) { return "node", nil })
		return c.Conntrack
	}
	tests := []struct {
		name      string
		ct        config.Conntrack
		cpus      int
		sysctlErr error
		want      []string
	}{
		{
			name: "defaults on 2 CPUs: min wins over 32768 per core",
			ct:   defaults(), cpus: 2,
			want: []string{
				"net.netfilter.nf_conntrack_max=131072", "hashsize>=32768",
				"net.netfilter.nf_conntrack_tcp_timeout_established=86400",
				"net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600",
			},
		},
		{
			name: "defaults on 8 CPUs: per core wins over min",
			ct:   defaults(), cpus: 8,
			want: []string{
				"net.netfilter.nf_conntrack_max=262144", "hashsize>=65536",
				"net.netfilter.nf_conntrack_tcp_timeout_established=86400",
				"net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600",
			},
		},
		{
			// kube-proxy v1.36.3 writes 1048576 here too, not 32768 × 64 = 2097152
			// (pkg/proxy/conntrack/sysctls.go, TestGetConntrackMax_Capped).
			name: "defaults on 64 CPUs: capped at 1Mi",
			ct:   defaults(), cpus: 64,
			want: []string{
				"net.netfilter.nf_conntrack_max=1048576", "hashsize>=262144",
				"net.netfilter.nf_conntrack_tcp_timeout_established=86400",
				"net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600",
			},
		},
		{
			name: "defaults on 32 CPUs: exactly the cap, written as it is",
			ct:   defaults(), cpus: 32,
			want: []string{
				"net.netfilter.nf_conntrack_max=1048576", "hashsize>=262144",
				"net.netfilter.nf_conntrack_tcp_timeout_established=86400",
				"net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600",
			},
		},
		{
			name: "a min above the cap wins while per core stays under it",
			ct:   config.Conntrack{MaxPerCore: i32(1000), Min: i32(2_000_000)}, cpus: 64,
			want: []string{"net.netfilter.nf_conntrack_max=2000000", "hashsize>=500000"},
		},
		{
			name: "many CPUs are capped at 1Mi, above min too",
			ct:   config.Conntrack{MaxPerCore: i32(32768), Min: i32(2_000_000)}, cpus: 64,
			want: []string{"net.netfilter.nf_conntrack_max=1048576", "hashsize>=262144"},
		},
		{
			name: "no min: per core alone",
			ct:   config.Conntrack{MaxPerCore: i32(1000)}, cpus: 3,
			want: []string{"net.netfilter.nf_conntrack_max=3000", "hashsize>=750"},
		},
		{
			name: "maxPerCore 0 leaves max and the hash table alone, whatever min says",
			ct:   config.Conntrack{MaxPerCore: i32(0), Min: i32(131072), TCPEstablishedTimeout: dur(time.Hour)}, cpus: 4,
			want: []string{"net.netfilter.nf_conntrack_tcp_timeout_established=3600"},
		},
		{
			name: "zero timeouts leave them alone",
			ct: config.Conntrack{MaxPerCore: i32(0), TCPEstablishedTimeout: dur(0), TCPCloseWaitTimeout: dur(0),
				UDPTimeout: dur(0), UDPStreamTimeout: dur(0)},
			cpus: 4,
		},
		{
			name: "UDP timeouts in whole seconds",
			ct:   config.Conntrack{UDPTimeout: dur(30 * time.Second), UDPStreamTimeout: dur(2*time.Minute + 500*time.Millisecond)},
			cpus: 4,
			want: []string{"net.netfilter.nf_conntrack_udp_timeout=30", "net.netfilter.nf_conntrack_udp_timeout_stream=120"},
		},
		{
			name: "a max that cannot be written leaves the hash table alone and the rest goes on",
			ct:   config.Conntrack{MaxPerCore: i32(32768), TCPCloseWaitTimeout: dur(time.Hour)}, cpus: 4,
			sysctlErr: errors.New("read-only file system"),
			want:      []string{"net.netfilter.nf_conntrack_max=131072", "net.netfilter.nf_conntrack_tcp_timeout_close_wait=3600"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			s := &Supervisor{cfg: &config.Config{Conntrack: tc.ct}, logger: klog.Background(), deps: Deps{
				NumCPU: func() int { return tc.cpus },
				Sysctl: func(name, value string) error {
					got = append(got, name+"="+value)
					return tc.sysctlErr
				},
				ConntrackHashsize: func(buckets int) error {
					got = append(got, "hashsize>="+strconv.Itoa(buckets))
					return nil
				},
			}}
			s.setConntrackSysctls()
			if !slices.Equal(got, tc.want) {
				t.Errorf("writes:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestRaiseHashsize(t *testing.T) {
	for _, tc := range []struct {
		name         string
		cur, buckets int
		want         string
	}{
		{"smaller table is raised", 16384, 32768, "32768"},
		{"larger table is never shrunk", 65536, 32768, "65536"},
		{"equal table is left", 32768, 32768, "32768"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hashsize")
			if err := os.WriteFile(path, []byte(strconv.Itoa(tc.cur)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := raiseHashsize(path, tc.buckets); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(path)
			if got := string(b); got != tc.want && got != tc.want+"\n" {
				t.Errorf("hashsize %q, want %s", got, tc.want)
			}
		})
	}
	if err := raiseHashsize(filepath.Join(t.TempDir(), "missing"), 1); err == nil {
		t.Error("a missing hashsize file is not an error")
	}
}

func TestNumCPU(t *testing.T) {
	for _, tc := range []struct {
		online string
		want   int
	}{
		{"0-3\n", 4},
		{"0\n", 1},
		{"0-3,6,8-9\n", 7},
		{"garbage\n", runtime.NumCPU()},
	} {
		path := filepath.Join(t.TempDir(), "online")
		if err := os.WriteFile(path, []byte(tc.online), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := numCPU(path); got != tc.want {
			t.Errorf("numCPU(%q) = %d, want %d", tc.online, got, tc.want)
		}
	}
	if got := numCPU(filepath.Join(t.TempDir(), "missing")); got != runtime.NumCPU() {
		t.Errorf("without the file: %d, want runtime.NumCPU() %d", got, runtime.NumCPU())
	}
}
