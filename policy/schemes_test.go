package policy

import (
	"math"
	"testing"
	"time"
)

// The published retry schemes DESIGN.md promises, each reproduced as one
// configuration. Expected values are written the way each source publishes
// them (seconds), then converted to the nearest nanosecond.

func TestGoogleHTTPClient(t *testing.T) {
	// google-http-java-client ExponentialBackOff defaults: initial interval
	// 500ms, multiplier 1.5, randomization factor 0.5, max interval 1m, max
	// elapsed time 15m. Its documented table:
	p := Policy{
		Backoff: Exponential, MinDelay: 500 * time.Millisecond, MaxDelay: time.Minute, Multiplier: 1.5,
		Jitter: ProportionalJitter, JitterFactor: 0.5,
		MaxDuration: 15 * time.Minute, Deadline: clamp,
	}
	intervals := []float64{0.5, 0.75, 1.125, 1.6875, 2.53125, 3.796875, 5.6953125, 8.54296875, 12.814453125, 19.2216796875}
	for n, want := range intervals {
		if got := p.Nominal(n); got != sec(want) {
			t.Errorf("retry %d: interval %v, want %vs", n+1, got, want)
		}
		lo, hi := p.Range(n, 0)
		if lo != sec(want*0.5) || hi != sec(want*1.5) {
			t.Errorf("retry %d: randomized interval [%v, %v], want [%vs, %vs]", n+1, lo, hi, want*0.5, want*1.5)
		}
	}
	if lo, hi := p.Range(0, 0); lo != 250*time.Millisecond || hi != 750*time.Millisecond {
		t.Errorf("retry 1: [%v, %v], want [0.25s, 0.75s]", lo, hi)
	}
	if lo, hi := p.Range(1, 0); lo != 375*time.Millisecond || hi != 1125*time.Millisecond {
		t.Errorf("retry 2: [%v, %v], want [0.375s, 1.125s]", lo, hi)
	}
	// The interval stops growing at the 1m max interval (0.5·1.5¹² > 60),
	// and the randomized interval is capped there too.
	if got := p.Nominal(12); got != time.Minute {
		t.Errorf("retry 13: interval %v, want 1m0s", got)
	}
	if lo, hi := p.Range(11, 0); lo != sec(0.5*math.Pow(1.5, 11)*0.5) || hi != time.Minute {
		t.Errorf("retry 12: [%v, %v], want [%v, 1m0s]", lo, hi, sec(0.5*math.Pow(1.5, 11)*0.5))
	}
	// The randomized interval as Decide draws it, at both ends.
	for _, u := range []float64{0, 0.5} {
		r := &script{t: t, u: []float64{u}}
		want := roundDelay(sec(1.125 * (1 + 0.5*(2*u-1))))
		if got := p.Decide(State{Retries: 2, StartedAt: start}, start.Add(time.Second), r).rounded(); got != (Decision{Retry: true, Delay: want}) {
			t.Errorf("retry 3, U=%v: %+v, want retry after %v", u, got, want)
		}
	}
	// Max elapsed time: nothing is retried after 15 minutes.
	if got := p.Decide(State{Retries: 30, StartedAt: start}, start.Add(15*time.Minute), nil); got != (Decision{Reason: maxDuration}) {
		t.Errorf("after 15m: %+v, want max-duration", got)
	}
}

func TestAWSSimpleDB(t *testing.T) {
	// SimpleDB's error-retry guidance: wait up to 4ⁿ·400ms, picked at random.
	p := Policy{
		Backoff: Exponential, MinDelay: 400 * time.Millisecond, MaxDelay: time.Hour, Multiplier: 4,
		Jitter: fullJitter, MaxRetries: 10, MaxDuration: 24 * time.Hour, Deadline: clamp,
	}
	for n, want := range []float64{0.4, 1.6, 6.4, 25.6, 102.4, 409.6} {
		if got := p.Nominal(n); got != sec(want) {
			t.Errorf("retry %d: nominal %v, want %vs", n+1, got, want)
		}
		if lo, hi := p.Range(n, 0); lo != 0 || hi != sec(want) {
			t.Errorf("retry %d: range [%v, %v], want [0s, %vs]", n+1, lo, hi, want)
		}
	}
}

func TestTrueLayerRetryPolicies(t *testing.T) {
	// retry-policies ExponentialBackoff: 1s·2ⁿ, max interval 30m, max total
	// retry duration 24h; Jitter::Full draws from [0, d], Jitter::Bounded
	// from [m/2, d] (m/2 + U·(d − m/2)).
	p := Policy{
		Backoff: Exponential, MinDelay: time.Second, MaxDelay: 30 * time.Minute, Multiplier: 2,
		MaxDuration: 24 * time.Hour, Deadline: clamp,
	}
	for n := 0; n < 15; n++ {
		want := min(time.Duration(1<<n)*time.Second, 30*time.Minute)
		if got := p.Nominal(n); got != want {
			t.Errorf("retry %d: nominal %v, want %v", n+1, got, want)
		}
		p.Jitter = fullJitter
		if lo, hi := p.Range(n, 0); lo != 0 || hi != want {
			t.Errorf("full, retry %d: [%v, %v], want [0s, %v]", n+1, lo, hi, want)
		}
		p.Jitter = boundedJitter
		if lo, hi := p.Range(n, 0); lo != 500*time.Millisecond || hi != want {
			t.Errorf("bounded, retry %d: [%v, %v], want [500ms, %v]", n+1, lo, hi, want)
		}
	}
	// Bounded, U = 0.5 at retry 4 (8s): 0.5s + 0.5·7.5s = 4.25s, queued as 4.3s.
	p.Jitter = boundedJitter
	r := &script{t: t, u: []float64{0.5}}
	if got := p.Decide(State{Retries: 3, StartedAt: start}, start, r).rounded(); got != (Decision{Retry: true, Delay: 4300 * time.Millisecond}) {
		t.Errorf("bounded retry 4, U=0.5: %+v, want 4.3s", got)
	}
	if got := p.Decide(State{Retries: 100, StartedAt: start}, start.Add(24*time.Hour), nil); got != (Decision{Reason: maxDuration}) {
		t.Errorf("after 24h: %+v, want max-duration", got)
	}
}

