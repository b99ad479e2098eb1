package simulate

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// This file draws the runs as SVG, by hand: a few polylines per panel,
// downsampled so that a plot stays in the tens of kilobytes.

// plotPoints caps the points of one series.
const plotPoints = 300

// Colours of the series, fixed so that plots compare across runs.
const (
	colQueued   = "#1f77b4"
	colReceived = "#2ca02c"
	colRejected = "#d62728"
	colFirst    = "#9467bd"
	colLatency  = "#ff7f0e"
	colRequests = "#1f77b4"
	colCalls    = "#2ca02c"
	colAttempts = "#bcbd22"
	colDelayed  = "#9467bd"
	colTimeout  = "#d62728"
)

// panel is one chart: a plot area in pixels, an x range [0, xmax] and a y
// scale, linear from 0 to ymax or logarithmic from ymin to ymax.
type panel struct {
	x, y, w, h int
	title      string
	xmax       float64
	xunit      string
	ymin, ymax float64
	log        bool
}

func (p panel) px(x float64) float64 { return float64(p.x) + x/p.xmax*float64(p.w) }

// py maps v to a pixel row, clamped to the plot area.
func (p panel) py(v float64) float64 {
	var f float64
	if p.log {
		f = (math.Log10(math.Max(v, p.ymin)) - math.Log10(p.ymin)) / (math.Log10(p.ymax) - math.Log10(p.ymin))
	} else {
		f = v / p.ymax
	}
	if math.IsNaN(f) {
		f = 0
	}
	f = math.Min(math.Max(f, 0), 1)
	return float64(p.y+p.h) - f*float64(p.h)
}

// frame draws the axes, the title and tick labels.
func (p panel) frame(b *bytes.Buffer) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" class="f"/>`+"\n", p.x, p.y, p.w, p.h)
	fmt.Fprintf(b, `<text x="%d" y="%d" class="t">%s</text>`+"\n", p.x, p.y-5, html.EscapeString(p.title))
	for _, v := range p.yticks() {
		y := int(math.Round(p.py(v)))
		fmt.Fprintf(b, `<text x="%d" y="%d" class="a" text-anchor="end">%s</text>`, p.x-3, y+3, short(v))
		fmt.Fprintf(b, `<path d="M%d %dh%d" class="g"/>`+"\n", p.x, y, p.w)
	}
	step := niceStep(p.xmax / 5)
	for v := 0.0; v <= p.xmax+step/1e6; v += step {
		x := int(math.Round(p.px(v)))
		fmt.Fprintf(b, `<text x="%d" y="%d" class="a" text-anchor="middle">%s</text>`, x, p.y+p.h+11, short(v))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" class="a" text-anchor="end">%s</text>`+"\n", p.x+p.w, p.y+p.h+21, p.xunit)
}

func (p panel) yticks() []float64 {
	if p.log {
		var ts []float64
		for e := math.Ceil(math.Log10(p.ymin) - 1e-9); e <= math.Log10(p.ymax)+1e-9; e++ {
			v := math.Pow(10, e)
			ts = append(ts, v)
		}
		return ts
	}
	step := niceStep(p.ymax / 3)
	var ts []float64
	for v := 0.0; v <= p.ymax*1.0001; v += step {
		ts = append(ts, v)
	}
	return ts
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if !(x > 0) {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= x {
			return m * e
		}
	}
	return 10 * e
}

