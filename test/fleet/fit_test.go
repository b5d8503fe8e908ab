package fleet

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestLineAndQuadratic(t *testing.T) {
	for _, tc := range []struct {
		name          string
		xs, ys        []float64
		a, b, c       float64
		quadraticFits bool
	}{
		{"a line", []float64{50, 100, 200}, []float64{10, 20, 40}, 0, 0.2, 0, true},
		{"N squared", []float64{50, 100, 200}, []float64{2500, 10000, 40000}, 0, 0, 1, true},
		{"two sizes fit a line only", []float64{100, 300}, []float64{5, 7}, 4, 0.01, 0, false},
		{"a repeated size is one size", []float64{100, 100, 300}, []float64{5, 5, 7}, 4, 0.01, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, c, ok := quadratic(tc.xs, tc.ys)
			if ok != tc.quadraticFits {
				t.Fatalf("quadratic fits: %t, want %t", ok, tc.quadraticFits)
			}
			if !ok {
				a, b = line(tc.xs, tc.ys)
			}
			for _, v := range []struct{ got, want float64 }{{a, tc.a}, {b, tc.b}, {c, tc.c}} {
				if math.Abs(v.got-v.want) > 1e-6 {
					t.Errorf("a, b, c = %g, %g, %g; want %g, %g, %g", a, b, c, tc.a, tc.b, tc.c)
					break
				}
			}
		})
	}
}

// TestFit fits two proxies at three sizes: kube-proxy's CPU grows 0.01 s/min per node,
// shardproxy's 0.012: the ratio is 1.20, and shardproxy's N² watch events extrapolate
// as N².
func TestFit(t *testing.T) {
	var rs []*Result
	for _, n := range []int{50, 100, 200} {
		nf := float64(n)
		rs = append(rs,
			&Result{Proxy: KubeProxy, Nodes: n, Steady: time.Second, APIServerCPUPerMinute: 1 + 0.01*nf,
				Server: APIServerCounters{WatchEvents: Counts{"nodes": nf}}},
			&Result{Proxy: Shardproxy, Nodes: n, ReserveOtherNodeAddresses: true, Steady: time.Second, APIServerCPUPerMinute: 1 + 0.012*nf,
				Server: APIServerCounters{WatchEvents: Counts{"nodes": nf * nf / 30}}})
	}
	out := Fit(rs)
	for _, want := range []string{
		"kube-proxy                   apiserver CPU s/min    0.01         51             51\n",
		"shardproxy reserve true      watch events/s         ",
		"8.333e+05\n", // 5000²/30 along the quadratic
		"shardproxy reserve true      apiserver CPU s/min    1.20",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("fit lacks %q:\n%s", want, out)
		}
	}
}