func TestSNSZaqarCurves(t *testing.T) {
	// Amazon SNS delivery policies (and OpenStack Zaqar after them) fit a
	// curve from the min to the max delay over the retry count: here 5s to
	// 260s over 10 retries, i/9 of the way at retry i+1.
	base := Policy{
		MinDelay: 5 * time.Second, MaxDelay: 260 * time.Second,
		Jitter: NoJitter, MaxRetries: 10, MaxDuration: 24 * time.Hour, Deadline: clamp,
	}
	curves := map[Backoff]func(t float64) float64{
		linear:     func(t float64) float64 { return 5 + 255*t },
		arithmetic: func(t float64) float64 { return 5 + 255*t*t },
		geometric:  func(t float64) float64 { return 5 * math.Pow(52, t) },
	}
	for shape, f := range curves {
		t.Run(string(shape), func(t *testing.T) {
			p := base
			p.Backoff = shape
			if got := p.Nominal(0); got != 5*time.Second {
				t.Errorf("first delay %v, want 5s", got)
			}
			if got := p.Nominal(9); got != 260*time.Second {
				t.Errorf("last delay %v, want 4m20s", got)
			}
			for n := 1; n < 9; n++ {
				want := sec(f(float64(n) / 9))
				// The formula written two ways rounds differently in the
				// last bit of a float64: a nanosecond either way is exact.
				if got := p.Nominal(n); got < want-1 || got > want+1 {
					t.Errorf("retry %d: %v, want %v", n+1, got, want)
				}
			}
			if got := p.Decide(State{Retries: 10, StartedAt: start}, start, nil); got != (Decision{Reason: MaxRetries}) {
				t.Errorf("retry 11: %+v, want max-retries", got)
			}
		})
	}
	// Midpoints by hand: a third of the way (retry 4).
	for shape, want := range map[Backoff]time.Duration{linear: 90 * time.Second, arithmetic: sec(5 + 255.0/9), geometric: sec(5 * math.Cbrt(52))} {
		p := base
		p.Backoff = shape
		if got := p.Nominal(3); got < want-1 || got > want+1 {
			t.Errorf("%s retry 4: %v, want %v", shape, got, want)
		}
	}
}

func TestGRPCConnectionBackoff(t *testing.T) {
	// gRPC connection backoff: initial 1s, multiplier 1.6, jitter 0.2, max
	// 120s: current_backoff·(1 ± 0.2).
	p := Policy{
		Backoff: Exponential, MinDelay: time.Second, MaxDelay: 120 * time.Second, Multiplier: 1.6,
		Jitter: ProportionalJitter, JitterFactor: 0.2, MaxDuration: 24 * time.Hour, Deadline: clamp,
	}
	for n := 0; n < 14; n++ {
		want := min(sec(math.Pow(1.6, float64(n))), 120*time.Second)
		if got := p.Nominal(n); got != want {
			t.Errorf("retry %d: nominal %v, want %v", n+1, got, want)
		}
		lo, hi := p.Range(n, 0)
		wantLo, wantHi := sec(0.8*math.Min(math.Pow(1.6, float64(n)), 120)), min(sec(1.2*math.Pow(1.6, float64(n))), 120*time.Second)
		if lo != wantLo || hi != wantHi {
			t.Errorf("retry %d: [%v, %v], want [%v, %v]", n+1, lo, hi, wantLo, wantHi)
		}
	}
	if got := p.Nominal(4); got != sec(6.5536) {
		t.Errorf("retry 5: %v, want 6.5536s", got)
	}
}

func TestGoogleDrive(t *testing.T) {
	// Google Drive API: wait 2ⁿ seconds plus up to 1000 random
	// milliseconds, for 5 retries.
	p := Policy{
		Backoff: Exponential, MinDelay: time.Second, MaxDelay: time.Hour, Multiplier: 2,
		Jitter: additiveJitter, JitterMax: time.Second, MaxRetries: 5, MaxDuration: 24 * time.Hour, Deadline: clamp,
	}
	for n, want := range []time.Duration{1, 2, 4, 8, 16} {
		want *= time.Second
		if lo, hi := p.Range(n, 0); lo != want || hi != want+time.Second {
			t.Errorf("retry %d: [%v, %v], want [%v, %v]", n+1, lo, hi, want, want+time.Second)
		}
	}
	// 4s + 0.25·1s = 4.25s, queued as 4.3s.
	r := &script{t: t, u: []float64{0.25}}
	if got := p.Decide(State{Retries: 2, StartedAt: start}, start, r).rounded(); got != (Decision{Retry: true, Delay: 4300 * time.Millisecond}) {
		t.Errorf("retry 3, U=0.25: %+v, want 4.3s", got)
	}
	if got := p.Decide(State{Retries: 5, StartedAt: start}, start, nil); got != (Decision{Reason: MaxRetries}) {
		t.Errorf("retry 6: %+v, want max-retries", got)
	}
}
