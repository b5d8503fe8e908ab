package legacy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeProc is a /proc with fake processes; sameNetns ones link ns/net to this process's
// namespace, the others have a file of their own there (a different inode).
type fakeProc struct {
	t    *testing.T
	root string
}

func newFakeProc(t *testing.T) *fakeProc {
	return &fakeProc{t: t, root: emptyProc(t)}
}

func (p *fakeProc) add(pid int, comm string, argv []string, sameNetns bool) {
	p.t.Helper()
	dir := filepath.Join(p.root, fmt.Sprint(pid))
	must := func(err error) {
		if err != nil {
			p.t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "ns"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(argv, "\x00")+"\x00"), 0o644))
	if sameNetns {
		must(os.Symlink("/proc/self/ns/net", filepath.Join(dir, "ns", "net")))
	} else {
		must(os.WriteFile(filepath.Join(dir, "ns", "net"), nil, 0o644))
	}
}

func TestFindKubeProxy(t *testing.T) {
	p := newFakeProc(t)
	p.add(100, "kube-proxy", []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf"}, true)
	p.add(101, "kube-proxy-v1.3", []string{"/root/.cache/shardproxy/bin/kube-proxy-v1.36.3", "--proxy-mode=iptables"}, true)
	p.add(102, "kube-proxy", []string{"kube-proxy"}, false) // another network namespace
	p.add(103, "shardproxy", []string{"shardproxy", "cleanup", "--legacy", "iptables"}, true)
	p.add(104, "grep", []string{"grep", "kube-proxy"}, true)
	p.add(105, "exe", []string{"/opt/bin/kube-proxy", "--v=2"}, true) // comm of a re-executed binary
	p.add(106, "kube-proxyfoo", []string{"kube-proxyfoo"}, true)
	// 107 exited between the directory listing and the namespace check.
	if err := os.MkdirAll(filepath.Join(p.root, "107"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.root, "107", "comm"), []byte("kube-proxy\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	got, err := FindKubeProxy(p.root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{
		{PID: 100, Cmdline: "/usr/local/bin/kube-proxy --config=/var/lib/kube-proxy/config.conf"},
		{PID: 101, Cmdline: "/root/.cache/shardproxy/bin/kube-proxy-v1.36.3 --proxy-mode=iptables"},
		{PID: 105, Cmdline: "/opt/bin/kube-proxy --v=2"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("FindKubeProxy (-want +got):\n%s", diff)
	}
}

func TestProbeKubeProxy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"kube-proxy answers its mode", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/proxyMode" {
				fmt.Fprint(w, "iptables")
				return
			}
			http.NotFound(w, r)
		}, "iptables"},
		{"shardproxy's metrics server has no /proxyMode", http.NotFound, ""},
		{"something else answering 200", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "<html>hello</html>") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			if got := ProbeKubeProxy(context.Background(), strings.TrimPrefix(srv.URL, "http://")); got != tc.want {
				t.Errorf("ProbeKubeProxy = %q, want %q", got, tc.want)
			}
		})
	}
	if got := ProbeKubeProxy(context.Background(), "127.0.0.1:1"); got != "" {
		t.Errorf("nothing listening: %q", got)
	}
}

func TestCleanupRefusesWhileKubeProxyRuns(t *testing.T) {
	for _, tc := range []struct {
		name    string
		procs   func(*fakeProc)
		probe   string
		force   bool
		wantErr string // "" for success
	}{
		{
			name:    "a kube-proxy process in this network namespace",
			procs:   func(p *fakeProc) { p.add(4242, "kube-proxy", []string{"kube-proxy", "--v=2"}, true) },
			wantErr: "kube-proxy is still running on this node: pid 4242 (kube-proxy --v=2)",
		},
		{
			name:    "kube-proxy answering on its metrics address (no hostPID)",
			probe:   "ipvs",
			wantErr: "a kube-proxy in ipvs mode answers on 127.0.0.1:10249",
		},
		{
			name:  "--force goes on",
			procs: func(p *fakeProc) { p.add(4242, "kube-proxy", []string{"kube-proxy"}, true) },
			force: true,
		},
		{
			name:  "a kube-proxy in another network namespace does not count",
			procs: func(p *fakeProc) { p.add(4242, "kube-proxy", []string{"kube-proxy"}, false) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeProc(t)
			if tc.procs != nil {
				tc.procs(p)
			}
			f := newFake(map[Tool]string{"iptables-nft": fixture(t)})
			var out bytes.Buffer
			err := Cleanup(context.Background(), Options{
				Mode: ModeIPTables, Force: tc.force, Exec: f, Out: &out, ProcRoot: p.root,
				Probe: func(context.Context, string) string { return tc.probe },
			})
			if tc.wantErr != "" {
				var re *RunningError
				if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--force") {
					t.Fatalf("err = %v, want a RunningError with %q", err, tc.wantErr)
				}
				if len(f.restores) != 0 {
					t.Error("refused, yet restored")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(f.restores) == 0 {
				t.Error("nothing cleaned up")
			}
			if tc.force && !strings.Contains(out.String(), "warning: kube-proxy is still running on this node: pid 4242") {
				t.Errorf("no warning under --force:\n%s", out.String())
			}
		})
	}
}
