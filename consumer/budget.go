package consumer

import (
	"time"

	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/calendar"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// The retry rate budget (REBOUND_RETRY_RATE): each replica sends an
// origin queue at most its share of the policy's rate, the rate over the
// inbox's consumers, keeping the calendar of when its copies come due
// (package calendar).

// consumerMemory is how long a consumer count read keeps counting
// towards the share. A replica replacing its inbox consumer for a new
// prefetch (inbox.refit) has none for a moment, and a count read then
// would hand every other replica a larger share, and the replicas
// together would pass the cap; so the share divides by the largest count read within consumerMemory. A
// replica that joins lowers the others' share at once, one that leaves
// raises it that much later: the safe way.
const consumerMemory = 3 * inboxEvery

// consumerRead is one reading of the inbox's consumer count.
type consumerRead struct {
	at time.Time
	n  int
}

// setConsumers records the inbox's consumer count as read at now; the
// largest count read within consumerMemory divides every policy's rate
// into this replica's share.
func (s *Sidecar) setConsumers(n int, now time.Time) {
	if n < 1 {
		n = 1 // this replica consumes, whatever the broker says
	}
	s.consumerMu.Lock()
	s.consumerReads = append(s.consumerReads, consumerRead{at: now, n: n})
	recent := s.consumerReads[:0]
	for _, r := range s.consumerReads {
		if now.Sub(r.at) < consumerMemory {
			recent = append(recent, r)
			n = max(n, r.n)
		}
	}
	s.consumerReads = recent
	s.consumerMu.Unlock()
	if s.consumers.Swap(int64(n)) == int64(n) {
		return
	}
	for _, p := range s.opt.Router.Policies.All() {
		s.m.RateShare.WithLabelValues(p.Name).Set(s.share(p))
	}
}

// share is the copies a second this replica may send each origin of p.
func (s *Sidecar) share(p *policy.Named) float64 {
	return p.RetryRate / float64(max(s.consumers.Load(), 1))
}

// budget applies the retry rate budget to a retry: its copy comes due no
// earlier than the policy wants and no later than the policy's deadline,
// in a second that still has room for the origin, and the decision says
// when. A park, and a policy without a rate, pass as they are.
func (ss *session) budget(rt route.Route, st headers.State, now time.Time) route.Route {
	s := ss.s
	p := rt.Policy
	if !rt.Decision.Retry || p.RetryRate <= 0 {
		return rt
	}
	up := func(d time.Duration) time.Duration { return policy.RoundUp(d, p.Digits()) }
	delay, outcome := s.calendar.Reserve(rt.Origin.Queue, now, rt.Decision.Delay, p.Remaining(st.State, now), s.share(p), up)
	if outcome == calendar.OnTime {
		return rt
	}
	if outcome == calendar.Overflow {
		// At the deadline, which is to the millisecond: a delay queue for
		// it would be one of a kind, and a storm would make thousands.
		// The delay queue just before it, never before the policy's.
		delay = max(policy.RoundDown(delay, p.Digits()), rt.Decision.Delay)
	}
	added := delay - rt.Decision.Delay
	rt.Decision.Delay = delay
	switch outcome {
	case calendar.Deferred:
		s.m.RateDeferred.WithLabelValues(p.Name).Inc()
		s.m.RateDeferral.WithLabelValues(p.Name).Observe(added.Seconds())
	case calendar.Overflow:
		s.m.RateOverflow.WithLabelValues(p.Name).Inc()
		if added > 0 {
			s.m.RateDeferral.WithLabelValues(p.Name).Observe(added.Seconds())
		}
	}
	if s.deferrals.first(rt.Origin.Queue, now) {
		s.log.Info("retry rate budget: copies to this origin queue come back later than their policy wanted",
			zap.String("origin", quoteShort(rt.Origin.Queue)), zap.String("policy", p.Name),
			zap.Float64("share_per_second", s.share(p)), zap.Duration("added", added), zap.Bool("over_budget", outcome == calendar.Overflow))
	}
	return rt
}

// deferralLog remembers, per origin, when it last logged a deferral, so
// that a storm logs one line per origin a minute. It forgets origins it
// has not logged for a minute once it holds calendar.MaxOrigins of them.
type deferralLog struct {
	last map[string]time.Time
}

func (l *deferralLog) first(origin string, now time.Time) bool {
	if at, ok := l.last[origin]; ok && now.Sub(at) < time.Minute {
		return false
	}
	if len(l.last) >= calendar.MaxOrigins {
		for o, at := range l.last {
			if now.Sub(at) >= time.Minute {
				delete(l.last, o)
			}
		}
	}
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	l.last[origin] = now
	return true
}