// short formats an axis value: 0.1, 5, 250, 3k, 1.5M.
func short(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	case a >= 1:
		return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

// line draws ys[i] at x = i*dx as a path of relative moves in whole
// pixels (the rounding error is carried, not accumulated). On a log
// scale a zero has no place: the line breaks there instead of dropping
// to the axis floor, where it would read as a small value.
func (p panel) line(b *bytes.Buffer, ys []float64, dx float64, color string, dashed bool) {
	class := "l"
	if dashed {
		class = "d"
	}
	var d strings.Builder
	var cx, cy int
	open, alone := false, false // a segment is open; its only point so far is its start
	for i, v := range ys {
		if p.log && !(v > 0) {
			if alone {
				d.WriteString("h1") // a point between two gaps, shown as a dot
			}
			open, alone = false, false
			continue
		}
		x, y := int(math.Round(p.px(float64(i)*dx))), int(math.Round(p.py(v)))
		switch {
		case !open:
			fmt.Fprintf(&d, "M%d %d", x, y)
			open, alone = true, true
		case x != cx || y != cy:
			d.WriteString("l")
			d.WriteString(strconv.Itoa(x - cx))
			if y-cy >= 0 {
				d.WriteByte(' ')
			}
			d.WriteString(strconv.Itoa(y - cy))
			alone = false
		}
		cx, cy = x, y
	}
	if alone {
		d.WriteString("h1")
	}
	if d.Len() == 0 {
		return
	}
	fmt.Fprintf(b, `<path class="%s" stroke="%s" d="%s"/>`+"\n", class, color, d.String())
}

// band shades the x range [from, to]. Its label goes above the panel's
// top right corner, where a band however narrow cannot cut it off.
func (p panel) band(b *bytes.Buffer, from, to float64, label string) {
	x0, x1 := p.px(math.Max(from, 0)), p.px(math.Min(to, p.xmax))
	if x1 <= x0 {
		return
	}
	fmt.Fprintf(b, `<rect x="%.0f" y="%d" width="%.0f" height="%d" class="b"/>`, x0, p.y, x1-x0, p.h)
	if label != "" {
		fmt.Fprintf(b, `<text x="%d" y="%d" class="a" text-anchor="end">%s</text>`, p.x+p.w, p.y-5, html.EscapeString(label))
	}
	b.WriteString("\n")
}

// plural writes a count with its noun: "1 queue", "370 queues".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// legend writes coloured names from x, y rightwards.
func legend(b *bytes.Buffer, x, y int, entries ...string) {
	for i := 0; i+1 < len(entries); i += 2 {
		name, color := entries[i], entries[i+1]
		fmt.Fprintf(b, `<path d="M%d %dh12" stroke="%s" stroke-width="2"/><text x="%d" y="%d" class="a">%s</text>`,
			x, y-3, color, x+15, y, html.EscapeString(name))
		x += 22 + 6*len(name)
	}
	b.WriteString("\n")
}

func header(b *bytes.Buffer, w, h int, title, subtitle string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", w, h, w, h)
	b.WriteString(`<style>.f{fill:#fff;stroke:#999}.g{stroke:#eee}.t{font-size:12px;font-weight:bold}.a{font-size:9px;fill:#444}` +
		`.l{fill:none;stroke-width:1.2}.d{fill:none;stroke-width:1.2;stroke-dasharray:4 3}.b{fill:#f3e0e0}</style>` + "\n")
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="#fafafa"/>`+"\n", w, h)
	fmt.Fprintf(b, `<text x="10" y="18" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	fmt.Fprintf(b, `<text x="10" y="33" class="a">%s</text>`+"\n", html.EscapeString(subtitle))
}

// downsample reduces xs to at most n points, each the mean (or the max)
// of a run of consecutive values; it returns the points and how many
// values each stands for.
func downsample(xs []float64, n int, useMax bool) ([]float64, int) {
	per := max(1, (len(xs)+n-1)/n)
	out := make([]float64, 0, (len(xs)+per-1)/per)
	for i := 0; i < len(xs); i += per {
		run := xs[i:min(i+per, len(xs))]
		v := run[0]
		if useMax {
			for _, x := range run {
				v = math.Max(v, x)
			}
		} else {
			v = 0
			for _, x := range run {
				v += x
			}
			v /= float64(len(run))
		}
		out = append(out, v)
	}
	return out, per
}

// writeBurstSVG draws each run as one row of two panels: the service's
// view per tick (requests it holds, received, rejected, first requests; a
// logarithmic scale, means over runs of ticks) and the clients' view
// (every client's latency and requests sent, clients sorted by latency;
// clients never answered are shaded). c is the configuration of the runs.
func writeBurstSVG(w io.Writer, c burstConfig, runs []burstResult) error {
	const width, rowH, top = 900, 190, 60
	var b bytes.Buffer
	header(&b, width, top+rowH*len(runs)+10,
		fmt.Sprintf("rebound simulate burst: %d clients, %d%% at tick 0, service %d×%d ticks, overwhelmed past %d (seed %d)",
			c.Clients, int(math.Round(c.Spike*100)), c.Capacity, c.ServiceTicks, c.Overwhelmed, c.Seed),
		"Left: the service per tick (log scale, zeros left out; each point the mean of 10 ticks). Right: each client, sorted by latency (log scale).")
	legend(&b, 60, 50, "held", colQueued, "received", colReceived, "rejected", colRejected, "first requests", colFirst)
	legend(&b, 560, 50, "latency (ticks)", colLatency, "requests sent", colRequests)
	for i, r := range runs {
		y := top + 20 + i*rowH
		s := r.Summary
		server := panel{x: 50, y: y, w: 470, h: rowH - 50, xmax: float64(len(r.Ticks)), xunit: "tick",
			ymin: 0.1, ymax: 1000, log: true,
			title: fmt.Sprintf("%s: %d requests, %d rejected, aftershock index %.1f", s.Strategy, s.Requests, s.Rejected, s.Aftershocks)}
		server.frame(&b)
		series := func(f func(burstTick) int) []float64 {
			xs := make([]float64, len(r.Ticks))
			for j, t := range r.Ticks {
				xs[j] = float64(f(t))
			}
			return xs
		}
		for _, sr := range []struct {
			f     func(burstTick) int
			color string
		}{
			{func(t burstTick) int { return t.Queued }, colQueued},
			{func(t burstTick) int { return t.Received }, colReceived},
			{func(t burstTick) int { return t.Rejected }, colRejected},
			{func(t burstTick) int { return t.First }, colFirst},
		} {
			pts, per := downsample(series(sr.f), plotPoints, false)
			server.line(&b, pts, float64(per), sr.color, false)
		}

		clients := panel{x: 560, y: y, w: 320, h: rowH - 50, xmax: float64(len(r.Clients)), xunit: "clients by latency",
			ymin: 1, ymax: math.Max(1000, float64(len(r.Ticks))), log: true,
			title: fmt.Sprintf("%s: %d of %d answered", s.Strategy, s.Completed, s.Clients)}
		clients.frame(&b)
		if s.Completed < len(r.Clients) {
			clients.band(&b, float64(s.Completed), float64(len(r.Clients)), "shaded: "+strconv.Itoa(len(r.Clients)-s.Completed)+" never answered")
		}
		lat := make([]float64, 0, s.Completed)
		req := make([]float64, len(r.Clients))
		for j, cl := range r.Clients {
			if cl.Latency >= 0 {
				lat = append(lat, float64(cl.Latency))
			}
			req[j] = float64(cl.Requests)
		}
		pts, per := downsample(req, plotPoints/2, true)
		clients.line(&b, pts, float64(per), colRequests, false)
		pts, per = downsample(lat, plotPoints/2, true)
		clients.line(&b, pts, float64(per), colLatency, false)
	}
	b.WriteString("</svg>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write burst plot: %w", err)
	}
	return nil
}

