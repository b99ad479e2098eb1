// Package calendar keeps the retry rate budget of one replica
// (REBOUND_RETRY_RATE, DESIGN.md "Retry rate budget"): per origin queue,
// how many copies it has scheduled to come due in each second, so that in
// an outage the retries of thousands of messages that failed together
// come back to the failing dependency no faster than the budget allows.
//
// Each replica books alone, its Share of the rate: the rate over the
// replicas, and its place among them. A share that is not a whole number
// of copies a second is honoured over time, the fraction carried from
// second to second, and each replica's fractional copies fall in seconds
// of their own: with the places 0 to n−1 of n replicas, the copies all of
// them allow in any one second add up to the rate's (exactly the rate,
// for a whole rate), never a copy more (Share.capacity).
//
// A copy whose second is full moves to the next second with room: later,
// never earlier. A delay queue holds whole delays of a few significant
// digits (policy.Policy.RoundUp), so the copy moves to the next delay
// that can be queued and lands in a second with room. It never moves past its
// deadline (the end of its policy's budget): one that finds no room before
// it comes due at the deadline anyway, and is counted as overflow. The
// budget never parks a message the policy would retry.
//
// This is the only state rebound keeps. It is bounded: at most MaxOrigins
// origins (the least recently used is forgotten past that), each a ring of
// the seconds of the next Horizon at 8 bytes a second (28 KiB an origin,
// 7 MiB for MaxOrigins); a copy due later than that is not capped (a copy
// waiting that long has long been spread by its policy's jitter). It is
// lost on restart: a restarted replica can briefly send an origin more
// than its share.
//
// A Calendar is safe for concurrent use. It reads no clock: the caller
// says what time it is.
package calendar

import (
	"math"
	"sync"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// Limits of what a Calendar holds.
const (
	// MaxOrigins is how many origin queues a calendar keeps. Origins come
	// from the broker's record and the allowlist, not from what a producer
	// writes, but the bound holds whatever they are.
	MaxOrigins = 256
	// Horizon is how far ahead a calendar books seconds.
	Horizon = time.Hour
)

const horizonSeconds = int64(Horizon / time.Second)

// Outcome says what the budget did to a copy.
type Outcome int

// Outcomes of Reserve.
const (
	OnTime   Outcome = iota // its second had room, or it is not capped
	Deferred                // moved later, to a second with room
	Overflow                // no room before its deadline: it comes due at the deadline, over the budget
)

// Calendar books copies per origin and second. The zero value is not
// usable; call New.
type Calendar struct {
	mu      sync.Mutex
	origins map[string]*origin
	tick    uint64 // a counter of bookings, for least recently used
}

// origin is the calendar of one origin queue: a ring of the copies booked
// in each second of the next Horizon.
type origin struct {
	counts []uint32 // counts[s % horizonSeconds] for second s
	second []uint32 // which second each slot holds, in Unix seconds (until 2106)
	used   uint64   // the calendar's tick when last booked
	latest int64    // the latest second booked

	// share is the share in force; earlier the one before it, which
	// still bounds the seconds up to until (0: none). See adopt.
	share, earlier Share
	until          int64
}

// New returns an empty calendar.
func New() *Calendar {
	return &Calendar{origins: map[string]*origin{}}
}

// originCount reports how many origin queues the calendar holds.
func (c *Calendar) originCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.origins)
}

// Share is one replica's part of a retry rate: Rate copies a second for
// all replicas together, over Replicas of them, this one at Index among
// them (0 to Replicas−1; taken modulo Replicas). A Rate of 0 or less caps
// nothing.
type Share struct {
	Rate     float64
	Replicas int
	Index    int
}

// PerSecond is the copies a second the share allows on average.
func (sh Share) PerSecond() float64 { return sh.Rate / float64(sh.replicas()) }

func (sh Share) replicas() int { return max(sh.Replicas, 1) }

