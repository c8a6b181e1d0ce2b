package benchutil

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Series is one distribution of a plot panel: values in milliseconds.
type Series struct {
	Name   string
	Values []float64
}

// Panel is one ECDF chart: the share of trials (y) at or below a latency (x,
// logarithmic, milliseconds).
type Panel struct {
	Title  string
	Series []Series
	// Marks are vertical reference lines (a target), labelled.
	Marks map[string]float64
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// ECDFSVG renders panels side by side as a self-contained SVG document.
func ECDFSVG(title string, panels []Panel) string {
	const pw, ph = 520.0, 360.0 // panel size
	const ml, mr, mt, mb = 60.0, 20.0, 50.0, 90.0
	w := float64(len(panels)) * (pw + ml + mr)
	h := ph + mt + mb
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" text-anchor="middle" font-size="15" font-weight="bold">%s</text>`+"\n", w/2, esc(title))
	for pi, p := range panels {
		x0 := float64(pi)*(pw+ml+mr) + ml
		y0 := mt
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, s := range p.Series {
			for _, v := range s.Values {
				if v > 0 {
					lo = math.Min(lo, v)
					hi = math.Max(hi, v)
				}
			}
		}
		for _, m := range p.Marks {
			lo = math.Min(lo, m)
			hi = math.Max(hi, m)
		}
		if math.IsInf(lo, 0) {
			lo, hi = 1, 10
		}
		dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if dhi <= dlo {
			dhi = dlo + 1
		}
		xs := func(v float64) float64 {
			if v <= 0 {
				v = math.Pow(10, dlo)
			}
			return x0 + (math.Log10(v)-dlo)/(dhi-dlo)*pw
		}
		ys := func(q float64) float64 { return y0 + (1-q)*ph }
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" font-size="13">%s</text>`+"\n", x0+pw/2, y0-12, esc(p.Title))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", x0, y0, pw, ph)
		for d := dlo; d <= dhi; d++ {
			for k := 1; k <= 9; k++ {
				v := float64(k) * math.Pow(10, d)
				if math.Log10(v) > dhi+1e-9 {
					break
				}
				x := xs(v)
				stroke := "#eee"
				if k == 1 {
					stroke = "#ccc"
					fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x, y0+ph+16, fmtMs(v))
				}
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s"/>`+"\n", x, y0, x, y0+ph, stroke)
			}
		}
		for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 0.99, 1} {
			y := ys(q)
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+"\n", x0, y, x0+pw, y)
			fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n", x0-4, y+4, q)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">latency (ms, log scale)</text>`+"\n", x0+pw/2, y0+ph+34)
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle" transform="rotate(-90 %.0f %.0f)">share of trials ≤ x</text>`+"\n", x0-40, y0+ph/2, x0-40, y0+ph/2)
		names := make([]string, 0, len(p.Marks))
		for n := range p.Marks {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			x := xs(p.Marks[n])
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#555" stroke-dasharray="5,4"/>`+"\n", x, y0, x, y0+ph)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="11" fill="#555">%s</text>`+"\n", x+3, y0+12, esc(n))
		}
		for si, s := range p.Series {
			vals := append([]float64(nil), s.Values...)
			sort.Float64s(vals)
			color := palette[si%len(palette)]
			var pts []string
			n := float64(len(vals))
			for i, v := range vals {
				x := xs(v)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f %.1f,%.1f", x, ys(float64(i)/n), x, ys(float64(i+1)/n)))
			}
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
			}
			ly := y0 + ph + 52 + float64(si/2)*16
			lx := x0 + float64(si%2)*pw/2
			p50, p99 := Quantile(vals, 0.5), Quantile(vals, 0.99)
			fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/>`+"\n", lx, ly-4, lx+18, ly-4, color)
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f">%s (n=%d, p50 %s, p99 %s ms)</text>`+"\n", lx+22, ly, esc(s.Name), len(vals), fmtMs(p50), fmtMs(p99))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func fmtMs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.3g", v)
	default:
		return fmt.Sprintf("%.2g", v)
	}
}

func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")
	return r.Replace(s)
}
