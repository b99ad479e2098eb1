package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

const configCheckUsage = `usage: rebound config check [--env-file FILE] [--strict]

Validates a configuration like the sidecar does at start, TLS files
included, without connecting, and reports in one place: the policies in
the order they are tried, each with its origin queues, fingerprint and
schedule; the policies that cannot decide anything (their QUEUES match
no queue REBOUND_ORIGIN_QUEUES allows, or only queues an earlier policy
takes); and the REBOUND_ variables rebound does not read, with the
nearest one it does. Exit status 2 and every problem when it is invalid.

The configuration is the REBOUND_* environment, or with --env-file the
file alone: a rebound.env (read as kustomize's configMapGenerator and
kubectl --from-env-file read it, so a value keeps its quotes and "(" is
an ordinary character) or a rendered ConfigMap in YAML (kubectl kustomize
output: the data of its ConfigMaps with REBOUND_ variables).

The findings about policies are judged on sampled queue names, which
proves an overlap but not its absence: see docs/configuration-check.md.
With --strict, every warning and finding is an error (exit status 2),
for CI.`

// runConfigCheck implements `rebound config check`: validate a
// configuration without connecting anywhere, for CI and for manifests.
func runConfigCheck(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	envFile := fs.String("env-file", "", "read the configuration from this `file` (dotenv or ConfigMap YAML) instead of the environment")
	strict := fs.Bool("strict", false, "treat warnings and findings as errors")
	if done, err := parseFlags(fs, args, configCheckUsage, 0, in); done || err != nil {
		return err
	}
	var notes []string
	if *envFile != "" {
		data, err := os.ReadFile(*envFile)
		if err != nil {
			return usageError{fmt.Sprintf("--env-file: %v", err)}
		}
		f, err := config.ReadFile(data)
		if err != nil {
			return usageError{fmt.Sprintf("--env-file %s: %v", *envFile, err)}
		}
		in.environ = f.Environ
		for _, n := range f.Notes {
			notes = append(notes, *envFile+": "+n)
		}
	}
	cfg, err := loadConfig(in)
	if err != nil {
		// The warnings too: an unread variable is often why a value
		// is wrong (REBOUND_MAX_RETRY beside a policy that needs it).
		for _, w := range append(notes, cfg.Warnings...) {
			fmt.Fprintln(in.stderr, "rebound config check: warning:", w)
		}
		return err
	}
	// The TLS files too, as `rebound run` reads them before it connects.
	if _, err := cfg.TLS(); err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "configuration OK: broker %s, inbox %s, %s queues, origin queues %s\n",
		config.Redact(cfg.AMQPURL), cfg.InboxQueue, cfg.QueueType, originQueues(cfg))
	writePolicies(in.stdout, cfg.PolicySet())
	findings := cfg.Findings()
	if len(findings) > 0 {
		fmt.Fprintln(in.stdout, "findings:")
		for _, f := range findings {
			fmt.Fprintln(in.stdout, "  "+f.String())
		}
	}
	warnings := append(notes, cfg.Warnings...)
	for _, w := range warnings {
		fmt.Fprintln(in.stderr, "rebound config check: warning:", w)
	}
	if n := len(warnings) + len(findings); *strict && n > 0 {
		return usageError{fmt.Sprintf("--strict: %d warnings and findings (above)", n)}
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

// refusal says, when --origin names a queue the sidecar would not send
// messages back to, what it does with them instead; "" otherwise.
func (f *policyFlags) refusal(in invocation) (string, error) {
	if f.origin == "" {
		return "", nil
	}
	cfg, err := loadConfig(in)
	if err != nil {
		return "", err
	}
	o := cfg.Router().CheckOrigin(f.origin, "")
	if o.Refused == "" {
		return "", nil
	}
	return fmt.Sprintf("messages from %s are parked %s at their first failure (%s): no policy decides them", f.origin, o.Refused, o.Why), nil
}

// parse parses the flags of a command that shows a policy (it takes no
// arguments), checks its --format and chooses the policy the flags name.
// done means -h printed the usage.
func (f *policyFlags) parse(fs *flag.FlagSet, args []string, usage string, format *string, in invocation) (named *policy.Named, done bool, err error) {
	if done, err := parseFlags(fs, args, usage, 0, in); done || err != nil {
		return nil, done, err
	}
	if err := checkFormat(*format); err != nil {
		return nil, false, err
	}
	named, err = f.choose(in)
	return named, false, err
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
