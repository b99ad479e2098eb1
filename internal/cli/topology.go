package cli

// `rebound topology`: print what rebound needs on the broker as RabbitMQ
// definitions JSON, or declare it now. Both work from topology.Topology,
// the description the sidecar itself declares from.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/topology"
)

// deadLetterPolicyName is the policy `topology print` writes for
// application queues.
const deadLetterPolicyName = "rebound-dead-letter"

const topologyPrintUsage = `usage: rebound topology print [flags]

Writes RabbitMQ definitions JSON for the virtual host of REBOUND_AMQP_URL:
load it with ` + "`rabbitmqctl import_definitions`" + ` or the management UI. It
holds the exchanges, queues and bindings rebound declares, rebound's own
policies, and the dead-letter policy that sends the application queues'
failed messages to rebound: for the queues REBOUND_ORIGIN_QUEUES allows
(rebound sends messages back to those only), else for the queues the
named policies serve (REBOUND_POLICY_<NAME>_QUEUES), else none; --app-pattern
overrides it. Rebound's own policies:

  - classic queues: rebound-delay-queues-lazy runs the delay queues lazy,
    which keeps retries on time on RabbitMQ before 3.12 (later versions
    ignore it);
  - quorum queues: rebound-inbox-dead-letter makes the inbox dead-letter to
    the parking queue, and on RabbitMQ 4.0 and later
    rebound-parked-no-delivery-limit lifts the parking queue's delivery
    limit. The queues' arguments say the same; the policies are for queues
    an earlier rebound declared without them (see docs/upgrading.md).

With quorum queues the definitions depend on the broker's version: it is
asked over REBOUND_AMQP_URL unless --rabbitmq names it. A queue declared
with its own x-dead-letter-exchange argument ignores the application
policy. Delay queues (REBOUND_DELAY_QUEUE_PREFIX + milliseconds) and their
fanout exchanges (REBOUND_DELAY_EXCHANGE + "." + milliseconds) are not
included: rebound declares each pair the first time it needs that delay.`

func runTopologyPrint(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("topology print", flag.ContinueOnError)
	pattern := fs.String("app-pattern", "", "`regexp` of the application queues the dead-letter policy applies to (default: REBOUND_ORIGIN_QUEUES, else the named policies' queues)")
	version := fs.String("rabbitmq", "", "the broker's `version` (such as 3.10 or 4.3), for quorum queues; empty: ask the broker")
	if done, err := parseFlags(fs, args, topologyPrintUsage, 0, in); done || err != nil {
		return err
	}
	if *version != "" && !topology.VersionAtLeast(*version, 0, 0) {
		return usageError{fmt.Sprintf("--rabbitmq %q: want a version such as 3.10 or 4.3", *version)}
	}
	cfg, err := loadConfig(in)
	if err != nil {
		return err
	}
	topo := cfg.Topology()
	if topo.Quorum {
		if *version == "" {
			conn, err := connect(ctx, in, cfg, "topology print")
			if err != nil {
				return fmt.Errorf("%w (the definitions for quorum queues depend on the broker's version: pass --rabbitmq to print them offline)", err)
			}
			*version, _ = conn.Properties["version"].(string)
			conn.Close()
		}
		topo = topo.ForServer(amqp.Table{"version": *version})
	}
	vhost := cfg.Vhost()
	defs := topo.Definitions(vhost)
	defs.Policies = append(defs.Policies, topo.Policies(vhost)...)
	app := appQueues(cfg)
	if *pattern != "" {
		app = *pattern
	}
	if app != "" {
		defs.Policies = append(defs.Policies, topo.DeadLetterPolicy(vhost, deadLetterPolicyName, app))
	} else {
		fmt.Fprintln(in.stderr, "rebound topology print: no dead-letter policy for application queues: set REBOUND_ORIGIN_QUEUES (or pass --app-pattern)")
	}
	enc := json.NewEncoder(in.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(defs); err != nil {
		return err
	}
	fmt.Fprintf(in.stderr, "rebound topology print: delay queues (%s<ms>) and their exchanges (%s.<ms>) are not listed: rebound declares each pair on first use\n", cfg.DelayQueuePrefix, cfg.DelayExchange)
	return nil
}

const topologyDeclareUsage = `usage: rebound topology declare

Declares rebound's exchanges, queues and bindings (all durable) on the
broker of REBOUND_AMQP_URL now, as the sidecar does when it starts. It is
idempotent, and takes over what an earlier rebound declared (see
docs/upgrading.md). Policies, application queues and their dead-letter policy are
left to you (see rebound topology print).`

func runTopologyDeclare(ctx context.Context, args []string, in invocation) error {
	cfg, done, err := parseConfigCommand("topology declare", topologyDeclareUsage, args, in)
	if done || err != nil {
		return err
	}
	conn, err := connect(ctx, in, cfg, "topology declare")
	if err != nil {
		return err
	}
	defer conn.Close()
	topo := cfg.Topology().ForServer(conn.Properties)
	notices, err := declarer.Declare(conn, topo)
	for _, n := range notices {
		fmt.Fprintln(in.stderr, "rebound topology declare: notice:", n)
	}
	if err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("%w (it exists with other settings: compare with `rebound topology print`)", err)
		}
		return err
	}
	fmt.Fprintf(in.stdout, "declared in virtual host %q:\n", cfg.Vhost())
	for _, line := range topo.Describe() {
		fmt.Fprintln(in.stdout, "  "+line)
	}
	return nil
}

// appQueues is the pattern of the queues that dead-letter to rebound, as
// the configuration implies it: REBOUND_ORIGIN_QUEUES, the queues rebound
// may send messages back to, else the queues the named policies serve,
// else "" (any queue: no pattern to give a policy).
func appQueues(cfg config.Config) string {
	if cfg.OriginQueues != "" {
		return cfg.OriginQueues
	}
	var parts []string
	for _, p := range cfg.Named {
		parts = append(parts, "(?:"+p.Queues+")")
	}
	return strings.Join(parts, "|")
}
