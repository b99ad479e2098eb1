package simulate

import (
	"testing"
	"time"
)

// BenchmarkBurst runs the default burst experiment once per strategy. The
// target: well under a second for all six.
func BenchmarkBurst(b *testing.B) {
	c := defaultBurst()
	for _, name := range burstStrategyNames() {
		s, err := defaultBackoffs(defaultPolicy(b)).Strategy(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := playBurst(c, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOutage runs the default outage scenario (ten minutes of 100
// messages a second) per strategy. The target: a few seconds at most; the
// collapsing strategies are the slow ones (the dependency ends up holding
// hundreds of thousands of abandoned calls).
func BenchmarkOutage(b *testing.B) {
	c := defaultOutage()
	def := defaultPolicy(b)
	for _, s := range []outageStrategy{
		{Name: "policy", Policy: def},
		{Name: "fixed", Policy: fixedInterval(def, 100*time.Millisecond)},
		{Name: "immediate", Policy: immediate(def)},
	} {
		b.Run(s.Name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := playOutage(c, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
