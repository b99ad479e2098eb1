package calendar

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// up2 is a delay queue grid of two significant digits.
func up2(d time.Duration) time.Duration { return policy.Policy{}.RoundUp(d) }

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func TestReserve(t *testing.T) {
	c := New()
	// A share of 2 a second: two copies due in the same second, then the
	// next goes to the following second, keeping its place in the second.
	var got []string
	for range 5 {
		d, o := c.reserve("orders", t0, 300*time.Millisecond, 0, Share{Rate: 2, Replicas: 1}, up2)
		got = append(got, fmt.Sprintf("%v/%d", d, o))
	}
	want := "[300ms/0 300ms/0 1.3s/1 1.3s/1 2.3s/1]"
	if fmt.Sprint(got) != want {
		t.Errorf("reservations %v, want %s", got, want)
	}
	// Another origin has its own calendar.
	if d, o := c.reserve("payments", t0, 300*time.Millisecond, 0, Share{Rate: 2, Replicas: 1}, up2); d != 300*time.Millisecond || o != OnTime {
		t.Errorf("another origin: %v, %v", d, o)
	}
	// No cap: nothing booked, nothing moved.
	if d, o := c.reserve("orders", t0, 300*time.Millisecond, 0, Share{Rate: 0, Replicas: 1}, up2); d != 300*time.Millisecond || o != OnTime {
		t.Errorf("share 0: %v, %v", d, o)
	}
}

func TestReserveRespectsTheDeadline(t *testing.T) {
	c := New()
	c.reserve("orders", t0, time.Second, 0, Share{Rate: 1, Replicas: 1}, up2)
	// The deadline is 1.5s away: the second second has room.
	if d, o := c.reserve("orders", t0, time.Second, 1500*time.Millisecond, Share{Rate: 1, Replicas: 1}, up2); d != 1500*time.Millisecond && d != time.Second+time.Second {
		t.Errorf("deadline 1.5s: %v, %v", d, o)
	}
	c2 := New()
	c2.reserve("orders", t0, time.Second, 0, Share{Rate: 1, Replicas: 1}, up2)
	// The deadline is within the full second: the copy comes due at it,
	// over budget, never parked.
	d, o := c2.reserve("orders", t0, time.Second, 1200*time.Millisecond, Share{Rate: 1, Replicas: 1}, up2)
	if d != 1200*time.Millisecond || o != Overflow {
		t.Errorf("deadline in the full second: %v, %v; want 1.2s, overflow", d, o)
	}
}

func TestReserveImmediateRetriesCount(t *testing.T) {
	c := New()
	if d, o := c.reserve("orders", t0.Add(100*time.Millisecond), 0, 0, Share{Rate: 1, Replicas: 1}, up2); d != 0 || o != OnTime {
		t.Errorf("first immediate retry: %v, %v", d, o)
	}
	d, o := c.reserve("orders", t0.Add(100*time.Millisecond), 0, 0, Share{Rate: 1, Replicas: 1}, up2)
	if o != Deferred || d != time.Second {
		t.Errorf("second immediate retry in a full second: %v, %v; want 1s, deferred", d, o)
	}
}

func TestCapacitySpreadsAFractionalShare(t *testing.T) {
	for _, share := range []float64{0.25, 0.5, 1, 1.5, 2.7, 40} {
		var sum uint32
		for s := int64(0); s < 100; s++ {
			c := Share{Rate: share, Replicas: 1}.capacity(1_800_000_000 + s)
			if float64(c) > share+1 {
				t.Errorf("share %v: second %d holds %d", share, s, c)
			}
			sum += c
		}
		if want := share * 100; float64(sum) < want-1 || float64(sum) > want+1 {
			t.Errorf("share %v: 100 seconds hold %d, want about %v", share, sum, want)
		}
	}
}

