package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Targets of issue 6, at 10,000 Services × 10 endpoints unless said otherwise.
const (
	targetPartialMS      = 20  // one changed endpoint, median
	targetPartialGrowth  = 1.5 // one changed endpoint, 30k over 1k
	targetFullSeconds    = 6
	targetFullOverFloor  = 1.3
	targetExtraInstance  = 15 // MB per extra instance
	targetPacketFlatness = 1.2
	targetScale          = 10000
	// targetModePartial bounds another load-balancing mode's partial sync (1 endpoint,
	// median) against the reference mode's at targetScale (issue 14).
	targetModePartial = 2
)

// upstream is kube-proxy v1.36.3 in nftables mode on the same machine type.
var upstream = map[int]struct{ full, partial, rss float64 }{
	1000:  {full: 0.39, partial: 0.250, rss: 99},
	10000: {full: 31, partial: 5.5, rss: 487},
}

// evaluate fills the report's checks and upstream comparisons from its figures.
//
// The targets of issue 6 are checked on the first mode measured (the reference); the
// other modes' partial syncs are checked against it (issue 14).
func evaluate(rep *Report) {
	rep.Checks, rep.Upstream = nil, nil
	check := func(name string, value, target float64, unit string) {
		rep.Checks = append(rep.Checks, Check{Name: name, Value: value, Target: target, Unit: unit, Pass: value <= target})
	}
	all := rep.Scales
	var ref []ScaleResult
	for _, s := range all {
		if s.Mode == all[0].Mode {
			ref = append(ref, s)
		}
	}
	for _, s := range all {
		if r := scaleOf(ref, s.Services); r != nil && s.Mode != r.Mode && s.Services == targetScale {
			check(fmt.Sprintf("10k %s: partial sync, 1 endpoint changed, median / %s's", s.Mode, r.Mode),
				s.Partial[0].MedianMS/r.Partial[0].MedianMS, targetModePartial, "×")
		}
	}
	evaluateScales(rep, ref, check)
}

// scaleOf returns the result for n Services among scales, or nil.
func scaleOf(scales []ScaleResult, n int) *ScaleResult {
	for i := range scales {
		if scales[i].Services == n {
			return &scales[i]
		}
	}
	return nil
}

// evaluateScales checks issue 6's targets on the scales of one mode.
func evaluateScales(rep *Report, scales []ScaleResult, check func(name string, value, target float64, unit string)) {
	by := map[int]*ScaleResult{}
	for i := range scales {
		by[scales[i].Services] = &scales[i]
	}
	if s := by[targetScale]; s != nil {
		check("10k: partial sync, 1 endpoint changed, median", s.Partial[0].MedianMS, targetPartialMS, "ms")
		check("10k: full sync", s.Full.Seconds, targetFullSeconds, "s")
		if s.FullOverFloor > 0 {
			check("10k: full sync / nft -f of the final ruleset", s.FullOverFloor, targetFullOverFloor, "×")
		}
		if s.Multi != nil {
			check(fmt.Sprintf("10k: memory per extra instance (%d × 2.5k vs 1 × 10k, peak RSS)", s.Multi.Instances),
				s.ExtraInstanceMB, targetExtraInstance, "MB")
		}
	}
	if len(scales) > 1 {
		lo, hi := &scales[0], &scales[0]
		for i := range scales {
			s := &scales[i]
			if s.Services < lo.Services {
				lo = s
			}
			if s.Services > hi.Services {
				hi = s
			}
		}
		if lo != hi {
			check(fmt.Sprintf("partial sync (1 endpoint) at %s / at %s", short(hi.Services), short(lo.Services)),
				hi.Partial[0].MedianMS/lo.Partial[0].MedianMS, targetPartialGrowth, "×")
		}
	}
	if len(rep.Packet) > 1 {
		lo, hi := rep.Packet[0], rep.Packet[len(rep.Packet)-1]
		// What the Service adds over dialing the pod directly through the same node.
		check(fmt.Sprintf("connect latency to a ClusterIP at %s / at %s Services (flat; our threshold)", short(hi.Services), short(lo.Services)),
			hi.ServiceMedianUS/lo.ServiceMedianUS, targetPacketFlatness, "×")
	}
	for _, s := range scales {
		u, ok := upstream[s.Services]
		if !ok {
			continue
		}
		rep.Upstream = append(rep.Upstream,
			UpstreamComparison{Services: s.Services, Figure: "full sync", Ours: s.Full.Seconds, Upstream: u.full, Unit: "s"},
			UpstreamComparison{Services: s.Services, Figure: "partial sync (1 endpoint, median)", Ours: s.Partial[0].MedianMS / 1000, Upstream: u.partial, Unit: "s"},
			UpstreamComparison{Services: s.Services, Figure: "peak RSS", Ours: s.Memory.PeakRSSMB, Upstream: u.rss, Unit: "MB"})
	}
}

