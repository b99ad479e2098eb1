package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/policy"
)

// scheduleRows caps the printout: a policy limited by duration alone can
// schedule millions of short retries, and nobody reads past a thousand.
const scheduleRows = config.ScheduleRows

const scheduleUsage = `usage: rebound schedule [--policy NAME | --origin QUEUE] [--format table|json]

Prints the delay schedule a policy configured by the REBOUND_* variables
produces for a message that fails every time, at once, and is always given
its nominal delay, retry by retry until the policy parks it: the default
policy, the one --policy names, or the one the sidecar chooses for
messages from the --origin queue. An --origin queue the sidecar would not
send messages back to (outside REBOUND_ORIGIN_QUEUES, or one of rebound's
own queues) gets no schedule: the line says the reason it would park
them with at their first failure (json: an empty array, the line on
stderr).

Columns (table) and fields (json):
  retry       the retry number, counted from 1 (x-retry-count is one less
              when the retry is decided)
  nominal     the backoff curve's delay, before jitter and rounding
              (table only)
  delay       the delay the message would wait without jitter: the
              nominal one with the budget deadline applied, rounded to two
              significant digits in ms as the delay queue holds it (json:
              delay_ms)
  jitter min, jitter max
              the range jitter draws the real delay from, rounded the same
              way (gaussian jitter: the 99.7 % range; decorrelated jitter
              ignores the nominal curve and grows from the previous delay
              instead) (json: min_ms, max_ms)
  cumulative  time from the first failure to the end of this delay, without
              jitter (json: cumulative_ms)

The table ends with a line saying why the schedule stops. With --format
json, the output is the JSON array alone. At most 1000 retries are
printed.`

// runSchedule is "rebound schedule".
func runSchedule(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("schedule", flag.ContinueOnError)
	format := addFormatFlag(fs)
	which := addPolicyFlags(fs, true)
	named, done, err := which.parse(fs, args, scheduleUsage, format, in)
	if done || err != nil {
		return err
	}
	if refused, err := which.refusal(in); err != nil || refused != "" {
		if err == nil && *format == "json" {
			fmt.Fprintln(in.stderr, refused)
			err = writeScheduleJSON(in.stdout, nil)
		} else if err == nil {
			_, err = fmt.Fprintln(in.stdout, refused)
		}
		return err
	}
	p := named.Policy
	steps, stop := p.Schedule(scheduleRows)
	why := stopLine(named, steps, stop)
	if *format == "table" && named.Queues != nil {
		fmt.Fprintf(in.stdout, "policy %s, for origin queues matching %s\n", named.Label(), named.Queues)
	}
	if *format == "json" {
		// The array alone: a tool reads it, and a note on stderr would
		// read like an error.
		return writeScheduleJSON(in.stdout, steps)
	}
	return writeScheduleTable(in.stdout, steps, why)
}

func writeScheduleTable(w io.Writer, steps []policy.Step, why string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// delay and cumulative are before jitter: the header says so, or
	// they read as what a message will wait.
	fmt.Fprintln(tw, "retry\tnominal\tdelay (no jitter)\tjitter min\tjitter max\tcumulative (no jitter)")
	for _, s := range steps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", s.Retry+1,
			policy.FormatDuration(s.Nominal), policy.FormatDuration(s.Delay), policy.FormatDuration(s.Min), policy.FormatDuration(s.Max), policy.FormatDuration(s.Elapsed))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write schedule: %w", err)
	}
	if _, err := fmt.Fprintln(w, why); err != nil {
		return fmt.Errorf("write schedule: %w", err)
	}
	return nil
}

// scheduleRow is one element of the JSON schedule. Its shape is public
// interface (DESIGN.md): integer milliseconds, retry counted from 1.
type scheduleRow struct {
	Retry        int   `json:"retry"`
	DelayMs      int64 `json:"delay_ms"`
	MinMs        int64 `json:"min_ms"`
	MaxMs        int64 `json:"max_ms"`
	CumulativeMs int64 `json:"cumulative_ms"`
}

func writeScheduleJSON(w io.Writer, steps []policy.Step) error {
	rows := make([]scheduleRow, 0, len(steps)) // [] rather than null when empty
	for _, s := range steps {
		rows = append(rows, scheduleRow{
			Retry:        s.Retry + 1,
			DelayMs:      s.Delay.Milliseconds(),
			MinMs:        s.Min.Milliseconds(),
			MaxMs:        s.Max.Milliseconds(),
			CumulativeMs: s.Elapsed.Milliseconds(),
		})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rows); err != nil {
		return fmt.Errorf("write schedule: %w", err)
	}
	return nil
}

// stopLine says in one sentence why the schedule ends, naming the variable
// to change for a longer or shorter one.
func stopLine(named *policy.Named, steps []policy.Step, stop policy.Decision) string {
	p, v := named.Policy, "REBOUND_"
	if named.Queues != nil {
		v = "REBOUND_POLICY_" + strings.ToUpper(strings.ReplaceAll(named.Name, "-", "_")) + "_"
	}
	after := "at the first failure"
	var elapsed time.Duration
	if len(steps) > 0 {
		after = fmt.Sprintf("after retry %d", len(steps))
		elapsed = steps[len(steps)-1].Elapsed
	}
	switch {
	case stop.Retry:
		return fmt.Sprintf("printout capped at %d retries; the policy goes on", len(steps))
	case stop.Reason == policy.MaxRetries:
		return fmt.Sprintf("parked %s: max retries %d reached (%sMAX_RETRIES)", after, p.MaxRetries, v)
	case p.Deadline == policy.Strict && elapsed < p.MaxDuration:
		return fmt.Sprintf("parked %s: the next delay, %s, would end past the %s budget (%sMAX_DURATION, %sDEADLINE=strict)",
			after, policy.FormatDuration(p.Nominal(len(steps))), policy.FormatDuration(p.MaxDuration), v, v)
	}
	return fmt.Sprintf("parked %s: budget %s reached (%sMAX_DURATION)", after, policy.FormatDuration(p.MaxDuration), v)
}
