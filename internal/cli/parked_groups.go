package cli

// `rebound parked groups` (and `parked list --group-by`): the parked
// messages gathered by failure group, or by origin, reason, policy or
// error. The broker work is parking.Queue.Groups.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rebound-mq/rebound/internal/parking"
)

// readFlags are the flags of the commands that read the parking queue
// and print what matches: `parked list` and `parked groups`.
type readFlags struct {
	filter parking.Filter
	format string
	by     parking.GroupBy // "": one row a message
}

// parseReadFlags adds to fs the flags `parked list` and `parked groups`
// share, and parses and checks them; the two commands differ in the
// default of --group-by, by. done is parseFlags' (-h was answered).
func parseReadFlags(fs *flag.FlagSet, args []string, usage string, by parking.GroupBy, in invocation) (opt readFlags, done bool, err error) {
	f := filterFlags(fs)
	format := addFormatFlag(fs)
	groupBy := fs.String("group-by", string(by), "gather the matching messages by `what`: "+groupByNames())
	if done, err = parseFlags(fs, args, usage, 0, in); done || err != nil {
		return opt, done, err
	}
	if err = checkFilter(f); err != nil {
		return opt, false, err
	}
	if err = checkFormat(*format); err != nil {
		return opt, false, err
	}
	return readFlags{filter: *f, format: *format, by: parking.GroupBy(*groupBy)}, false, nil
}

func checkGroupBy(by string) error {
	if !slices.Contains(parking.GroupBys, parking.GroupBy(by)) {
		return usageError{fmt.Sprintf("--group-by %q: want one of %s", by, groupByNames())}
	}
	return nil
}

// groupByNames lists what --group-by takes.
func groupByNames() string {
	names := make([]string, len(parking.GroupBys))
	for i, by := range parking.GroupBys {
		names[i] = string(by)
	}
	return strings.Join(names, ", ")
}

// groupJSON is one row of `parked groups --format json`. Its field names
// are public interface. Origin, reason and policy are the most common
// values among the row's messages; the maps count every value ("-" for
// unknown).
type groupJSON struct {
	Key        string         `json:"key"` // the group id, or the origin, reason, policy or normalised error
	Count      int            `json:"count"`
	Origin     string         `json:"origin"`
	Reason     string         `json:"reason"`
	Policy     string         `json:"policy"`
	Error      string         `json:"error,omitempty"` // a sample error reported with the failure
	FirstAt    *time.Time     `json:"first_parked_at"`
	LastAt     *time.Time     `json:"last_parked_at"`
	Origins    map[string]int `json:"origins"`
	Reasons    map[string]int `json:"reasons"`
	Policies   map[string]int `json:"policies"`
	GroupCount int            `json:"groups"` // failure groups among the messages (1 when grouped by group)
}

// groupsJSON is the whole `parked groups --format json` document.
type groupsJSON struct {
	By      string      `json:"group_by"`
	Scanned int         `json:"scanned"`
	Matched int         `json:"matched"`
	Groups  []groupJSON `json:"groups"`
	Limited bool        `json:"limited"`
	Unread  int         `json:"unread"`
}

const parkedGroupsUsage = `usage: rebound parked groups [flags]

Reads the parking queue once, leaving every message in it, and prints one
row per failure group: how many messages, their origin, reason and policy,
a sample error, and when the first and last were parked. A group is the
origin queue and the application's error with its numbers, ids, addresses
and times taken out (or, with no error, the origin and the parked reason):
pass its id to --group of parked show, replay and purge. --group-by
gathers by origin, reason, policy or error instead. The same as
rebound parked list --group-by group.`

func runParkedGroups(ctx context.Context, args []string, in invocation) error {
	opt, done, err := parseReadFlags(flag.NewFlagSet("parked groups", flag.ContinueOnError), args, parkedGroupsUsage, parking.ByGroup, in)
	if done || err != nil {
		return err
	}
	return parkedGroups(ctx, in, opt.filter, opt.by, opt.format)
}

// parkedGroups runs `parked groups` and `parked list --group-by`.
func parkedGroups(ctx context.Context, in invocation, f parking.Filter, by parking.GroupBy, format string) error {
	if err := checkGroupBy(string(by)); err != nil {
		return err
	}
	q, conn, err := openParking(ctx, in, "parked groups")
	if err != nil {
		return err
	}
	defer conn.Close()
	l, err := q.Groups(ctx, f, by, time.Now())
	if err != nil {
		return fmt.Errorf("read %s: %w", q.Name(), err)
	}
	doc := groupsJSON{By: string(by), Scanned: l.Scanned, Matched: l.Matched, Groups: []groupJSON{}, Limited: l.Limited, Unread: l.Unread}
	for _, g := range l.Groups {
		origin, _ := parking.Most(g.Origins)
		reason, _ := parking.Most(g.Reasons)
		policy, _ := parking.Most(g.Policies)
		j := groupJSON{Key: g.Key, Count: g.Count, Origin: origin, Reason: reason, Policy: policy, Error: g.Error,
			Origins: dashed(g.Origins), Reasons: dashed(g.Reasons), Policies: dashed(g.Policies), GroupCount: len(g.Groups)}
		if !g.First.IsZero() {
			first, last := g.First, g.Last
			j.FirstAt, j.LastAt = &first, &last
		}
		doc.Groups = append(doc.Groups, j)
	}
	if format == "json" {
		enc := json.NewEncoder(in.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	tw := tabwriter.NewWriter(in.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tCOUNT\tORIGIN\tREASON\tPOLICY\tFIRST PARKED\tLAST PARKED\tERROR\n", strings.ToUpper(string(by)))
	for i, j := range doc.Groups {
		g := l.Groups[i]
		first, last := "-", "-"
		if j.FirstAt != nil {
			first, last = j.FirstAt.UTC().Format(time.RFC3339), j.LastAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", orDash(oneLine(j.Key, 60)), j.Count, more(g.Origins), more(g.Reasons), more(g.Policies),
			first, last, orDash(oneLine(j.Error, 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(in.stdout, "%d groups by %s, %d matching, %d parked read\n", len(doc.Groups), by, doc.Matched, doc.Scanned)
	if doc.Limited {
		fmt.Fprintf(in.stdout, "stopped reading at --limit %d: %d parked messages not read, and not counted above\n", f.Limit, doc.Unread)
	}
	return nil
}

// more shows the most common value of a count, and how many others there
// are: "max-retries (+1)".
func more(counts map[string]int) string {
	v, others := parking.Most(counts)
	if others == 0 {
		return orDash(v)
	}
	return fmt.Sprintf("%s (+%d)", orDash(v), others)
}
