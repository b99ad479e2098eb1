package consumer

import (
	"regexp"
	"sync"
)

// The origin label of rebound_messages_retried_total and
// rebound_messages_parked_total: which service's queue a retry or a park
// was for, so that a dashboard or an alert can name it. On by default. A
// label value is a time series for as long as Prometheus keeps it, and
// origin queue names come from the broker's record of where a message
// failed, so the values are bounded twice: only origins the expression
// REBOUND_METRICS_ORIGINS matches (every one when unset) get their own
// value, and only the first REBOUND_METRICS_ORIGIN_LIMIT of those a
// replica sees; every other one is "other". The first seen rather than
// the busiest: a counter's series cannot change its label once counted,
// and the origins that fail first are the ones failing. With a limit of 0
// the label is empty, which Prometheus stores as no label at all.

// otherOrigin is the value of every origin without its own.
const otherOrigin = "other"

// originLabels picks the origin label's value. Safe for concurrent use.
type originLabels struct {
	match *regexp.Regexp // nil: every origin
	limit int            // the most origins with a value of their own; 0: the label is off
	mu    sync.Mutex
	own   map[string]bool // origins with a value of their own
}

func newOriginLabels(match *regexp.Regexp, limit int) *originLabels {
	return &originLabels{match: match, limit: limit, own: map[string]bool{}}
}

// value returns the label value for origin.
func (o *originLabels) value(origin string) string {
	if o == nil || o.limit <= 0 {
		return ""
	}
	if origin == "" || o.match != nil && !o.match.MatchString(origin) {
		return otherOrigin
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.own[origin] {
		return origin
	}
	if len(o.own) >= o.limit {
		return otherOrigin
	}
	o.own[origin] = true
	return origin
}
