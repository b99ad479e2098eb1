package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// script is a Rand that returns scripted values in turn, so that a test
// knows every draw exactly. Drawing more than was scripted fails the test:
// that is how the tests check which jitter modes draw at all.
type script struct {
	t     testing.TB
	u, z  []float64
	draws int
}

var _ Rand = (*script)(nil)

func (s *script) Float64() float64 {
	s.t.Helper()
	return s.next(&s.u, "Float64")
}

func (s *script) NormFloat64() float64 {
	s.t.Helper()
	return s.next(&s.z, "NormFloat64")
}

// next takes the next scripted value off draws for a call of method,
// failing the test when the script has none left.
func (s *script) next(draws *[]float64, method string) float64 {
	s.t.Helper()
	if len(*draws) == 0 {
		s.t.Fatalf("unexpected %s draw (draw %d)", method, s.draws+1)
	}
	v := (*draws)[0]
	*draws, s.draws = (*draws)[1:], s.draws+1
	return v
}

// sec converts seconds to the nearest Duration, to write expected values
// the way published tables do.
func sec(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

var start = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// exponential is the default policy of DESIGN.md without jitter.
func exponential() Policy {
	return Policy{
		Backoff:      Exponential,
		MinDelay:     time.Second,
		MaxDelay:     time.Hour,
		Multiplier:   2,
		Jitter:       NoJitter,
		JitterFactor: 0.5,
		JitterMax:    time.Second,
		MaxRetries:   10,
		MaxDuration:  24 * time.Hour,
		Deadline:     clamp,
	}
}

func TestNominal(t *testing.T) {
	with := func(edit func(*Policy)) Policy {
		p := exponential()
		edit(&p)
		return p
	}
	tests := []struct {
		name string
		p    Policy
		want map[int]time.Duration // n → nominal delay
	}{
		{"constant", with(func(p *Policy) { p.Backoff, p.MinDelay = Constant, 2*time.Second }),
			map[int]time.Duration{0: 2 * time.Second, 1: 2 * time.Second, 9: 2 * time.Second, 1000: 2 * time.Second}},
		{"linear 1s..10s over 10", with(func(p *Policy) { p.Backoff, p.MaxDelay = linear, 10*time.Second }),
			map[int]time.Duration{0: 1 * time.Second, 1: 2 * time.Second, 4: 5 * time.Second, 8: 9 * time.Second, 9: 10 * time.Second, 50: 10 * time.Second}},
		{"arithmetic 1s..10s over 4", with(func(p *Policy) { p.Backoff, p.MaxDelay, p.MaxRetries = arithmetic, 10*time.Second, 4 }),
			map[int]time.Duration{0: 1 * time.Second, 1: 2 * time.Second, 2: 5 * time.Second, 3: 10 * time.Second}},
		{"geometric 1s..8s over 4", with(func(p *Policy) { p.Backoff, p.MaxDelay, p.MaxRetries = geometric, 8*time.Second, 4 }),
			map[int]time.Duration{0: 1 * time.Second, 1: 2 * time.Second, 2: 4 * time.Second, 3: 8 * time.Second}},
		{"exponential ×3 capped at 1m", with(func(p *Policy) { p.Multiplier, p.MaxDelay = 3, time.Minute }),
			map[int]time.Duration{0: 1 * time.Second, 1: 3 * time.Second, 2: 9 * time.Second, 3: 27 * time.Second, 4: time.Minute, 5: time.Minute}},
		{"exponential huge n saturates", exponential(),
			map[int]time.Duration{11: 2048 * time.Second, 12: time.Hour, 1 << 20: time.Hour, math.MaxInt: time.Hour}},
		{"exponential multiplier just above 1", with(func(p *Policy) { p.Multiplier = 1.5 }),
			map[int]time.Duration{0: time.Second, 1: 1500 * time.Millisecond, 2: 2250 * time.Millisecond}},
		{"immediate retries shift the curve", with(func(p *Policy) {
			p.Backoff, p.MaxDelay, p.ImmediateRetries, p.MaxRetries = linear, 10*time.Second, 2, 12
		}),
			map[int]time.Duration{0: 0, 1: 0, 2: 1 * time.Second, 3: 2 * time.Second, 11: 10 * time.Second}},
		{"immediate retries then exponential", with(func(p *Policy) { p.ImmediateRetries = 3 }),
			map[int]time.Duration{0: 0, 2: 0, 3: 1 * time.Second, 4: 2 * time.Second}},
		{"negative n counts as 0", exponential(),
			map[int]time.Duration{-5: time.Second}},
		{"fitted without room stays at min", with(func(p *Policy) { p.Backoff, p.MaxRetries = geometric, 1 }),
			map[int]time.Duration{0: time.Second, 3: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for n, want := range tt.want {
				if got := tt.p.Nominal(n); got != want {
					t.Errorf("Nominal(%d) = %v, want %v", n, got, want)
				}
			}
		})
	}
}

// TestDecideJitter checks every jitter mode against its formula with
// scripted draws: jitter is the raw value, delay what Decide returns after
// rounding for the delay queue.
func TestDecideJitter(t *testing.T) {
	tests := []struct {
		name   string
		jitter Jitter
		n      int // nominal delay 2ⁿ s with exponential()
		last   time.Duration
		u, z   []float64
		delay  time.Duration
	}{
		{"none", NoJitter, 2, 0, nil, nil, 4 * time.Second},
		{"full", fullJitter, 2, 0, []float64{0.25}, nil, time.Second},
		{"full at 0", fullJitter, 2, 0, []float64{0}, nil, 0},
		{"full rounds", fullJitter, 2, 0, []float64{0.3}, nil, 1200 * time.Millisecond}, // 1.2s
		{"equal", EqualJitter, 2, 0, []float64{0.5}, nil, 3 * time.Second},
		{"equal at 0", EqualJitter, 2, 0, []float64{0}, nil, 2 * time.Second},
		{"bounded", boundedJitter, 2, 0, []float64{0.5}, nil, 2300 * time.Millisecond},                                   // 0.5 + 0.5·3.5 = 2.25s
		{"bounded at 0", boundedJitter, 2, 0, []float64{0}, nil, 500 * time.Millisecond},                                 // m/2
		{"decorrelated first", decorrelatedJitter, 2, 0, []float64{0.5}, nil, 2 * time.Second},                           // [1s, 3s]
		{"decorrelated grows", decorrelatedJitter, 2, 10 * time.Second, []float64{0.5}, nil, 16 * time.Second},           // [1s, 30s]: 15.5s
		{"decorrelated ignores the curve", decorrelatedJitter, 9, 2 * time.Second, []float64{0.8}, nil, 5 * time.Second}, // [1s, 6s]
		{"decorrelated capped at max", decorrelatedJitter, 2, 40 * time.Minute, []float64{0.5}, nil, 30 * time.Minute},   // [1s, 1h]: 1800.5s
		{"decorrelated short last", decorrelatedJitter, 2, 100 * time.Millisecond, []float64{0.5}, nil, time.Second},     // [1s, 1s]
		{"proportional low", ProportionalJitter, 2, 0, []float64{0}, nil, 2 * time.Second},
		{"proportional high", ProportionalJitter, 2, 0, []float64{0.75}, nil, 5 * time.Second},
		{"gaussian", GaussianJitter, 2, 0, nil, []float64{1}, 6 * time.Second},
		{"gaussian clamped at 0", GaussianJitter, 2, 0, nil, []float64{-3}, 0},
		{"gaussian clamped at max", GaussianJitter, 2, 0, nil, []float64{10000}, time.Hour},
		{"additive", additiveJitter, 2, 0, []float64{0.5}, nil, 4500 * time.Millisecond},
		{"additive clamped at max", additiveJitter, 20, 0, []float64{0.5}, nil, time.Hour},
		{"full at max", fullJitter, 20, 0, []float64{0.5}, nil, 30 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := exponential()
			p.MaxRetries = 100
			p.Jitter = tt.jitter
			r := &script{t: t, u: tt.u, z: tt.z}
			got := p.Decide(State{Retries: tt.n, StartedAt: start, LastDelay: tt.last}, start, r).rounded()
			if want := (Decision{Retry: true, Delay: tt.delay}); got != want {
				t.Errorf("Decide = %+v, want %+v", got, want)
			}
			if want := len(tt.u) + len(tt.z); r.draws != want {
				t.Errorf("drew %d times, want %d", r.draws, want)
			}
		})
	}
}

