package compare

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/shardproxy/shardproxy/test/bench"
	"github.com/shardproxy/shardproxy/test/bench/gen"
)

// Report is a whole run.
type Report struct {
	Started       time.Time     `json:"started"`
	Machine       bench.Machine `json:"machine"`
	Endpoints     int           `json:"endpointsPerService"`
	IPv6Percent   int           `json:"ipv6Percent"`
	Samples       int           `json:"samples"`
	MinSyncPeriod string        `json:"minSyncPeriod"`
	Scales        []ScaleResult `json:"scales"`
}

// ScaleResult is one number of Services, served by each proxy in turn.
type ScaleResult struct {
	Services  int `json:"services"`
	Endpoints int `json:"endpoints"`
	// CreateSeconds is how long creating the objects in the apiserver took.
	CreateSeconds float64     `json:"createSeconds"`
	Upstream      ProxyResult `json:"upstream"`
	Shardproxy    ProxyResult `json:"shardproxy"`
	// Also are the builds of Options.Also, in order.
	Also []ProxyResult `json:"also,omitempty"`
	// ServePercent is Options.ServePercent; Served is shardproxy serving that share of
	// the Services (labelled for its instance, the rest for another proxy), ServedOnly
	// the same in a cluster holding only the share.
	ServePercent int          `json:"servePercent,omitempty"`
	Served       *ProxyResult `json:"served,omitempty"`
	ServedOnly   *ProxyResult `json:"servedOnly,omitempty"`
	// Ratios are shardproxy's figures over upstream's (below 1: shardproxy is better).
	Ratios Ratios `json:"ratios"`
}

// ProxyResult is what one proxy measured.
type ProxyResult struct {
	Proxy string `json:"proxy"`
	// FirstFullSyncSeconds is the duration of the first full sync (kube-proxy: its IPv4
	// proxier, which holds every generated Service).
	FirstFullSyncSeconds float64 `json:"firstFullSyncSeconds"`
	// StartToSyncedSeconds is from starting the process until that sync finished
	// (includes listing the API).
	StartToSyncedSeconds float64 `json:"startToSyncedSeconds"`
	// PartialSyncSeconds is, per one-endpoint change, the partial sync that programmed it.
	PartialSyncSeconds       []float64 `json:"partialSyncSeconds"`
	PartialSyncMedianSeconds float64   `json:"partialSyncMedianSeconds"`
	PartialSyncP90Seconds    float64   `json:"partialSyncP90Seconds"`
	// ProgrammingSeconds is, per change, the network programming latency.
	ProgrammingSeconds       []float64 `json:"networkProgrammingSeconds"`
	ProgrammingMedianSeconds float64   `json:"networkProgrammingMedianSeconds"`
	ProgrammingP90Seconds    float64   `json:"networkProgrammingP90Seconds"`
	PeakRSSMB                float64   `json:"peakRSSMB"`
	// FirstSyncPeakRSSMB is the peak RSS until the first full sync had finished (the
	// initial lists and that sync), read when it had.
	FirstSyncPeakRSSMB float64 `json:"firstSyncPeakRSSMB"`
	// Churn is the churn phase (nil: not run).
	Churn *ChurnResult `json:"churn,omitempty"`
}

// Ratios are shardproxy / upstream.
type Ratios struct {
	FirstFullSync float64 `json:"firstFullSync"`
	StartToSynced float64 `json:"startToSynced"`
	PartialSync   float64 `json:"partialSync"`
	Programming   float64 `json:"networkProgramming"`
	PeakRSS       float64 `json:"peakRSS"`
	ChurnCPU      float64 `json:"churnCPU"`
	// ServedPeakRSS is Served's peak RSS over upstream's (serving every Service), and
	// ServedPeakRSSVsOnly over ServedOnly's (with ServePercent).
	ServedPeakRSS       float64 `json:"servedPeakRSS,omitempty"`
	ServedPeakRSSVsOnly float64 `json:"servedPeakRSSVsOnly,omitempty"`
}

func ratio(ours, theirs float64) float64 {
	if theirs == 0 {
		return 0
	}
	return ours / theirs
}

