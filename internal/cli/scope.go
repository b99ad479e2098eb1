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

// skipNonRetryable leaves messages parked non-retryable out of a replay
// unless asked for: their consumer said a retry cannot help.
func skipNonRetryable(f *parking.Filter, include bool) {
	if !include {
		f.SkipReasons = append(f.SkipReasons, string(policy.NonRetryable))
	}
}

// defaultCanaryWait is config.CanaryWait for the replay's configuration and
// filter, said on stdout.
func defaultCanaryWait(in invocation, q parking.Queue, f *parking.Filter) time.Duration {
	wait, p := config.CanaryWait(q.Router.Policies, f.Origins)
	fmt.Fprintf(in.stdout, "canary: watching for %s, the time policy %s takes to park a message that fails every time, plus %s (--canary-wait to change)\n",
		policy.FormatDuration(wait), p.Name, policy.FormatDuration(config.CanaryMargin))
	return wait
}
