package compare

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// WritePlot draws the report's scales as two panels side by side, first full sync and
// peak RSS against Services (logarithmic Services axis; logarithmic sync axis, as
// upstream's and ours are orders of magnitude apart), one line per proxy. The format
// follows the path's extension: .svg or .png.
func (r *Report) WritePlot(path string) error {
	if len(r.Scales) == 0 {
		return fmt.Errorf("plot %s: no scales measured", path)
	}
	syncPlot, err := r.panel("First full sync", "seconds", true, func(p ProxyResult) float64 { return p.FirstFullSyncSeconds })
	if err != nil {
		return err
	}
	rssPlot, err := r.panel("Peak RSS", "MB", false, func(p ProxyResult) float64 { return p.PeakRSSMB })
	if err != nil {
		return err
	}
	const w, h = 10 * vg.Inch, 4 * vg.Inch
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg":
		c := vgsvg.New(w, h)
		drawPanels(c, syncPlot, rssPlot)
		return writeTo(path, c)
	case ".png":
		c := vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
		drawPanels(c, syncPlot, rssPlot)
		return writeTo(path, c)
	default:
		return fmt.Errorf("plot %s: extension %q, want .svg or .png", path, ext)
	}
}

// panel is one figure against Services for both proxies; a proxy not measured
// (bench-compare -only) has no line.
func (r *Report) panel(title, unit string, logY bool, value func(ProxyResult) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "Services"
	p.Y.Label.Text = unit
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	var lines []any
	for _, proxy := range []struct {
		name string
		get  func(ScaleResult) ProxyResult
	}{
		{"kube-proxy (nftables)", func(s ScaleResult) ProxyResult { return s.Upstream }},
		{"shardproxy", func(s ScaleResult) ProxyResult { return s.Shardproxy }},
	} {
		var pts plotter.XYs
		for _, s := range r.Scales {
			if v := value(proxy.get(s)); v > 0 { // 0: not measured; a log axis cannot show it
				pts = append(pts, plotter.XY{X: float64(s.Services), Y: v})
			}
		}
		if len(pts) > 0 {
			lines = append(lines, proxy.name, pts)
		}
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, fmt.Errorf("plotting %s: %w", title, err)
	}
	return p, nil
}

// drawPanels lays the plots out in one row on c.
func drawPanels(c vg.CanvasSizer, plots ...*plot.Plot) {
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 8}
	cells := plot.Align([][]*plot.Plot{plots}, tiles, draw.New(c))
	for i, p := range plots {
		p.Draw(cells[0][i])
	}
}

// writeTo writes an image canvas to path, creating its directory.
func writeTo(path string, c io.WriterTo) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return f.Close()
}
