package main

import (
	"errors"
	"io"
)

// runSchedule is replaced by the policy work (issue 2).
func runSchedule(args, environ []string, stdout, stderr io.Writer) error {
	return errors.New("schedule: not built yet")
}
