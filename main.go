// Command rebound is a retry sidecar for RabbitMQ: it consumes messages
// dead-lettered by an application queue, decides with a stateless policy
// whether and when to retry each one, and republishes it into a per-delay
// TTL queue that hands it back to the application queue, or parks it.
//
// Usage:
//
//	rebound [run]             run the sidecar
//	rebound schedule          print the delay schedule the configured policy produces
//	rebound simulate burst    replay "Exploring backoff" with the configured policy among the contenders
//	rebound simulate outage   play the configured policy against a dependency that stops and comes back
//	rebound parked list|show|replay|purge   look into and act on the parking queue
//	rebound topology print|declare           what rebound needs on the broker
//	rebound config check      validate the configuration without connecting
//
// Configuration comes from REBOUND_* environment variables; see README.md.
// The commands live in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/rebound-mq/rebound/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, restore the default handling so that a
		// second SIGINT or SIGTERM ends the process at once.
		<-ctx.Done()
		stop()
	}()
	err := cli.Run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.ExitCode(err, os.Stderr))
}
