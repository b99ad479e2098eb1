package cli

// `rebound topology prune`: delete the delay queues no one uses. The
// broker work is in package delayed.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"

	"github.com/rebound-mq/rebound/internal/delayed"
	"github.com/rebound-mq/rebound/policy"
)

const topologyPruneUsage = `usage: rebound topology prune --yes [flags]

Deletes, with their exchanges, the delay queues that are empty, have no
consumer and that no running replica uses: each replica leases the delay
queues it has used within REBOUND_DELAY_QUEUE_IDLE (15m when that is 0)
in the queue REBOUND_DELAY_QUEUE_PREFIX + "in-use", at least every
minute. Quorum delay queues included, which replicas never delete. No
queue that holds a message is deleted: RabbitMQ refuses an if-empty
delete of a quorum queue, so prune first closes the way in (the queue's
exchange), checks the queue again, and deletes it only then. It also
deletes, if unused, the exchanges left by replicas that deleted their idle
classic delay queues. It says what it deleted, and what it kept and why.

It refuses to delete anything while the inbox has more consumers than
replicas have published leases (a replica older than leases, or one that
started within the last second): their use of the delay queues cannot be
seen. It finds the delay queues as rebound delayed does (--digits,
--max-delay).`

func runTopologyPrune(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("topology prune", flag.ContinueOnError)
	scan := addScanFlags(fs)
	dryRun := fs.Bool("dry-run", false, "report what would be deleted, delete nothing")
	yes := fs.Bool("yes", false, "really delete the unused delay queues")
	if done, err := parseFlags(fs, args, topologyPruneUsage, 0, in); done || err != nil {
		return err
	}
	if !*yes && !*dryRun {
		return usageError{"prune deletes delay queues: add --yes (see what it would delete first with --dry-run)"}
	}
	dp, delays, closeConns, err := openDelayed(ctx, in, scan, "topology prune", false)
	if err != nil {
		return err
	}
	defer closeConns()
	res, err := dp.Prune(ctx, delays, *dryRun)
	if res.Leases.NoQueue {
		fmt.Fprintf(in.stderr, "rebound topology prune: no queue %s: no replica of a rebound with leases has run, so none is seen to use a delay queue\n", dp.Router.Topology.InUseQueue())
	}
	if res.InboxConsumers > len(res.Leases.Replicas) && *dryRun {
		fmt.Fprintf(in.stderr, "rebound topology prune: %s (%d consumers, %d leases): without --dry-run, prune would refuse\n",
			delayed.ErrUnleased, res.InboxConsumers, len(res.Leases.Replicas))
	}
	deleted := 0
	tw := tabwriter.NewWriter(in.stdout, 0, 4, 2, ' ', 0)
	if len(res.Queues) > 0 {
		fmt.Fprintln(tw, "QUEUE\tDELAY\tMESSAGES\tACTION")
	}
	for _, q := range res.Queues {
		action := "kept: " + q.Why
		if q.Deleted {
			deleted++
			action = "deleted"
			if *dryRun {
				action = "would delete"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", q.Name, policy.FormatDuration(q.Delay), q.Messages, action)
	}
	if ferr := tw.Flush(); ferr != nil {
		return errors.Join(err, ferr)
	}
	verb := "deleted"
	if *dryRun {
		verb = "would delete"
	}
	fmt.Fprintf(in.stdout, "%s %d of %d delay queues found (%d names looked for); %d replicas lease delay queues, %d consume the inbox\n",
		verb, deleted, len(res.Queues), len(delays), len(res.Leases.Replicas), res.InboxConsumers)
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	return nil
}
