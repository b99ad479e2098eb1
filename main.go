// Command rebound is a retry sidecar for RabbitMQ: it consumes messages
// dead-lettered by an application queue, decides with a stateless policy
// whether and when to retry each one, and republishes it into a per-delay
// TTL queue that hands it back to the application queue, or parks it.
//
// Usage:
//
//	rebound [run]     run the sidecar
//	rebound schedule  print the delay schedule the configured policy produces
//	rebound simulate burst|outage  play the configured policy against a struggling service
//	rebound config check  validate the configuration without connecting
//
// Configuration comes from REBOUND_* environment variables; see README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rebound-mq/rebound/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, restore the default handling so that a
		// second SIGINT or SIGTERM ends the process at once.
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// usageError is a command line the program does not understand.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// exitCode prints err, if any, and maps it to the process exit status:
// 2 for configuration and usage errors (nothing was attempted), 1 otherwise.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "rebound:", err)
	var cfgErr *config.Error
	var usage usageError
	if errors.As(err, &cfgErr) || errors.As(err, &usage) {
		return 2
	}
	return 1
}

const usage = `usage: rebound [command]

commands:
  run        run the retry sidecar (the default)
  schedule   print the delay schedule the configured policy produces
  simulate   play retry policies against a struggling service (burst, outage)
  parked     list, show, replay or purge parked messages
  topology   print (as definitions JSON) or declare what rebound needs on the broker
  config     check the configuration without connecting (rebound config check)

Each command takes -h. Configuration comes from REBOUND_* environment variables.`

// run is the whole program; main only adds signals and the exit status.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	name, rest := "run", args
	if len(args) > 0 {
		name, rest = args[0], args[1:]
	}
	switch name {
	case "run":
		return runSidecar(ctx, rest, environ, stdout, stderr)
	case "schedule":
		return runSchedule(rest, environ, stdout, stderr)
	case "simulate":
		return runSimulate(ctx, rest, environ, stdout, stderr)
	case "parked":
		return runParked(ctx, rest, environ, stdout, stderr)
	case "topology":
		return runTopology(ctx, rest, environ, stdout, stderr)
	case "config":
		return runConfig(rest, environ, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q\n%s", name, usage)}
}

// parseFlags parses args, mapping -h to a nil error with done set and any
// other problem to a usageError.
func parseFlags(fs *flag.FlagSet, args []string, usage string, stderr io.Writer) (done bool, err error) {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return false, usageError{err.Error()}
	}
	return false, nil
}
