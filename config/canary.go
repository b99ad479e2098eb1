package config

import (
	"regexp"
	"time"

	"github.com/rebound-mq/rebound/policy"
)

// CanaryMargin is added to a policy's time to park: the consumer takes
// its time too before it rejects a message.
const CanaryMargin = time.Minute

// ScheduleRows caps a schedule rebound adds up or prints (`rebound
// schedule`, a canary's time to park): a policy limited by duration alone
// can have thousands of retries.
const ScheduleRows = 1000

// CanaryWait is how long a canary replay (`parked replay --canary`, the
// console's) watches by default: the longest time one of the policies
// that can decide the replayed messages (Deciders: those whose QUEUES can
// match an origin of origins, nil for any) takes to park a message that
// fails every time, at the longest its jitter draws, plus CanaryMargin.
// A canary fails only once its policy parks it again, so a shorter watch
// cannot see it fail. It also returns the policy that set it, to say so.
func CanaryWait(set policy.Set, origins *regexp.Regexp) (time.Duration, *policy.Named) {
	var longest time.Duration
	var which *policy.Named
	for _, p := range Deciders(set, origins) {
		if d := timeToPark(p.Policy); which == nil || d > longest {
			longest, which = d, p
		}
	}
	return longest + CanaryMargin, which
}

// timeToPark is the time from a message's first failure to its park when
// every retry fails at once and waits the longest delay jitter can draw.
func timeToPark(p policy.Policy) time.Duration {
	steps, _ := p.Schedule(ScheduleRows)
	var total time.Duration
	for _, s := range steps {
		total += s.Max
	}
	if p.MaxDuration > 0 && p.Deadline != policy.Lenient {
		total = min(total, p.MaxDuration)
	}
	return total
}