// capacity is how many copies fit in second s: the whole copies of
// (s+1)·Rate+Index over Replicas less those of s·Rate+Index. Over the
// seconds they add up to the share, the fraction carried; and over the
// places 0 to n−1, by Hermite's identity (Σᵢ ⌊(x+i)/n⌋ = ⌊x⌋), they add
// up to ⌊(s+1)·Rate⌋ − ⌊s·Rate⌋ in every second: the rate, never more.
func (sh Share) capacity(s int64) uint32 {
	n := int64(sh.replicas())
	i := int64(sh.Index) % n
	if i < 0 {
		i += n
	}
	var c float64
	if r := sh.Rate; r == math.Trunc(r) && r < 1<<20 {
		// Whole rates in integers: exact whatever the second.
		rate := int64(r)
		c = float64(floorDiv((s+1)*rate+i, n) - floorDiv(s*rate+i, n))
	} else {
		c = math.Floor((float64(s+1)*r+float64(i))/float64(n)) - math.Floor((float64(s)*r+float64(i))/float64(n))
	}
	if c < 0 {
		return 0
	}
	if c > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(c)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// Retry applies the retry rate budget of policy p to a retry to origin
// key decided at now, in state st, after delay, at this replica's share
// sh, and returns the delay to give its copy: no earlier than the policy
// wants, no later than the policy's deadline, in a second that still has
// room. A copy that finds no room before the deadline comes due at the
// delay queue just before the deadline (which is to the millisecond: a
// queue for it would be one of a kind, and a storm would make thousands),
// never before the policy's delay. The sidecar and `rebound simulate`
// both call it.
func (c *Calendar) Retry(key string, now time.Time, p policy.Policy, st policy.State, delay time.Duration, sh Share) (time.Duration, Outcome) {
	if p.RetryRate <= 0 {
		return delay, OnTime
	}
	sh.Rate = p.RetryRate
	up := func(d time.Duration) time.Duration { return p.RoundUp(d) }
	d, o := c.reserve(key, now, delay, p.Remaining(st, now), sh, up)
	if o == Overflow {
		d = max(p.RoundDown(d), delay)
	}
	return d, o
}

// reserve books one copy for origin key, wanted at now+delay, at share
// sh, and returns the delay to give it. latest is the most the delay may
// become (the end of the policy's budget); 0 or less means no deadline.
// up gives, for a delay, the least delay not below it that a delay queue
// can hold (Policy.RoundUp).
func (c *Calendar) reserve(key string, now time.Time, delay, latest time.Duration, sh Share, up func(time.Duration) time.Duration) (time.Duration, Outcome) {
	if sh.Rate <= 0 || math.IsNaN(sh.Rate) || math.IsInf(sh.Rate, 0) {
		return delay, OnTime
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.origin(key)
	o.adopt(sh)
	d := delay
	for {
		s := now.Add(d).Unix()
		if d >= Horizon {
			if d == delay {
				return d, OnTime // beyond what the calendar books: not capped
			}
			// No room in the whole horizon: this storm is larger than the
			// budget can spread. It goes at the horizon, over budget.
			return d, Overflow
		}
		if latest > 0 && d > latest {
			// No room before the deadline: the deadline, over budget.
			last := max(latest, delay)
			o.book(now.Add(last).Unix())
			return last, Overflow
		}
		if o.count(s) < o.capacity(s) {
			o.book(s)
			return d, outcome(d, delay)
		}
		// Full: the same place in the next second, as a delay queue can
		// hold it.
		d = up(d + time.Second)
	}
}

func outcome(d, wanted time.Duration) Outcome {
	if d > wanted {
		return Deferred
	}
	return OnTime
}

// origin returns key's calendar, making room for it.
func (c *Calendar) origin(key string) *origin {
	c.tick++
	if o, ok := c.origins[key]; ok {
		o.used = c.tick
		return o
	}
	if len(c.origins) >= MaxOrigins {
		var oldest string
		var oldestUse uint64 = math.MaxUint64
		for k, o := range c.origins {
			if o.used < oldestUse {
				oldest, oldestUse = k, o.used
			}
		}
		delete(c.origins, oldest)
	}
	o := &origin{counts: make([]uint32, horizonSeconds), second: make([]uint32, horizonSeconds), used: c.tick}
	c.origins[key] = o
	return o
}

func (o *origin) slot(s int64) int {
	i := s % horizonSeconds
	if i < 0 {
		i += horizonSeconds
	}
	return int(i)
}

// count is how many copies are booked in second s.
func (o *origin) count(s int64) uint32 {
	i := o.slot(s)
	if o.second[i] != uint32(s) {
		return 0 // the slot holds a second long past, or none
	}
	return o.counts[i]
}

// adopt makes sh the share in force. A share that changes (a replica
// joined or left, or this one moved place) applies in full only past the
// seconds already booked, and a second of margin for each copy the old
// share held per second below one: in those, the other replicas booked
// their parts at the old shares too (the one that left among them, whose
// copies still come due there), so this replica books there no more than
// either share allows. A replica that joins cannot know what the others
// booked before it came; that is the bound of the overshoot.
func (o *origin) adopt(sh Share) {
	if sh == o.share {
		return
	}
	if old := o.share.PerSecond(); o.share.Rate > 0 && o.latest > 0 {
		// Changes in a row (a replica left, then this one moved place):
		// the smallest share still bounds every second booked under it.
		if o.until < o.latest || o.share.PerSecond() < o.earlier.PerSecond() {
			o.earlier = o.share
		}
		o.until = max(o.until, o.latest+int64(math.Ceil(1/old)))
	}
	o.share = sh
}

// capacity is how many copies fit in second s at the share in force
// then.
func (o *origin) capacity(s int64) uint32 {
	if s <= o.until {
		return min(o.earlier.capacity(s), o.share.capacity(s))
	}
	return o.share.capacity(s)
}

func (o *origin) book(s int64) {
	o.latest = max(o.latest, s)
	i := o.slot(s)
	if o.second[i] != uint32(s) {
		o.second[i], o.counts[i] = uint32(s), 0
	}
	if o.counts[i] < math.MaxUint32 {
		o.counts[i]++
	}
}