func (s *ScaleResult) fillRatios() {
	u, o := s.Upstream, s.Shardproxy
	s.Ratios = Ratios{
		FirstFullSync: ratio(o.FirstFullSyncSeconds, u.FirstFullSyncSeconds),
		StartToSynced: ratio(o.StartToSyncedSeconds, u.StartToSyncedSeconds),
		PartialSync:   ratio(o.PartialSyncMedianSeconds, u.PartialSyncMedianSeconds),
		Programming:   ratio(o.ProgrammingMedianSeconds, u.ProgrammingMedianSeconds),
		PeakRSS:       ratio(o.PeakRSSMB, u.PeakRSSMB),
	}
	if s.Served != nil {
		s.Ratios.ServedPeakRSS = ratio(s.Served.PeakRSSMB, u.PeakRSSMB)
		if s.ServedOnly != nil {
			s.Ratios.ServedPeakRSSVsOnly = ratio(s.Served.PeakRSSMB, s.ServedOnly.PeakRSSMB)
		}
	}
	if u.Churn != nil && o.Churn != nil {
		s.Ratios.ChurnCPU = ratio(o.Churn.CPUSecondsPerMinute, u.Churn.CPUSecondsPerMinute)
	}
}

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error { return bench.WriteJSON(path, r) }

// PrintTable prints one block per scale: each figure for both proxies and the ratio.
func PrintTable(w io.Writer, r *Report) {
	fmt.Fprintf(w, "bench-compare: %d cores, kernel %s, %s; %d endpoints per Service, one EndpointSlice each, %d%% of the Services IPv6; min sync period %s; %d one-endpoint changes per proxy\n",
		r.Machine.Cores, r.Machine.Kernel, r.Machine.NFT, r.Endpoints, r.IPv6Percent, r.MinSyncPeriod, r.Samples)
	for _, s := range r.Scales {
		fmt.Fprintf(w, "\n%d Services × %d endpoints (objects created in %.1fs)\n", s.Services, s.Endpoints/max(s.Services, 1), s.CreateSeconds)
		if s.Served != nil {
			fmt.Fprintf(w, "%q: an instance for the %d%% of the Services labelled %s, the rest labelled %s; %q: the same in a cluster holding only that %d%%\n",
				servedName, s.ServePercent, gen.ServedProxyName, gen.OtherProxyName, servedOnlyName, s.ServePercent)
		}
		extra := s.Also
		for _, p := range []*ProxyResult{s.Served, s.ServedOnly} {
			if p != nil {
				extra = append(slices.Clip(extra), *p)
			}
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "\tkube-proxy (nftables)\tshardproxy\tshardproxy / upstream\t")
		for _, a := range extra {
			fmt.Fprintf(tw, "%s\t/ upstream\t", a.Proxy)
		}
		fmt.Fprintln(tw)
		row := func(name, unit string, scale float64, fig func(ProxyResult) float64) {
			u, o := fig(s.Upstream), fig(s.Shardproxy)
			fmt.Fprintf(tw, "%s (%s)\t%.1f\t%.1f\t%.3f\t", name, unit, u*scale, o*scale, ratio(o, u))
			for _, a := range extra {
				fmt.Fprintf(tw, "%.1f\t%.3f\t", fig(a)*scale, ratio(fig(a), u))
			}
			fmt.Fprintln(tw)
		}
		row("first full sync", "ms", 1e3, func(p ProxyResult) float64 { return p.FirstFullSyncSeconds })
		row("start to synced", "ms", 1e3, func(p ProxyResult) float64 { return p.StartToSyncedSeconds })
		row("partial sync, median", "ms", 1e3, func(p ProxyResult) float64 { return p.PartialSyncMedianSeconds })
		row("partial sync, p90", "ms", 1e3, func(p ProxyResult) float64 { return p.PartialSyncP90Seconds })
		row("network programming, median", "ms", 1e3, func(p ProxyResult) float64 { return p.ProgrammingMedianSeconds })
		row("network programming, p90", "ms", 1e3, func(p ProxyResult) float64 { return p.ProgrammingP90Seconds })
		row("peak RSS", "MB", 1, func(p ProxyResult) float64 { return p.PeakRSSMB })
		row("peak RSS by the first full sync", "MB", 1, func(p ProxyResult) float64 { return p.FirstSyncPeakRSSMB })
		if s.Upstream.Churn != nil || s.Shardproxy.Churn != nil {
			churn := func(p ProxyResult) ChurnResult {
				if p.Churn == nil {
					return ChurnResult{}
				}
				return *p.Churn
			}
			row(fmt.Sprintf("CPU under churn (%d / %d changes)", churn(s.Upstream).Changes, churn(s.Shardproxy).Changes), "s/min", 1,
				func(p ProxyResult) float64 { return churn(p).CPUSecondsPerMinute })
			row("network programming under churn, mean", "ms", 1e3, func(p ProxyResult) float64 { return churn(p).ProgrammingMeanSeconds })
		}
		tw.Flush()
		if s.Served != nil && s.ServedOnly != nil {
			fmt.Fprintf(w, "peak RSS, %s / %s: %.3f\n", servedName, servedOnlyName, s.Ratios.ServedPeakRSSVsOnly)
		}
	}
}
