package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/rebound-mq/rebound/config"
)

// runConfig implements `rebound config check`: validate the environment's
// configuration without connecting anywhere, for CI and for manifests.
func runConfig(args, environ []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	const usage = "usage: rebound config check\n\nValidates the REBOUND_* environment like the sidecar does at start,\nwithout connecting. Exit status 2 and every problem when it is invalid."
	if len(args) == 0 || args[0] != "check" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stderr, usage)
			return nil
		}
		return usageError{"usage: rebound config check"}
	}
	if done, err := parseFlags(fs, args[1:], usage, stderr); done || err != nil {
		return err
	}
	cfg, err := config.Load(environ)
	if err != nil {
		return err
	}
	p := cfg.Policy()
	fmt.Fprintf(stdout, "configuration OK: broker %s, inbox %s, %s backoff %s..%s, %s jitter, max retries %d, max duration %s, %s queues\n",
		config.Redact(cfg.AMQPURL), cfg.InboxQueue, p.Backoff, p.MinDelay, p.MaxDelay, p.Jitter, p.MaxRetries, p.MaxDuration, cfg.QueueType)
	return nil
}
