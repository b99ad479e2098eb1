package cli

import (
	"fmt"
	"regexp"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/parking"
	"github.com/rebound-mq/rebound/policy"
)

// What every command that moves or deletes messages shares about its
// scope: --origin is one thing everywhere (parked list/show/replay/purge,
// delayed flush/cancel), a regular expression of origin queues,
// unanchored like REBOUND_ORIGIN_QUEUES and the policies' QUEUES, so
// that the pattern a policy or the allowlist is written with selects the
// same queues in a command; ^orders\.new$ is one queue.

// originHelp is --origin's help in every command.
const originHelp = "`regexp` of the origin queues (unanchored, like REBOUND_ORIGIN_QUEUES: ^orders\\.new$ for one queue)"

// compileOrigin compiles an --origin value; "" gives nil, any origin.
func compileOrigin(s string) (*regexp.Regexp, error) {
	if s == "" {
		return nil, nil
	}
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, usageError{fmt.Sprintf("--origin %q: not a regular expression: %v", s, err)}
	}
	return re, nil
}

// canaryMargin is added to a policy's time to park: the consumer takes
// its time too before it rejects a message.
const canaryMargin = time.Minute

// canaryWait is how long `parked replay --canary` watches by default: the
// longest time one of the policies that can decide the replayed messages
// (those whose QUEUES can match an origin --origin selects, up to the
// first that takes all of them; every policy without --origin) takes to park a message that fails every time, at
// the longest its jitter draws, plus canaryMargin. A canary fails only
// once its policy parks it again, so a shorter watch cannot see it fail.
// It also returns the policy that set it, to say so.
func canaryWait(set policy.Set, origins *regexp.Regexp) (time.Duration, *policy.Named) {
	var longest time.Duration
	var which *policy.Named
	for _, p := range config.Deciders(set, origins) {
		if d := timeToPark(p.Policy); which == nil || d > longest {
			longest, which = d, p
		}
	}
	return longest + canaryMargin, which
}

// timeToPark is the time from a message's first failure to its park when
// every retry fails at once and waits the longest delay jitter can draw.
func timeToPark(p policy.Policy) time.Duration {
	steps, _ := p.Schedule(scheduleRows)
	var total time.Duration
	for _, s := range steps {
		total += s.Max
	}
	if p.MaxDuration > 0 && p.Deadline != policy.Lenient {
		total = min(total, p.MaxDuration)
	}
	return total
}

// skipNonRetryable leaves messages parked non-retryable out of a replay
// unless asked for: their consumer said a retry cannot help.
func skipNonRetryable(f *parking.Filter, include bool) {
	if !include {
		f.SkipReasons = append(f.SkipReasons, string(policy.NonRetryable))
	}
}

// defaultCanaryWait is canaryWait for the replay's configuration and
// filter, said on stdout.
func defaultCanaryWait(in invocation, q parking.Queue, f *parking.Filter) time.Duration {
	wait, p := canaryWait(q.Router.Policies, f.Origins)
	fmt.Fprintf(in.stdout, "canary: watching for %s, the time policy %s takes to park a message that fails every time, plus %s (--canary-wait to change)\n",
		policy.FormatDuration(wait), p.Name, policy.FormatDuration(canaryMargin))
	return wait
}