// TestJitterRaw checks the unrounded jitter, so the formulas are pinned
// to the nanosecond and not only to two significant digits.
func TestJitterRaw(t *testing.T) {
	p := exponential()
	d := float64(4 * time.Second)
	tests := []struct {
		jitter Jitter
		last   time.Duration
		u, z   float64
		want   time.Duration
	}{
		{fullJitter, 0, 0.3, 0, 1200 * time.Millisecond},
		{EqualJitter, 0, 0.25, 0, 2500 * time.Millisecond},
		{boundedJitter, 0, 0.5, 0, 2250 * time.Millisecond},
		{decorrelatedJitter, 10 * time.Second, 0.5, 0, 15500 * time.Millisecond},
		{ProportionalJitter, 0, 0.25, 0, 3 * time.Second},
		{GaussianJitter, 0, 0, -0.5, 3 * time.Second},
		{additiveJitter, 0, 0.123, 0, 4123 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(string(tt.jitter), func(t *testing.T) {
			p.Jitter = tt.jitter
			r := &script{t: t, u: []float64{tt.u}, z: []float64{tt.z}}
			if got := p.jitter(d, tt.last, r); got != tt.want {
				t.Errorf("jitter(4s) = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecideParks(t *testing.T) {
	p := exponential()
	p.ImmediateRetries = 2
	p.MaxRetries = 5
	p.MaxDuration = time.Hour
	tests := []struct {
		name    string
		s       State
		elapsed time.Duration
		want    Decision
	}{
		{"first failure", State{}, 0, Decision{Retry: true}},
		{"immediate retry", State{Retries: 1}, time.Minute, Decision{Retry: true}},
		{"first delayed retry", State{Retries: 2}, time.Minute, Decision{Retry: true, Delay: time.Second}},
		{"last retry", State{Retries: 4}, time.Minute, Decision{Retry: true, Delay: 4 * time.Second}},
		{"retries spent", State{Retries: 5}, time.Minute, Decision{Reason: MaxRetries}},
		{"far past the count", State{Retries: 1 << 40}, 0, Decision{Reason: MaxRetries}},
		{"budget spent", State{Retries: 3}, time.Hour, Decision{Reason: maxDuration}},
		{"budget spent beats immediate", State{Retries: 0}, 2 * time.Hour, Decision{Reason: maxDuration}},
		{"count beats budget", State{Retries: 5}, 2 * time.Hour, Decision{Reason: MaxRetries}},
		{"non-retryable beats all", State{Retries: 5, NonRetryable: true}, 2 * time.Hour, Decision{Reason: NonRetryable}},
		{"non-retryable at once", State{NonRetryable: true}, 0, Decision{Reason: NonRetryable}},
		{"start in the future counts as now", State{Retries: 2}, -time.Hour, Decision{Retry: true, Delay: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			s.StartedAt = start
			// A nil Rand: none of these may draw.
			if got := p.Decide(s, start.Add(tt.elapsed), nil).rounded(); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDecideUnlimited(t *testing.T) {
	p := exponential()
	p.MaxRetries = 0
	got := p.Decide(State{Retries: 1_000_000, StartedAt: start}, start.Add(time.Hour), nil).rounded()
	if want := (Decision{Retry: true, Delay: time.Hour}); got != want {
		t.Errorf("MaxRetries 0, retry 1e6: Decide = %+v, want %+v", got, want)
	}
	p = exponential()
	p.MaxDuration = 0
	got = p.Decide(State{Retries: 9, StartedAt: time.Time{}}, start, nil).rounded()
	if want := (Decision{Retry: true, Delay: 510 * time.Second}); got != want { // 512s, rounded
		t.Errorf("MaxDuration 0, zero StartedAt: Decide = %+v, want %+v", got, want)
	}
}

func TestDecideDeadline(t *testing.T) {
	tests := []struct {
		deadline Deadline
		n        int
		elapsed  time.Duration
		want     Decision
	}{
		// Retry 3 wants 8s; 3s of the 10s budget are left.
		{clamp, 3, 7 * time.Second, Decision{Retry: true, Delay: 3 * time.Second}},
		{Strict, 3, 7 * time.Second, Decision{Reason: maxDuration}},
		{Lenient, 3, 7 * time.Second, Decision{Retry: true, Delay: 8 * time.Second}},
		// It fits exactly.
		{clamp, 3, 2 * time.Second, Decision{Retry: true, Delay: 8 * time.Second}},
		{Strict, 3, 2 * time.Second, Decision{Retry: true, Delay: 8 * time.Second}},
		// 2.35s left: rounding up to 2.4s would land past the deadline.
		{clamp, 3, 7650 * time.Millisecond, Decision{Retry: true, Delay: 2300 * time.Millisecond}},
		// 1ms left is still a delay queue; half of one is not.
		{clamp, 3, 9999 * time.Millisecond, Decision{Retry: true, Delay: time.Millisecond}},
		{clamp, 3, 9999500 * time.Microsecond, Decision{Reason: maxDuration}},
		{Lenient, 3, 9999500 * time.Microsecond, Decision{Retry: true, Delay: 8 * time.Second}},
		// At the deadline every mode parks.
		{clamp, 0, 10 * time.Second, Decision{Reason: maxDuration}},
		{Strict, 0, 10 * time.Second, Decision{Reason: maxDuration}},
		{Lenient, 0, 10 * time.Second, Decision{Reason: maxDuration}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/n=%d/elapsed=%v", tt.deadline, tt.n, tt.elapsed), func(t *testing.T) {
			p := exponential()
			p.MaxDuration = 10 * time.Second
			p.Deadline = tt.deadline
			if got := p.Decide(State{Retries: tt.n, StartedAt: start}, start.Add(tt.elapsed), nil).rounded(); got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// roundDelay is Round with the default digits.
func roundDelay(d time.Duration) time.Duration { return round(d, defaultDelayDigits) }

func TestRoundDelay(t *testing.T) {
	tests := []struct{ d, want time.Duration }{
		{0, 0},
		{-time.Second, 0},
		{1, 0},
		{499999, 0},
		{500 * time.Microsecond, time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{1499 * time.Microsecond, time.Millisecond},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{56 * time.Millisecond, 56 * time.Millisecond},
		{99499 * time.Microsecond, 99 * time.Millisecond},
		{99500 * time.Microsecond, 100 * time.Millisecond},
		{123 * time.Millisecond, 120 * time.Millisecond},
		{125 * time.Millisecond, 130 * time.Millisecond},
		{995 * time.Millisecond, time.Second},
		{1234 * time.Millisecond, 1200 * time.Millisecond},
		{1250 * time.Millisecond, 1300 * time.Millisecond},
		{1250*time.Millisecond - 1, 1200 * time.Millisecond},
		{56789 * time.Millisecond, 57 * time.Second},
		{time.Hour, time.Hour},
		{time.Hour - time.Millisecond, time.Hour},
		{90 * time.Minute, 90 * time.Minute},
		{100 * time.Hour, 100 * time.Hour},
		{math.MaxInt64, 92 * 1e17},
	}
	for _, tt := range tests {
		if got := roundDelay(tt.d); got != tt.want {
			t.Errorf("roundDelay(%v) = %v, want %v", tt.d, got, tt.want)
		}
	}
}

// TestDecideNeverRoundsPastMax covers a MaxDelay that is not itself round:
// rounding half up would pass it, so Decide rounds down.
func TestDecideNeverRoundsPastMax(t *testing.T) {
	p := exponential()
	p.Backoff = Constant
	p.MinDelay = 1250 * time.Millisecond
	p.MaxDelay = 1250 * time.Millisecond
	got := p.Decide(State{StartedAt: start}, start, nil).rounded()
	if want := (Decision{Retry: true, Delay: 1200 * time.Millisecond}); got != want {
		t.Errorf("Decide = %+v, want %+v", got, want)
	}
}

func TestRange(t *testing.T) {
	p := exponential()
	p.JitterFactor = 0.25
	p.JitterMax = 3 * time.Second
	tests := []struct {
		jitter Jitter
		n      int
		last   time.Duration
		lo, hi time.Duration
	}{
		{NoJitter, 2, 0, 4 * time.Second, 4 * time.Second},
		{fullJitter, 2, 0, 0, 4 * time.Second},
		{EqualJitter, 2, 0, 2 * time.Second, 4 * time.Second},
		{boundedJitter, 2, 0, 500 * time.Millisecond, 4 * time.Second},
		{decorrelatedJitter, 2, 0, time.Second, 3 * time.Second},
		{decorrelatedJitter, 2, 3 * time.Second, time.Second, 9 * time.Second},
		{decorrelatedJitter, 2, time.Hour, time.Second, time.Hour},
		{ProportionalJitter, 2, 0, 3 * time.Second, 5 * time.Second},
		{GaussianJitter, 2, 0, time.Second, 7 * time.Second}, // ±3σ
		{additiveJitter, 2, 0, 4 * time.Second, 7 * time.Second},
		{additiveJitter, 20, 0, time.Hour, time.Hour},
		{ProportionalJitter, 20, 0, 45 * time.Minute, time.Hour},
	}
	for _, tt := range tests {
		p.Jitter = tt.jitter
		if lo, hi := p.Range(tt.n, tt.last); lo != tt.lo || hi != tt.hi {
			t.Errorf("%s: Range(%d, %v) = [%v, %v], want [%v, %v]", tt.jitter, tt.n, tt.last, lo, hi, tt.lo, tt.hi)
		}
	}
	p.ImmediateRetries = 1
	p.Jitter = additiveJitter
	if lo, hi := p.Range(0, 0); lo != 0 || hi != 0 {
		t.Errorf("immediate retry: Range = [%v, %v], want [0s, 0s]", lo, hi)
	}
}

func TestSchedule(t *testing.T) {
	p := exponential()
	p.Jitter = fullJitter
	p.MaxRetries = 4
	p.ImmediateRetries = 1
	steps, stop := p.Schedule(1000)
	want := []Step{
		{Retry: 0, Nominal: 0, Delay: 0, Min: 0, Max: 0, Elapsed: 0},
		{Retry: 1, Nominal: time.Second, Delay: time.Second, Min: 0, Max: time.Second, Elapsed: time.Second},
		{Retry: 2, Nominal: 2 * time.Second, Delay: 2 * time.Second, Min: 0, Max: 2 * time.Second, Elapsed: 3 * time.Second},
		{Retry: 3, Nominal: 4 * time.Second, Delay: 4 * time.Second, Min: 0, Max: 4 * time.Second, Elapsed: 7 * time.Second},
	}
	if fmt.Sprint(steps) != fmt.Sprint(want) {
		t.Errorf("Schedule steps:\n got %+v\nwant %+v", steps, want)
	}
	if stop != (Decision{Reason: MaxRetries}) {
		t.Errorf("Schedule stop = %+v, want max-retries", stop)
	}

	steps, stop = p.Schedule(2)
	if len(steps) != 2 || !stop.Retry {
		t.Errorf("Schedule(2) = %d steps, stop %+v; want 2 steps and a policy that goes on", len(steps), stop)
	}
}

// TestScheduleBudget checks that clamp shortens the last delays to end at
// the budget (leaving the slivers that rounding down leaves), Strict stops
// before a delay that would pass it, and the decorrelated bounds chain.
func TestScheduleBudget(t *testing.T) {
	p := exponential()
	p.MaxRetries = 0
	p.MaxDuration = 10*time.Second + 450*time.Millisecond
	steps, stop := p.Schedule(1000)
	var delays []time.Duration
	for _, s := range steps {
		delays = append(delays, s.Delay)
	}
	// 1+2+4 = 7s, then 3.45s are left: 3.4s, then 50ms.
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 3400 * time.Millisecond, 50 * time.Millisecond}
	if fmt.Sprint(delays) != fmt.Sprint(want) || stop.Reason != maxDuration {
		t.Errorf("clamp: delays %v, stop %+v; want %v, max-duration", delays, stop, want)
	}
	if last := steps[len(steps)-1].Elapsed; last != p.MaxDuration {
		t.Errorf("clamp: the schedule ends at %v, want the budget %v", last, p.MaxDuration)
	}

	p.Deadline = Strict
	p.Jitter = decorrelatedJitter
	steps, stop = p.Schedule(1000)
	if len(steps) != 3 || stop.Reason != maxDuration {
		t.Fatalf("strict: %d steps, stop %+v; want 3, max-duration", len(steps), stop)
	}
	// Unconditional decorrelated bounds: [1s, 3s], [1s, 9s], then 9·3 = 27s
	// capped by what is left of the budget at nominal delays (7.45s). The
	// fourth nominal delay, 8s, would pass the budget: strict stops.
	for i, want := range [][2]time.Duration{{time.Second, 3 * time.Second}, {time.Second, 9 * time.Second}, {time.Second, 7400 * time.Millisecond}} {
		if steps[i].Min != want[0] || steps[i].Max != want[1] {
			t.Errorf("strict decorrelated retry %d: [%v, %v], want [%v, %v]", i, steps[i].Min, steps[i].Max, want[0], want[1])
		}
	}
}

// rounded is d without Drawn, for tests about the delay the queue holds.
func (d Decision) rounded() Decision {
	d.Drawn = 0
	return d
}

// TestDecideDrawnIsUnrounded: Drawn is the chosen delay before rounding
// for the delay queue, deadline applied, in whole milliseconds.
func TestDecideDrawnIsUnrounded(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	p := Policy{Backoff: Exponential, MinDelay: time.Second, MaxDelay: time.Hour, Multiplier: 1.5, Jitter: NoJitter,
		MaxDuration: 10 * time.Second, Deadline: clamp}
	for _, tc := range []struct {
		n            int
		elapsed      time.Duration
		delay, drawn time.Duration
	}{
		{0, 0, time.Second, time.Second},
		{3, 0, 3400 * time.Millisecond, 3375 * time.Millisecond},                                            // 1.5^3 s
		{3, 7654*time.Millisecond + 321*time.Microsecond, 2300 * time.Millisecond, 2345 * time.Millisecond}, // clamped to the deadline, rounded down
	} {
		got := p.Decide(State{Retries: tc.n, StartedAt: start}, start.Add(tc.elapsed), nil)
		if got.Delay != tc.delay || got.Drawn != tc.drawn {
			t.Errorf("n=%d elapsed %s: delay %s drawn %s, want %s and %s", tc.n, tc.elapsed, got.Delay, got.Drawn, tc.delay, tc.drawn)
		}
	}
}

// TestDecorrelatedDoesNotCompoundRounding: decorrelated jitter's range
// grows from the last delay; carried as drawn (Decision.Drawn), the top
// of the range follows the published formula, min(M, m·3^n), and each
// delay is that within rounding's 5 %. Carried rounded, the top at retry
// 5 from 5 ms was 1300 ms where the formula says 1215 ms.
func TestDecorrelatedDoesNotCompoundRounding(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	p := Policy{Backoff: Constant, MinDelay: 5 * time.Millisecond, MaxDelay: 2 * time.Second, Jitter: decorrelatedJitter}
	top := fixed{u: 0.999999999}
	var last time.Duration
	formula := 5 * time.Millisecond
	steps, _ := p.Schedule(6)
	for n := range 6 {
		formula = min(3*formula, p.MaxDelay)
		d := p.Decide(State{Retries: n, StartedAt: start, LastDelay: last}, start, top)
		// Each draw is truncated to a whole millisecond, as the header
		// carries it: a millisecond per retry at most.
		if d.Drawn > formula || d.Drawn < formula-time.Duration(n+1)*time.Millisecond ||
			float64(d.Delay) > 1.05*float64(formula) || float64(d.Delay) < 0.95*float64(formula) {
			t.Errorf("retry %d: drawn %s, delay %s; want %s drawn, the delay within 5 %%", n+1, d.Drawn, d.Delay, formula)
		}
		if steps[n].Max != d.Delay {
			t.Errorf("retry %d: schedule's max %s, Decide's top %s: they must agree", n+1, steps[n].Max, d.Delay)
		}
		last = d.Drawn
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Hour: "1h", 90 * time.Minute: "1h30m", 2 * time.Minute: "2m", 90 * time.Second: "1m30s",
		500 * time.Millisecond: "500ms", 1125 * time.Millisecond: "1.125s", 0: "0s", 25*time.Hour + time.Second: "25h0m1s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestRoundDigits(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		d              time.Duration
		digits         int
		round, roundUp time.Duration
	}{
		{1234 * ms, 1, 1000 * ms, 2000 * ms},
		{1234 * ms, 2, 1200 * ms, 1300 * ms},
		{1234 * ms, 3, 1230 * ms, 1240 * ms},
		{56789 * ms, 1, 60000 * ms, 60000 * ms},
		{56789 * ms, 3, 56800 * ms, 56800 * ms},
		{9500 * ms, 1, 10000 * ms, 10000 * ms},
		{9999 * ms, 2, 10000 * ms, 10000 * ms},
		{1200 * ms, 2, 1200 * ms, 1200 * ms},
		{1200*ms + time.Microsecond, 2, 1200 * ms, 1300 * ms},
		{7 * ms, 1, 7 * ms, 7 * ms},
		{7*ms + 1, 3, 7 * ms, 8 * ms},
		{400 * time.Microsecond, 2, 0, ms},
		{0, 2, 0, 0},
		{-time.Second, 2, 0, 0},
		{1234 * ms, 0, 1200 * ms, 1300 * ms}, // 0 and out of range: the default two
	} {
		if got := round(tc.d, tc.digits); got != tc.round {
			t.Errorf("Round(%v, %d) = %v, want %v", tc.d, tc.digits, got, tc.round)
		}
		if got := roundUp(tc.d, tc.digits); got != tc.roundUp {
			t.Errorf("RoundUp(%v, %d) = %v, want %v", tc.d, tc.digits, got, tc.roundUp)
		}
	}
}

// TestRoundUpProperties: RoundUp is never below d, is on the grid Round
// maps to itself, and is the least such delay.
func TestRoundUpProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		d := time.Duration(r.Int64N(int64(48 * time.Hour)))
		for _, digits := range []int{1, 2, 3} {
			up := roundUp(d, digits)
			if up < d || round(up, digits) != up {
				t.Fatalf("RoundUp(%v, %d) = %v: below d, or off the grid", d, digits, up)
			}
			if below := roundDown(up-1, digits); up > 0 && below >= d && below != up {
				t.Fatalf("RoundUp(%v, %d) = %v, but %v is on the grid and not below d", d, digits, up, below)
			}
		}
	}
}

// TestGrid: the grid holds every delay Round and RoundUp give within its
// range, each once, in order, and nothing else; its size is what the
// docs/policies.md says (90 names a decade at two digits).
func TestGrid(t *testing.T) {
	for _, tc := range []struct {
		digits  int
		longest time.Duration
		n       int
	}{
		{1, time.Hour, 9 + 9 + 9 + 9 + 9 + 9 + 3},
		{2, time.Hour, 99 + 90 + 90 + 90 + 90 + 27},
		{3, time.Minute, 999 + 900 + 501},
		{2, 0, 0},
	} {
		grid := Grid(tc.digits, tc.longest)
		if len(grid) != tc.n {
			t.Errorf("Grid(%d, %v): %d delays, want %d", tc.digits, tc.longest, len(grid), tc.n)
		}
		on := map[time.Duration]bool{}
		for i, d := range grid {
			if round(d, tc.digits) != d || d > tc.longest || (i > 0 && d <= grid[i-1]) {
				t.Fatalf("Grid(%d, %v)[%d] = %v: off the grid, past the range or out of order", tc.digits, tc.longest, i, d)
			}
			on[d] = true
		}
		r := rand.New(rand.NewPCG(5, 6))
		for range 5000 {
			d := time.Duration(r.Int64N(int64(tc.longest) + 1))
			if rd := round(d, tc.digits); rd > 0 && rd <= tc.longest && !on[rd] {
				t.Fatalf("Round(%v, %d) = %v is not in the grid", d, tc.digits, rd)
			}
			if up := roundUp(d, tc.digits); up > 0 && up <= tc.longest && !on[up] {
				t.Fatalf("RoundUp(%v, %d) = %v is not in the grid", d, tc.digits, up)
			}
		}
	}
	if g1, g3 := Grid(1, time.Hour), Grid(3, time.Hour); !subset(g1, g3) {
		t.Error("the one-digit grid is not within the three-digit one: a finer scan would miss a coarser deployment's queues")
	}
}

func subset(a, b []time.Duration) bool {
	in := map[time.Duration]bool{}
	for _, d := range b {
		in[d] = true
	}
	for _, d := range a {
		if !in[d] {
			return false
		}
	}
	return true
}

func TestRemaining(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	s := State{StartedAt: now.Add(-time.Hour)}
	for _, tc := range []struct {
		p    Policy
		want time.Duration
	}{
		{Policy{MaxDuration: 3 * time.Hour, Deadline: clamp}, 2 * time.Hour},
		{Policy{MaxDuration: 3 * time.Hour, Deadline: Strict}, 2 * time.Hour},
		{Policy{MaxDuration: 3 * time.Hour, Deadline: Lenient}, 0},
		{Policy{Deadline: clamp}, 0},
		{Policy{MaxDuration: 30 * time.Minute, Deadline: clamp}, time.Nanosecond},
	} {
		if got := tc.p.Remaining(s, now); got != tc.want {
			t.Errorf("%+v: Remaining = %v, want %v", tc.p, got, tc.want)
		}
	}
}
