package cli

import (
	"context"
	"errors"
	"flag"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/simulate"
)

// This file is "rebound simulate": the command line around package
// simulate's commands, which own their models' flags and what they print.

func runSimulateBurst(ctx context.Context, args []string, in invocation) error {
	return runSimulate(ctx, "burst", args, in)
}

func runSimulateOutage(ctx context.Context, args []string, in invocation) error {
	return runSimulate(ctx, "outage", args, in)
}

// runSimulate parses a simulate model's flags and the ones every
// simulate command takes (how to print, where to plot, which policy to
// play), then plays it.
func runSimulate(ctx context.Context, model string, args []string, in invocation) error {
	fs := flag.NewFlagSet("simulate "+model, flag.ContinueOnError)
	cmd, err := simulate.New(model, fs)
	if err != nil {
		return err
	}
	format := addFormatFlag(fs)
	svg := fs.String("svg", "", "also write the plot to this `file`")
	which := addPolicyFlags(fs, false)
	named, done, err := which.parse(fs, args, cmd.Usage, format, in)
	if done || err != nil {
		return err
	}
	if err := cmd.Plan(named, in.environ); err != nil {
		// A --compare's configuration is checked as the environment is:
		// its error stays config's.
		var cfgErr *config.Error
		if errors.As(err, &cfgErr) {
			return err
		}
		return usageError{err.Error()}
	}
	return cmd.Run(ctx, *format, *svg, in.stdout)
}
