package main

// `rebound topology`: print what rebound needs on the broker as RabbitMQ
// definitions JSON, or declare it now. Both work from republisher.Topology,
// the description the sidecar itself declares from.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/config"
)

const topologyUsage = `usage: rebound topology <command> [flags]

commands:
  print    write the exchanges, queues, bindings, the policy that runs
           classic delay queues lazy and an example dead-letter policy for
           application queues as RabbitMQ definitions JSON, for review or
           for rabbitmqctl import_definitions
  declare  declare the exchanges, queues and bindings on the broker now

Delay queues (REBOUND_DELAY_QUEUE_PREFIX + milliseconds) are not included:
rebound declares each one the first time it needs that delay.
Each command takes -h.`

func runTopology(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"topology: missing command\n" + topologyUsage}
	}
	switch args[0] {
	case "print":
		return topologyPrint(args[1:], environ, stdout, stderr)
	case "declare":
		return topologyDeclare(ctx, args[1:], environ, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, topologyUsage)
		return nil
	}
	return usageError{fmt.Sprintf("topology: unknown command %q\n%s", args[0], topologyUsage)}
}

// The policies `topology print` writes: the example for application
// queues, and the one for delay queues, named as deploy/rabbitmq/setup.sh
// names it.
const (
	deadLetterPolicyName = "rebound-dead-letter"
	lazyDelayPolicyName  = "rebound-delay-queues-lazy"
)

func topologyPrint(args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("topology print", flag.ContinueOnError)
	pattern := fs.String("app-pattern", `^app\.`, "`regexp` of the application queues the example dead-letter policy applies to (empty: no policy)")
	if done, err := parseFlags(fs, args, `usage: rebound topology print [flags]

Writes RabbitMQ definitions JSON for the virtual host of REBOUND_AMQP_URL:
load it with `+"`rabbitmqctl import_definitions FILE`"+` or the management UI.
The dead-letter policy makes matching application queues dead-letter to
rebound; a queue declared with its own x-dead-letter-exchange argument
ignores it. With classic queues, a second policy runs the delay queues in
lazy mode, which keeps retries on time on RabbitMQ before 3.12 (later
versions ignore it).`, stderr); done || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("topology print: unexpected argument %q", fs.Arg(0))}
	}
	cfg, err := config.Load(environ)
	if err != nil {
		return err
	}
	vhost := cfg.Vhost()
	topo := topology(cfg)
	defs := topo.Definitions(vhost)
	if !topo.Quorum {
		defs.Policies = append(defs.Policies, topo.LazyDelayQueuePolicy(vhost, lazyDelayPolicyName))
	}
	if *pattern != "" {
		defs.Policies = append(defs.Policies, topo.DeadLetterPolicy(vhost, deadLetterPolicyName, *pattern))
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(defs); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "rebound: delay queues (%s<ms>) are not listed: rebound declares each on first use\n", cfg.DelayQueuePrefix)
	return nil
}

func topologyDeclare(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("topology declare", flag.ContinueOnError)
	if done, err := parseFlags(fs, args, `usage: rebound topology declare

Declares rebound's exchanges, queues and bindings (all durable) on the
broker of REBOUND_AMQP_URL now. It is idempotent. Application queues and
their dead-letter policy are left to you (see rebound topology print).`, stderr); done || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("topology declare: unexpected argument %q", fs.Arg(0))}
	}
	cfg, err := config.Load(environ)
	if err != nil {
		return err
	}
	conn, err := dialCLI(cfg, "topology declare")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	topo := topology(cfg)
	if err := topo.Declare(ch); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("%w (it exists with other settings: compare with `rebound topology print`)", err)
		}
		return err
	}
	vhost := cfg.Vhost()
	fmt.Fprintf(stdout, "declared in virtual host %q:\n", vhost)
	for _, e := range topo.Exchanges() {
		fmt.Fprintf(stdout, "  exchange %s (%s, durable)\n", e.Name, e.Kind)
	}
	for _, q := range topo.Queues() {
		fmt.Fprintf(stdout, "  queue %s (durable%s)\n", q.Name, formatArgs(q.Args))
	}
	for _, b := range topo.Bindings() {
		fmt.Fprintf(stdout, "  binding %s -> %s\n", b.Exchange, b.Queue)
	}
	return nil
}

func formatArgs(args amqp.Table) string {
	if len(args) == 0 {
		return ""
	}
	parts := make([]string, 0, len(args))
	for k, v := range args {
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(parts)
	return ", " + strings.Join(parts, ", ")
}
