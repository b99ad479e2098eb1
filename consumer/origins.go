package consumer

import (
	"regexp"
	"sync"
)

// The origin label of rebound_messages_retried_total and
// rebound_messages_parked_total (REBOUND_METRICS_ORIGINS): which service's
// queue a retry or a park was for, so that a dashboard or an alert can
// name it. A label value is a time series for as long as Prometheus keeps
// it, and origin queue names come from the broker's record of where a
// message failed, so the values are bounded twice: only origins the
// configured expression matches get their own value, and only the first
// originLabelLimit of those a replica sees; every other one is "other".
// Off (no expression), the label is empty, which Prometheus stores as no
// label at all.

// originLabelLimit is the most origin values one replica gives their own
// series, per counter and policy.
const originLabelLimit = 100

// otherOrigin is the value of every origin without its own.
const otherOrigin = "other"

// originLabels picks the origin label's value. Safe for concurrent use.
type originLabels struct {
	match *regexp.Regexp // nil: the label is off
	mu    sync.Mutex
	own   map[string]bool // origins with a value of their own
}

func newOriginLabels(match *regexp.Regexp) *originLabels {
	return &originLabels{match: match, own: map[string]bool{}}
}

// value returns the label value for origin.
func (o *originLabels) value(origin string) string {
	if o == nil || o.match == nil {
		return ""
	}
	if origin == "" || !o.match.MatchString(origin) {
		return otherOrigin
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.own[origin] {
		return origin
	}
	if len(o.own) >= originLabelLimit {
		return otherOrigin
	}
	o.own[origin] = true
	return origin
}
