package cli

// `rebound parked expire`: delete parked messages older than
// REBOUND_PARKED_RETENTION, exported first when asked. The broker work is
// parking.Queue.Expire.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rebound-mq/rebound/internal/parking"
	"github.com/rebound-mq/rebound/policy"
)

const parkedExpireUsage = `usage: rebound parked expire --yes [--export FILE] [flags]

Deletes the parked messages parked longer ago than REBOUND_PARKED_RETENTION
(a message that does not say when it was parked never expires), and only
them: the sidecar never deletes a parked message. With --export FILE each
message is first appended to FILE as a line of JSON, body included
(base64), and the file is synced before any message it holds is removed.
--dry-run removes nothing (an export still writes: a backup). The other
filters narrow what expires. Meant to run on a schedule (a Kubernetes
CronJob: deploy/kustomize/components/parked-expire).`

func runParkedExpire(ctx context.Context, args []string, in invocation) error {
	fs := flag.NewFlagSet("parked expire", flag.ContinueOnError)
	f := filterFlags(fs)
	export := fs.String("export", "", "append each expiring message to this `file` as JSON lines, body included, before it is removed")
	dryRun := fs.Bool("dry-run", false, "report what would expire (and export it), remove nothing")
	yes := fs.Bool("yes", false, "really delete the expired messages")
	if done, err := parseFlags(fs, args, parkedExpireUsage, 0, in); done || err != nil {
		return err
	}
	if err := checkFilter(f); err != nil {
		return err
	}
	if !*yes && !*dryRun {
		return usageError{"expire deletes messages for good: add --yes (or --dry-run to see what would expire)"}
	}
	cfg, conn, err := loadAndConnect(ctx, in, "parked expire")
	if err != nil {
		return err
	}
	defer conn.Close()
	if cfg.ParkedRetention <= 0 {
		return usageError{"REBOUND_PARKED_RETENTION is not set: nothing expires (set it to how long parked messages are kept, such as 336h)"}
	}
	q := parking.Queue{Conn: conn, Router: cfg.Router(), ConfirmTimeout: cfg.ConfirmTimeout}
	var exporter parking.Exporter
	if *export != "" {
		file, err := os.OpenFile(*export, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("open the export: %w", err)
		}
		defer file.Close()
		exporter = parking.NewJSONLines(file, file.Sync, time.Now)
	}
	res, err := q.Expire(ctx, cfg.ParkedRetention, *f, time.Now(), exporter, *dryRun)
	verb := "expired"
	if *dryRun {
		verb = "would expire"
	}
	fmt.Fprintf(in.stdout, "%s %d messages parked more than %s ago (%d parked read)", verb, res.Matched, policy.FormatDuration(cfg.ParkedRetention), res.Scanned)
	if *export != "" {
		fmt.Fprintf(in.stdout, "; %d exported to %s", res.Exported, *export)
	}
	fmt.Fprintf(in.stdout, "; %d removed\n", res.Removed)
	if err != nil {
		return fmt.Errorf("expire from %s: %w", q.Name(), err)
	}
	if !*dryRun && res.Removed != res.Matched {
		return errors.New("not every expired message was removed")
	}
	return nil
}