// TestReplicasSharesAddUpToTheCap: n replicas, each booking alone with
// its place among them, a storm larger than the cap on each: the copies
// all of them book in any one second never exceed the cap (a whole rate
// is met exactly in every second, a fractional one over time), and each
// replica keeps to its share over time. Before places, each replica's
// fractional copy fell in the same seconds as the others': 3 replicas
// under 40 booked 42 in one second, 50 under 40 booked 50.
func TestReplicasSharesAddUpToTheCap(t *testing.T) {
	for _, tc := range []struct {
		rate     float64
		replicas int
	}{
		{40, 1}, {40, 2}, {40, 3}, {40, 7}, {40, 50}, {100, 3}, {1, 3}, {2.5, 2}, {2.5, 50}, {0.5, 3}, {1000, 50},
	} {
		t.Run(fmt.Sprintf("%v/%d", tc.rate, tc.replicas), func(t *testing.T) {
			const seconds = 90 // delays past 100 s are whole tens of seconds on a two-digit grid
			perSecond := map[int64]int{}
			perReplica := make([]int, tc.replicas)
			for i := range tc.replicas {
				c := New()
				sh := Share{Rate: tc.rate, Replicas: tc.replicas, Index: i}
				// Enough copies, all wanted at once, to fill the calendar
				// well past the seconds counted.
				n := int(sh.PerSecond()*2*seconds) + 10
				for range n {
					d, _ := c.reserve("orders", t0, 0, 0, sh, up2)
					if d < seconds*time.Second {
						perSecond[t0.Add(d).Unix()]++
						perReplica[i]++
					}
				}
			}
			total, busiest := 0, 0
			for s := t0.Unix(); s < t0.Unix()+seconds; s++ {
				got := perSecond[s]
				total += got
				busiest = max(busiest, got)
				want := int(math.Floor(float64(s+1)*tc.rate) - math.Floor(float64(s)*tc.rate))
				if got > int(math.Ceil(tc.rate)) || got != want {
					t.Errorf("second %d: %d copies due, want %d (cap %v)", s-t0.Unix(), got, want, tc.rate)
				}
			}
			t.Logf("rate %v over %d replicas: at most %d copies due in one second", tc.rate, tc.replicas, busiest)
			if want := tc.rate * seconds; math.Abs(float64(total)-want) > 1 {
				t.Errorf("%d copies in %d seconds, want %v", total, seconds, want)
			}
			for i, got := range perReplica {
				if want := tc.rate / float64(tc.replicas) * seconds; math.Abs(float64(got)-want) > 1 {
					t.Errorf("replica %d: %d copies in %d seconds, want its share, %v", i, got, seconds, want)
				}
			}
		})
	}
}

// TestReplicasJoiningOrLeavingMidStorm: replicas book a storm, each alone
// at its share; then one joins, or one leaves (its copies still come due
// in the seconds it booked), and the others book on at their new shares.
// A leave costs nothing over the cap: a larger share applies only past
// the seconds already booked. A join is bounded by the newcomer's share,
// rounded up, in each second the others had booked before it came.
func TestReplicasJoiningOrLeavingMidStorm(t *testing.T) {
	const rate = 40
	for _, tc := range []struct {
		name          string
		before, after int
		// firstLeaves: the replica at place 0 leaves, and the one at the
		// last place moves down to it after counting the leave (a share
		// changed twice in a row); otherwise the last place leaves.
		firstLeaves bool
	}{
		{"2 to 3", 2, 3, false}, {"3 to 2", 3, 2, false}, {"3 to 2, place 0 left", 3, 2, true},
		{"1 to 2", 1, 2, false}, {"2 to 1", 2, 1, false}, {"2 to 1, place 0 left", 2, 1, true},
		{"50 to 49", 50, 49, false}, {"50 to 49, place 0 left", 50, 49, true}, {"49 to 50", 49, 50, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			perSecond := map[int64]int{}
			cals := make([]*Calendar, max(tc.before, tc.after))
			for i := range cals {
				cals[i] = New()
			}
			book := func(c *Calendar, sh Share, copies int, at time.Time) (latest int64) {
				for range copies {
					d, _ := c.reserve("orders", at, 0, 0, sh, up2)
					s := at.Add(d).Unix()
					perSecond[s]++
					latest = max(latest, s)
				}
				return latest
			}
			// 20 seconds of the cap booked, then the change 5 s later.
			var booked int64
			for i := range tc.before {
				booked = max(booked, book(cals[i], Share{Rate: rate, Replicas: tc.before, Index: i}, 20*rate/tc.before, t0))
			}
			changed := t0.Add(5 * time.Second)
			copies := 20 * rate / tc.after
			switch {
			case tc.after > tc.before:
				for i := range tc.after {
					book(cals[i], Share{Rate: rate, Replicas: tc.after, Index: i}, copies, changed)
				}
			case tc.firstLeaves:
				for i := 1; i < tc.before; i++ {
					place := i
					if i == tc.before-1 {
						// Counted the leave at its old place first.
						book(cals[i], Share{Rate: rate, Replicas: tc.after, Index: i}, 1, changed)
						place = 0
					}
					book(cals[i], Share{Rate: rate, Replicas: tc.after, Index: place}, copies, changed)
				}
			default:
				for i := range tc.after {
					book(cals[i], Share{Rate: rate, Replicas: tc.after, Index: i}, copies, changed)
				}
			}
			excess := 0
			for _, n := range perSecond {
				excess += max(n-rate, 0)
			}
			bound := 0
			if tc.after > tc.before {
				share := (rate + tc.after - 1) / tc.after
				bound = share * int(booked-changed.Unix()+1)
			}
			t.Logf("%d over the cap in all, bound %d", excess, bound)
			if excess > bound {
				t.Errorf("%d copies over the cap of %d, more than the bound of %d", excess, rate, bound)
			}
		})
	}
}

