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
// replicas on the inbox at the replica's place among them, keeping the
// calendar of when its copies come due (package calendar). The count is
// the inbox's consumers, read every inboxEvery; the place is the lowest
// free PlaceQueue, which the watcher holds (place.go).

// setConsumers records the inbox's consumer count as read at one
// reading. A higher count than the one in use is taken at once: a
// replica joined, and every share falls. A lower one is taken only when
// the next reading is lower too (the larger of the two): a replica
// replacing its inbox consumer for a new prefetch (inbox.refit) has none
// for a moment, and a reading then would raise every other replica's
// share, while a replica that left is gone from both.
func (s *Sidecar) setConsumers(n int) {
	n = max(n, 1) // this replica consumes, whatever the broker says
	s.consumerMu.Lock()
	in := int(s.consumers.Load())
	switch {
	case n >= in:
		s.consumerLower = 0
	case s.consumerLower == 0:
		s.consumerLower, n = n, in // held: the next reading says
	default:
		n, s.consumerLower = max(n, s.consumerLower), 0
	}
	s.consumerMu.Unlock()
	if s.consumers.Swap(int64(n)) != int64(n) {
		s.reportShares()
	}
}

// setPlace records this replica's place among the replicas (PlaceQueue),
// 0 when it holds none.
func (s *Sidecar) setPlace(i int) {
	if s.place.Swap(int64(i)) != int64(i) {
		s.reportShares()
	}
}

func (s *Sidecar) reportShares() {
	for _, p := range s.opt.Router.Policies.All() {
		s.m.RateShare.WithLabelValues(p.Name).Set(s.share(p).PerSecond())
	}
}

// share is this replica's part of p's retry rate.
func (s *Sidecar) share(p *policy.Named) calendar.Share {
	return calendar.Share{Rate: p.RetryRate, Replicas: int(max(s.consumers.Load(), 1)), Index: int(s.place.Load())}
}

// budget applies the retry rate budget to a route (route.Router.Budget)
// and counts and logs what it did.
func (ss *session) budget(rt route.Route, st headers.State, now time.Time) route.Route {
	s := ss.s
	rt = ss.router.Budget(rt, st, now, s.calendar, s.share(rt.Policy))
	name := rt.Policy.Name
	switch rt.Budget {
	case calendar.OnTime:
		return rt
	case calendar.Deferred:
		s.m.RateDeferred.WithLabelValues(name).Inc()
		s.m.RateDeferral.WithLabelValues(name).Observe(rt.Added.Seconds())
	case calendar.Overflow:
		s.m.RateOverflow.WithLabelValues(name).Inc()
		if rt.Added > 0 {
			s.m.RateDeferral.WithLabelValues(name).Observe(rt.Added.Seconds())
		}
	}
	if s.deferrals.first(rt.Origin.Queue, now) {
		s.log.Info("retry rate budget: copies to this origin queue come back later than their policy wanted",
			zap.String("origin", quoteShort(rt.Origin.Queue)), zap.String("policy", name),
			zap.Float64("share_per_second", s.share(rt.Policy).PerSecond()), zap.Duration("added", rt.Added),
			zap.Bool("over_budget", rt.Budget == calendar.Overflow))
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
