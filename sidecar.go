package main

import (
	"context"
	"errors"
	"io"
)

// runSidecar is replaced by the sidecar work (issue 4).
func runSidecar(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	return errors.New("run: not built yet")
}