func short(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// PrintTable writes the human-readable report.
func PrintTable(w io.Writer, rep *Report) {
	m := rep.Machine
	fmt.Fprintf(w, "shardproxy bench: %d cores, kernel %s, %s, %s; %d endpoints per Service; one instance, both families (IPv4 Services)\n",
		m.Cores, m.Kernel, m.NFT, m.Go, rep.Endpoints)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	section := func(title string) {
		tw.Flush()
		fmt.Fprintf(w, "\n%s\n", title)
	}
	section("Full sync (first, into an empty namespace) vs nft -f of the same final ruleset (floor) and of the full sync's own scripts (script floor)")
	fmt.Fprintln(tw, "services\tmode\tfull s\tof which nft s\tfloor nft -f s\tfull/floor\tscript floor s\tfull/script floor\ttx ops\telements\ttx MB\tresync s\t")
	for _, s := range rep.Scales {
		fmt.Fprintf(tw, "%d\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%d\t%d\t%.1f\t%.2f\t\n", s.Services, s.Mode, s.Full.Seconds, s.Full.NFTSeconds,
			s.Floor.Seconds, s.FullOverFloor, s.ScriptFloor.Seconds, s.FullOverScriptFloor, s.Full.Operations, s.Full.Elements,
			float64(s.Full.TxBytes)/(1<<20), s.Resync.Seconds)
	}

	section("Partial syncs: median ms [p90] (median ms in nft / in netlink transactions; median CPU ms user+sys), operations, family syncs over netlink, GCs")
	if len(rep.Scales) > 0 {
		var hdr []string
		for _, p := range rep.Scales[0].Partial {
			hdr = append(hdr, p.Name)
		}
		fmt.Fprintf(tw, "services\tmode\t%s\t\n", strings.Join(hdr, "\t"))
	}
	for _, s := range rep.Scales {
		var cells []string
		for _, p := range s.Partial {
			cells = append(cells, fmt.Sprintf("%.2f [%.2f] (%.2f / %.2f; %.2f+%.2f), %d ops, %d/%d nl, %d gc", p.MedianMS, p.P90MS, p.NFTMedianMS,
				p.NetlinkMedianMS, p.UserMedianMS, p.SysMedianMS, p.Operations, p.NetlinkSyncs, 2*p.Samples, p.GCs))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t\n", s.Services, s.Mode, strings.Join(cells, "\t"))
	}

	section("Memory after the full sync (MiB)")
	fmt.Fprintln(tw, "services\tmode\tobjects only RSS\tRSS\tpeak RSS\tGo heap in use\tpeak RSS after resync\tpeak RSS at end\t")
	for _, s := range rep.Scales {
		mm := s.Memory
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", s.Services, s.Mode, mm.ObjectsRSSMB, mm.RSSMB, mm.PeakRSSMB, mm.HeapInuseMB,
			mm.ResyncPeakRSSMB, mm.EndPeakRSSMB)
	}

	if len(rep.Scales) > 0 && rep.Scales[0].Multi != nil {
		k := rep.Scales[0].Multi.Instances
		section(fmt.Sprintf("Multi-instance: %d instances × N/%d Services vs 1 × N, in one process (first full syncs at once)", k, k))
		fmt.Fprintf(tw, "services\t1× full s\t%d× wall s\t1× peak RSS\t%d× peak RSS\t1× heap\t%d× heap\tper extra instance MB\t\n", k, k, k)
		for _, s := range rep.Scales {
			if s.Multi == nil {
				continue
			}
			fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t\n", s.Services, s.Full.Seconds, s.Multi.WallSeconds,
				s.Memory.PeakRSSMB, s.Multi.Memory.PeakRSSMB, s.Memory.HeapInuseMB, s.Multi.Memory.HeapInuseMB, s.ExtraInstanceMB)
		}
	}

	if len(rep.Packet) > 0 {
		section("Per-packet cost: TCP connect pod2 -> ClusterIP -> pod1 through the node, µs")
		fmt.Fprintln(tw, "services\tconnections\tClusterIP median\tp90\tpod IP median\tp90\t")
		for _, p := range rep.Packet {
			fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t\n", p.Services, p.Conns, p.ServiceMedianUS, p.ServiceP90US, p.DirectMedianUS, p.DirectP90US)
		}
	}

	section("Targets (issue 6; other load-balancing modes against the first, issue 14)")
	fmt.Fprintln(tw, "check\tvalue\ttarget\t\t")
	for _, c := range rep.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%.2f %s\t≤ %.4g %s\t%s\t\n", c.Name, c.Value, c.Unit, c.Target, c.Unit, verdict)
	}

	if len(rep.Upstream) > 0 {
		section("Against upstream kube-proxy (nftables mode, same machine type)")
		fmt.Fprintln(tw, "services\tfigure\tshardproxy\tupstream\tupstream/ours\t")
		for _, u := range rep.Upstream {
			fmt.Fprintf(tw, "%d\t%s\t%.3g %s\t%.3g %s\t%.1f×\t\n", u.Services, u.Figure, u.Ours, u.Unit, u.Upstream, u.Unit, u.Upstream/u.Ours)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\n(%.0f s in all)\n", rep.Seconds)
}
