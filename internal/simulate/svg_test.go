package simulate

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// wellFormed fails the test unless svg parses as XML with an <svg> root.
func wellFormed(t *testing.T, svg []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	if bytes.Contains(svg, []byte("NaN")) || bytes.Contains(svg, []byte("Inf")) {
		t.Error("a coordinate is NaN or infinite")
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteBurstSVG(t *testing.T) {
	c := defaultBurst()
	var runs []burstResult
	for _, name := range burstStrategyNames() {
		s, _ := defaultBackoffs(defaultPolicy(t)).Strategy(name)
		r, err := playBurst(c, s)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	var b bytes.Buffer
	if err := writeBurstSVG(&b, c, runs); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	for _, name := range burstStrategyNames() {
		if !strings.Contains(b.String(), ">"+name+":") {
			t.Errorf("no panel titled %s", name)
		}
	}
	if b.Len() > 80_000 {
		t.Errorf("plot of %d bytes, want under 80 kB", b.Len())
	}
	if err := writeBurstSVG(failingWriter{}, c, runs); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("write error %v, want it passed on", err)
	}
}

func TestWriteOutageSVG(t *testing.T) {
	c := defaultOutage()
	c.Horizon = 8 * time.Minute
	def := defaultPolicy(t)
	def.MaxDuration = 5 * time.Minute // its retries drain within the horizon: recovered
	runs := []outageResult{
		outage(t, c, "policy", def),
		outage(t, c, "fixed", fixedInterval(def, 100*time.Millisecond)), // latency +Inf: must be clipped
	}
	var b bytes.Buffer
	if err := writeOutageSVG(&b, c, runs); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	for _, want := range []string{">policy: recovered", ">fixed: never recovered"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no panel titled %q", want)
		}
	}
	if b.Len() > 60_000 {
		t.Errorf("plot of %d bytes, want under 60 kB", b.Len())
	}
	if err := writeOutageSVG(failingWriter{}, c, runs); err == nil {
		t.Error("write error not passed on")
	}
}

func TestDownsample(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7}
	tests := []struct {
		n       int
		max     bool
		want    []float64
		wantPer int
	}{
		{10, false, xs, 1},
		{3, false, []float64{2, 5, 7}, 3},
		{3, true, []float64{3, 6, 7}, 3},
		{1, true, []float64{7}, 7},
	}
	for _, tt := range tests {
		got, per := downsample(xs, tt.n, tt.max)
		if per != tt.wantPer || len(got) != len(tt.want) {
			t.Fatalf("downsample(%d, %v) = %v per %d, want %v per %d", tt.n, tt.max, got, per, tt.want, tt.wantPer)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("downsample(%d, %v) = %v, want %v", tt.n, tt.max, got, tt.want)
			}
		}
	}
}

// TestLogLineLeavesZerosOut: on a log scale a zero breaks the line instead
// of being drawn at the axis floor, a lone value between zeros is a dot,
// and a line of zeros draws nothing; a linear scale draws zeros.
func TestLogLineLeavesZerosOut(t *testing.T) {
	logPanel := panel{x: 0, y: 0, w: 100, h: 100, xmax: 10, ymin: 1, ymax: 100, log: true}
	tests := []struct {
		name string
		p    panel
		ys   []float64
		want string
	}{
		{"gap", logPanel, []float64{10, 10, 0, 0, 10, 100}, `d="M0 50l10 0M40 50l10-50"`},
		{"lone point", logPanel, []float64{0, 10, 0}, `d="M10 50h1"`},
		{"lone point at the end", logPanel, []float64{1, 0, 100}, `d="M0 100h1M20 0h1"`},
		{"all zeros", logPanel, []float64{0, 0, 0}, ``},
		{"linear", panel{w: 100, h: 100, xmax: 10, ymax: 100}, []float64{10, 0}, `d="M0 90l10 10"`},
	}
	for _, tt := range tests {
		var b bytes.Buffer
		tt.p.line(&b, tt.ys, 1, "#000", false)
		if tt.want == "" {
			if b.Len() > 0 {
				t.Errorf("%s: drew %q, want nothing", tt.name, b.String())
			}
			continue
		}
		if !strings.Contains(b.String(), tt.want) {
			t.Errorf("%s: drew %q, want %s", tt.name, b.String(), tt.want)
		}
	}
}

// TestBandLabelStaysInThePanel: the label of a band, narrow or wide,
// ends at the panel's right edge, never past it.
func TestBandLabelStaysInThePanel(t *testing.T) {
	p := panel{x: 560, y: 80, w: 320, h: 140, xmax: 800}
	for _, from := range []float64{10, 783, 799} {
		var b bytes.Buffer
		p.band(&b, from, 800, "shaded: 17 never answered")
		if want := `<text x="880" y="75" class="a" text-anchor="end">shaded: 17 never answered</text>`; !strings.Contains(b.String(), want) {
			t.Errorf("band from %v: %q, want the label right-aligned at the panel's edge above it", from, b.String())
		}
	}
}

func TestPlural(t *testing.T) {
	for n, want := range map[int]string{0: "0 queues", 1: "1 queue", 370: "370 queues"} {
		if got := plural(n, "queue"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
}
