package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	"github.com/rebound-mq/rebound/config"
)

const configCheckUsage = `usage: rebound config check

Validates the REBOUND_* environment like the sidecar does at start,
TLS files included, without connecting. Exit status 2 and every problem
when it is invalid.`

// runConfigCheck implements `rebound config check`: validate the
// environment's configuration without connecting anywhere, for CI and for
// manifests.
func runConfigCheck(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	if done, err := parseFlags(fs, args, configCheckUsage, 0, in); done || err != nil {
		return err
	}
	cfg, err := loadConfig(in)
	if err != nil {
		return err
	}
	// The TLS files too, as `rebound run` reads them before it connects.
	if _, err := cfg.TLS(); err != nil {
		return err
	}
	p := cfg.Policy()
	fmt.Fprintf(in.stdout, "configuration OK: broker %s, inbox %s, %s backoff %s..%s, %s jitter, max retries %d, max duration %s, %s queues, origin queues %s\n",
		config.Redact(cfg.AMQPURL), cfg.InboxQueue, p.Backoff, p.MinDelay, p.MaxDelay, p.Jitter, p.MaxRetries, p.MaxDuration, cfg.QueueType,
		originQueues(cfg))
	return nil
}

// originQueues describes REBOUND_ORIGIN_QUEUES for people.
func originQueues(cfg config.Config) string {
	if cfg.OriginQueues == "" {
		return "any (REBOUND_ORIGIN_QUEUES unset)"
	}
	return "matching " + strconv.Quote(cfg.OriginQueues)
}