// writeOutageSVG draws each run as one row of three panels over time, the
// outage shaded: the load on the dependency (calls per second that reached
// it, and calls the consumer made), its latency (log scale, the timeout
// dashed) and the backlog (messages in delay queues and in the application
// queue, log scale). Points are the maxima over runs of seconds.
func writeOutageSVG(w io.Writer, c outageConfig, runs []outageResult) error {
	const width, rowH, top = 1010, 170, 60
	var b bytes.Buffer
	header(&b, width, top+rowH*len(runs)+10,
		fmt.Sprintf("rebound simulate outage: %g msg/s, concurrency %d, dependency stopped %s from %s, timeout %s (seed %d)",
			c.Rate, c.Concurrency, policy.FormatDuration(c.Outage), policy.FormatDuration(c.At), policy.FormatDuration(c.Timeout), c.Seed),
		fmt.Sprintf("Latency %s up to %d calls, ×%g every %g more. Shaded: the outage. Each point is the maximum over 2 s. Latency is clipped at %s s; zeros are left out of the log scales.",
			policy.FormatDuration(c.MinLatency), c.Limit, c.Factor, c.K, short(math.Max(1000, c.Timeout.Seconds()*100))))
	legend(&b, 50, 50, "calls reaching the dependency /s", colCalls, "calls made /s", colAttempts)
	legend(&b, 385, 50, "dependency latency (s)", colLatency, "timeout", colTimeout)
	legend(&b, 720, 50, "in delay queues", colDelayed, "in the app queue", colQueued)
	horizon := c.Horizon.Seconds()
	at, end := c.At.Seconds(), (c.At + c.Outage).Seconds()
	var peakCalls, peakBacklog float64 = 10, 10
	for _, r := range runs {
		for _, s := range r.Timeline {
			peakCalls = math.Max(peakCalls, float64(max(s.Calls, s.Attempts)))
			peakBacklog = math.Max(peakBacklog, float64(max(s.Delayed, s.Queued)))
		}
	}
	latTop := math.Max(1000, c.Timeout.Seconds()*100)
	for i, r := range runs {
		y := top + 20 + i*rowH
		s := r.Summary
		status := "never recovered"
		if s.RecoveryS != nil {
			status = fmt.Sprintf("recovered %s after resuming", policy.FormatDuration(time.Duration(*s.RecoveryS*float64(time.Second))))
		}
		series := func(f func(outageSecond) float64) ([]float64, int) {
			xs := make([]float64, len(r.Timeline))
			for j, t := range r.Timeline {
				xs[j] = f(t)
			}
			return downsample(xs, plotPoints, true)
		}
		load := panel{x: 50, y: y, w: 280, h: rowH - 45, xmax: horizon, xunit: "s", ymax: niceStep(peakCalls/3) * 3,
			title: fmt.Sprintf("%s: peak %d calls/s", s.Strategy, s.PeakDependencyRPS)}
		load.frame(&b)
		load.band(&b, at, end, "")
		pts, per := series(func(t outageSecond) float64 { return float64(t.Attempts) })
		load.line(&b, pts, float64(per), colAttempts, false)
		pts, per = series(func(t outageSecond) float64 { return float64(t.Calls) })
		load.line(&b, pts, float64(per), colCalls, false)

		lat := panel{x: 385, y: y, w: 280, h: rowH - 45, xmax: horizon, xunit: "s", ymin: c.MinLatency.Seconds() / 2, ymax: latTop, log: true,
			title: fmt.Sprintf("%s: %s", s.Strategy, status)}
		lat.frame(&b)
		lat.band(&b, at, end, "")
		lat.line(&b, []float64{c.Timeout.Seconds(), c.Timeout.Seconds()}, horizon, colTimeout, true)
		pts, per = series(func(t outageSecond) float64 { return t.Latency })
		lat.line(&b, pts, float64(per), colLatency, false)

		backlog := panel{x: 720, y: y, w: 280, h: rowH - 45, xmax: horizon, xunit: "s", ymin: 1, ymax: math.Pow(10, math.Ceil(math.Log10(peakBacklog))), log: true,
			title: fmt.Sprintf("%s: peak %d delayed, %s", s.Strategy, s.PeakDelayed, plural(s.DelayQueues, "queue"))}
		backlog.frame(&b)
		backlog.band(&b, at, end, "")
		pts, per = series(func(t outageSecond) float64 { return float64(t.Delayed) })
		backlog.line(&b, pts, float64(per), colDelayed, false)
		pts, per = series(func(t outageSecond) float64 { return float64(t.Queued) })
		backlog.line(&b, pts, float64(per), colQueued, false)
	}
	b.WriteString("</svg>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write outage plot: %w", err)
	}
	return nil
}
