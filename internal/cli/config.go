package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

const configCheckUsage = `usage: rebound config check

Validates the REBOUND_* environment like the sidecar does at start,
TLS files included, without connecting, and lists the policies in the
order they are tried, each with its origin queues, fingerprint and
schedule. Exit status 2 and every problem when it is invalid. A REBOUND_
variable rebound does not read is a warning on stderr, with the nearest
one it does.`

// runConfigCheck implements `rebound config check`: validate the
// environment's configuration without connecting anywhere, for CI and for
// manifests.
func runConfigCheck(ctx context.Context, args []string, in invocation) error {
	cfg, done, err := parseConfigCommand("config check", configCheckUsage, args, in)
	if done || err != nil {
		return err
	}
	// The TLS files too, as `rebound run` reads them before it connects.
	if _, err := cfg.TLS(); err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "configuration OK: broker %s, inbox %s, %s queues, origin queues %s\n",
		config.Redact(cfg.AMQPURL), cfg.InboxQueue, cfg.QueueType, originQueues(cfg))
	writePolicies(in.stdout, cfg.PolicySet())
	for _, w := range cfg.Warnings {
		fmt.Fprintln(in.stderr, "rebound config check: warning:", w)
	}
	return nil
}

// writePolicies lists the policies, in the order they are tried, each
// with its queues, fingerprint and schedule.
func writePolicies(w io.Writer, set policy.Set) {
	fmt.Fprintln(w, "policies, chosen by origin queue (the first that matches decides):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tQUEUES\tFINGERPRINT\tSCHEDULE")
	for _, p := range set.All() {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Name, policyQueues(p), p.Fingerprint, p.Summary())
	}
	_ = tw.Flush()
}

// policyQueues describes the origin queues a policy serves, for people.
func policyQueues(p *policy.Named) string {
	if p.Queues == nil {
		return "every other origin"
	}
	return p.Queues.String()
}

// originQueues describes REBOUND_ORIGIN_QUEUES for people.
func originQueues(cfg config.Config) string {
	if cfg.OriginQueues == "" {
		return "any (REBOUND_ORIGIN_QUEUES unset)"
	}
	// As written, not quoted: a quoted ^orders\. reads ^orders\\. (and
	// the JSON log escapes it once more).
	return "matching " + cfg.OriginQueues
}

// policyFlags adds --policy and, where a command can pick the policy the
// way the sidecar does, --origin.
type policyFlags struct {
	name, origin string
}

func addPolicyFlags(fs *flag.FlagSet, origin bool) *policyFlags {
	f := &policyFlags{}
	fs.StringVar(&f.name, "policy", "", "the `name` of the policy to use (REBOUND_POLICIES; default: the default policy)")
	if origin {
		fs.StringVar(&f.origin, "origin", "", "use the policy the sidecar chooses for messages from this `queue`")
	}
	return f
}

// choose loads the configuration and returns the policy of its set the
// flags name.
func (f *policyFlags) choose(in invocation) (*policy.Named, error) {
	cfg, err := loadConfig(in)
	if err != nil {
		return nil, err
	}
	set := cfg.PolicySet()
	switch {
	case f.name != "" && f.origin != "":
		return nil, usageError{"--policy and --origin both choose a policy: give one"}
	case f.origin != "":
		return set.For(f.origin), nil
	case f.name == "":
		return set.Default(), nil
	}
	p, ok := set.Lookup(f.name)
	if !ok {
		names := make([]string, 0, len(set.All()))
		for _, n := range set.All() {
			names = append(names, n.Name)
		}
		return nil, usageError{fmt.Sprintf("--policy %q: no such policy; the configuration has %s", f.name, strings.Join(names, ", "))}
	}
	return p, nil
}
