package fleet

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// FitNodes is the fleet size Fit extrapolates to: upstream's scalability limit.
const FitNodes = 5000

// figure is one column Fit fits against N.
type figure struct {
	name string
	of   func(*Result) float64
}

var figures = []figure{
	{"apiserver CPU s/min", func(r *Result) float64 { return r.APIServerCPUPerMinute }},
	{"apiserver RSS MiB", func(r *Result) float64 { return float64(r.APIServerRSS) / (1 << 20) }},
	{"watch events/s", func(r *Result) float64 { return r.Server.WatchEvents.Total() / r.Steady.Seconds() }},
	{"watch KB/s", func(r *Result) float64 { return r.Server.WatchBytes.Total() / 1024 / r.Steady.Seconds() }},
	{"proxy requests/s", func(r *Result) float64 { return r.ProxyRequests.Total() / r.Steady.Seconds() }},
	{"etcd writes/s", func(r *Result) float64 { return r.Server.EtcdWrites.Total() / r.Steady.Seconds() }},
	{"proxy memory MiB", func(r *Result) float64 { return float64(r.ProxyMemory) / (1 << 20) }},
}

// series is one proxy and setting's results, by N.
type series struct {
	label string
	rs    []*Result
}

func group(results []*Result) []series {
	var out []series
	for _, r := range results {
		label := string(r.Proxy)
		if !r.Proxy.Kubemark() {
			label = fmt.Sprintf("%s reserve %s", r.Proxy, r.Reserve())
		}
		i := slices.IndexFunc(out, func(s series) bool { return s.label == label })
		if i < 0 {
			out = append(out, series{label: label})
			i = len(out) - 1
		}
		out[i].rs = append(out[i].rs, r)
	}
	return out
}

// Fit prints, for each proxy and setting measured at two sizes or more, each figure's
// growth per added node (the least-squares slope over the measured N) and its value
// extrapolated to FitNodes two ways: along that line, and along the least-squares
// quadratic where three sizes or more allow one with a non-negative N² term ("-"
// otherwise). Which applies is the reader's call from what drives the figure: watch
// events of the all-Node watch grow as N², most else as N, and three noisy points give
// any figure some curvature. It then prints the ratio of each shardproxy setting's slope
// to each kube-proxy anchor's.
func Fit(results []*Result) string {
	var b bytes.Buffer
	groups := group(results)
	slopes := map[string][]float64{}
	fmt.Fprintf(&b, "\nfit over the measured N: growth per added node; extrapolated to %d nodes\n", FitNodes)
	fmt.Fprintf(&b, "%-28s %-22s %-12s %-14s %s\n", "proxy", "figure", "per node", "line", "quadratic")
	for _, g := range groups {
		if len(g.rs) < 2 {
			continue
		}
		ns := make([]float64, len(g.rs))
		for i, r := range g.rs {
			ns[i] = float64(r.Nodes)
		}
		for _, f := range figures {
			ys := make([]float64, len(g.rs))
			for i, r := range g.rs {
				ys[i] = f.of(r)
			}
			a, slope := line(ns, ys)
			quad := "-"
			if qa, qb, qc, ok := quadratic(ns, ys); ok && qc >= 0 {
				quad = fmt.Sprintf("%.4g", qa+qb*FitNodes+qc*FitNodes*FitNodes)
			}
			slopes[g.label] = append(slopes[g.label], slope)
			fmt.Fprintf(&b, "%-28s %-22s %-12.4g %-14.4g %s\n", g.label, f.name, slope, a+slope*FitNodes, quad)
		}
	}
	for _, anchor := range []Proxy{KubeProxy, KubeProxyNodeWatch} {
		kp, ok := slopes[string(anchor)]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "\nper added node, shardproxy ÷ %s (item 5's goal for the apiserver: ≤ 1.2)\n", anchor)
		for _, g := range groups {
			s, ok := slopes[g.label]
			if !ok || strings.HasPrefix(g.label, string(KubeProxy)) {
				continue
			}
			for i, f := range figures {
				ratio := "n/a"
				if kp[i] > 0 {
					ratio = fmt.Sprintf("%.2f", s[i]/kp[i])
				}
				fmt.Fprintf(&b, "%-28s %-22s %s\n", g.label, f.name, ratio)
			}
		}
	}
	return b.String()
}

// line is the least-squares y = a + b·x.
func line(xs, ys []float64) (a, b float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return sy / n, 0
	}
	b = (n*sxy - sx*sy) / d
	return (sy - b*sx) / n, b
}

// quadratic is the least-squares y = a + b·x + c·x², from three distinct x or more.
func quadratic(xs, ys []float64) (a, b, c float64, ok bool) {
	distinct := slices.Clone(xs)
	slices.Sort(distinct)
	if len(slices.Compact(distinct)) < 3 {
		return 0, 0, 0, false
	}
	var s [5]float64 // Σx^k
	var t [3]float64 // Σy·x^k
	for i, x := range xs {
		p := 1.0
		for k := range 5 {
			s[k] += p
			if k < 3 {
				t[k] += ys[i] * p
			}
			p *= x
		}
	}
	m := [3][4]float64{
		{s[0], s[1], s[2], t[0]},
		{s[1], s[2], s[3], t[1]},
		{s[2], s[3], s[4], t[2]},
	}
	// Gauss-Jordan elimination with partial pivoting.
	for col := range 3 {
		piv := col
		for r := col + 1; r < 3; r++ {
			if abs(m[r][col]) > abs(m[piv][col]) {
				piv = r
			}
		}
		if m[piv][col] == 0 {
			return 0, 0, 0, false
		}
		m[col], m[piv] = m[piv], m[col]
		for r := range 3 {
			if r == col {
				continue
			}
			k := m[r][col] / m[col][col]
			for j := col; j < 4; j++ {
				m[r][j] -= k * m[col][j]
			}
		}
	}
	return m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2], true
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
