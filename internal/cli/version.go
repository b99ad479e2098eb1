package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/rebound-mq/rebound/internal/buildinfo"
)

const versionUsage = `usage: rebound version

Prints the running build's version, the revision it was built from and
the Go version that built it. rebound --version does the same.`

// runVersion is `rebound version`.
func runVersion(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if done, err := parseFlags(fs, args, versionUsage, 0, in); done || err != nil {
		return err
	}
	fmt.Fprintln(in.stdout, buildinfo.Read())
	return nil
}