// TestRetryRoundsAnOverflowDown: a copy that finds no room before its
// deadline comes due at the delay queue just before the deadline, never
// before its policy's delay.
func TestRetryRoundsAnOverflowDown(t *testing.T) {
	p := policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Second, Jitter: policy.NoJitter,
		MaxDuration: 10*time.Second + 123*time.Millisecond, RetryRate: 1}
	st := policy.State{StartedAt: t0}
	c := New()
	sh := Share{Replicas: 1}
	var last time.Duration
	overflow := 0
	for range 20 {
		d, o := c.Retry("orders", t0, p, st, time.Second, sh)
		if d < time.Second {
			t.Fatalf("delay %v, before the policy's", d)
		}
		if o == Overflow {
			overflow++
			last = d
		}
	}
	if overflow == 0 {
		t.Fatal("no copy overflowed a budget of 10 s at one a second")
	}
	if want := p.RoundDown(p.MaxDuration); last != want {
		t.Errorf("an overflowing copy comes due after %v, want %v (the delay queue before the deadline)", last, want)
	}
	if d, o := c.Retry("orders", t0, policy.Policy{}, st, time.Second, sh); d != time.Second || o != OnTime {
		t.Errorf("without a rate: %v, %v; want the delay as it is", d, o)
	}
}

// TestReserveProperties plays random storms: whatever comes, no copy
// comes due earlier than its policy wanted, none later than its deadline
// (when it has one), and no second holds more than its share while the
// copies put there had room before their deadline; the share changes
// mid-run, as the inbox's consumer count does.
func TestReserveProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		c := New()
		share := []float64{0.5, 1, 3, 10, 40}[r.IntN(5)]
		now := t0.Add(time.Duration(r.Int64N(int64(time.Hour))))
		perSecond := map[int64]int{}
		overflowSeconds := map[int64]bool{}
		limit := map[int64]float64{} // the share when the second was last filled
		for i := range 2000 {
			if i == 1000 {
				share = []float64{0.5, 1, 3, 10, 40}[r.IntN(5)] // a replica joined or left
			}
			now = now.Add(time.Duration(r.Int64N(int64(20 * time.Millisecond))))
			delay := up2(time.Duration(r.Int64N(int64(30 * time.Second))))
			var latest time.Duration
			if r.IntN(2) == 0 {
				latest = delay + time.Duration(r.Int64N(int64(60*time.Second)))
			}
			d, o := c.reserve("orders", now, delay, latest, Share{Rate: share, Replicas: 1}, up2)
			if d < delay {
				t.Fatalf("round %d: copy wanted in %v put in %v: earlier", round, delay, d)
			}
			if latest > 0 && d > latest {
				t.Fatalf("round %d: copy with deadline %v put in %v: past the deadline", round, latest, d)
			}
			if (o == OnTime) != (d == delay) {
				t.Fatalf("round %d: outcome %v for %v wanted %v", round, o, d, delay)
			}
			s := now.Add(d).Unix()
			perSecond[s]++
			limit[s] = share
			if o == Overflow {
				overflowSeconds[s] = true
			}
		}
		for s, n := range perSecond {
			if !overflowSeconds[s] && float64(n) > limit[s]+1+40 {
				for i := s - 2; i <= s+2; i++ {
					t.Logf("second %d: %d copies, share %v, overflow %v", i, perSecond[i], limit[i], overflowSeconds[i])
				}
				// +1 for the fractional spread, +40 for a second filled
				// before the share fell.
				t.Fatalf("round %d: second %d holds %d copies at share %v", round, s, n, limit[s])
			}
		}
	}
}

// TestOriginsAreBounded: a calendar forgets the least recently used origin
// past MaxOrigins.
func TestOriginsAreBounded(t *testing.T) {
	c := New()
	for i := range 3 * MaxOrigins {
		c.reserve(fmt.Sprintf("q%d", i), t0, time.Second, 0, Share{Rate: 1, Replicas: 1}, up2)
		c.reserve("hot", t0, time.Second+time.Duration(i)*time.Second, 0, Share{Rate: 1, Replicas: 1}, up2)
	}
	if n := c.originCount(); n != MaxOrigins {
		t.Errorf("%d origins held, want at most %d", n, MaxOrigins)
	}
	if _, ok := c.origins["hot"]; !ok {
		t.Error("the origin used all along was forgotten")
	}
}

func TestBeyondTheHorizonIsNotCapped(t *testing.T) {
	c := New()
	for range 10 {
		if d, o := c.reserve("orders", t0, 2*time.Hour, 0, Share{Rate: 1, Replicas: 1}, up2); d != 2*time.Hour || o != OnTime {
			t.Fatalf("a copy due in 2h: %v, %v; want it as it is", d, o)
		}
	}
}

func BenchmarkReserveStorm(b *testing.B) {
	c := New()
	for i := 0; b.Loop(); i++ {
		c.reserve("orders", t0.Add(time.Duration(i)*time.Millisecond), time.Second, time.Hour, Share{Rate: 40, Replicas: 1}, up2)
	}
}

// TestFloorDiv: seconds before the epoch divide downwards, as the
// shares' arithmetic needs.
func TestFloorDiv(t *testing.T) {
	for _, tt := range []struct{ a, b, want int64 }{
		{7, 2, 3}, {6, 2, 3}, {-7, 2, -4}, {-6, 2, -3}, {7, -2, -4}, {0, 3, 0},
	} {
		if got := floorDiv(tt.a, tt.b); got != tt.want {
			t.Errorf("floorDiv(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
