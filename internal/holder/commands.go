package holder

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/topology"
)

// A command is `rebound delayed flush` or `cancel` for held copies: the
// holders cannot be asked directly, and a held copy is out of everyone's
// reach until it comes back to a holder. So the command is recorded in
// the hold commands stream (topology.HoldCommandsQueue), every holder
// reads it from there, and applies it to each copy of a matching origin
// that comes back to it while the command lasts. A copy comes back at
// least once a slice, so a command reaches every copy held when it was
// issued within a slice while the holders run; it lasts two slices (and a
// minute for clocks), so that a copy returned to a holder that had not yet
// read the command, just started say, is reached at its next return.

// The operations of a command.
const (
	opFlush  = "flush"  // send the copy home now
	opCancel = "cancel" // park it, reason cancelled
)

// command is one recorded flush or cancel.
type command struct {
	Op     string `json:"op"`
	Origin string `json:"origin"` // regular expression of the origin queues, unanchored
	Issued int64  `json:"issued_ms"`

	origins *regexp.Regexp
}

// newCommand returns the command op for the copies of the origin queues
// origins matches, issued at now.
func newCommand(op string, origins *regexp.Regexp, now time.Time) command {
	return command{Op: op, Origin: origins.String(), Issued: now.UnixMilli(), origins: origins}
}

// readCommand reads a command as record wrote it; a command that does not
// read is an error.
func readCommand(body []byte) (command, error) {
	var c command
	if err := json.Unmarshal(body, &c); err != nil {
		return command{}, fmt.Errorf("read hold command: %w", err)
	}
	if c.Op != opFlush && c.Op != opCancel {
		return command{}, fmt.Errorf("read hold command: op %q, want flush or cancel", c.Op)
	}
	re, err := regexp.Compile(c.Origin)
	if err != nil {
		return command{}, fmt.Errorf("read hold command: origin: %w", err)
	}
	c.origins = re
	return c, nil
}

// lasts is how long after it was issued a command is applied.
func lasts(slice time.Duration) time.Duration { return 2*slice + time.Minute }

// until is when c stops being applied, with slice REBOUND_HOLD_SLICE.
func (c command) until(slice time.Duration) time.Time {
	return time.UnixMilli(c.Issued).Add(lasts(slice))
}

// applies reports whether c applies, as of now, to a copy to origin that
// entered the hold queue at entered: one held before c was issued, while
// c lasts.
func (c command) applies(origin string, entered, now time.Time, slice time.Duration) bool {
	issued := time.UnixMilli(c.Issued)
	return c.origins != nil && entered.Before(issued) && now.Before(issued.Add(lasts(slice))) && c.origins.MatchString(origin)
}

// Flush records, in the hold commands stream of topo through conn, that
// the copies of the origin queues origins matches held as of now go home
// as each comes back to a holder. until is when the holders stop applying
// it, with slice REBOUND_HOLD_SLICE.
func Flush(ctx context.Context, conn *amqp.Connection, topo topology.Topology, origins *regexp.Regexp, now time.Time, slice time.Duration) (until time.Time, err error) {
	c := newCommand(opFlush, origins, now)
	return c.until(slice), record(ctx, conn, topo, c)
}

// Cancel is Flush that parks the copies instead (reason cancelled).
func Cancel(ctx context.Context, conn *amqp.Connection, topo topology.Topology, origins *regexp.Regexp, now time.Time, slice time.Duration) (until time.Time, err error) {
	c := newCommand(opCancel, origins, now)
	return c.until(slice), record(ctx, conn, topo, c)
}

// record records c in the hold commands stream of topo through conn,
// confirmed.
func record(ctx context.Context, conn *amqp.Connection, topo topology.Topology, c command) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("write hold command: %w", err)
	}
	queue := topo.HoldCommandsQueue().Name
	confirm, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Timestamp: time.UnixMilli(c.Issued), Body: body})
	if err != nil {
		return fmt.Errorf("record hold command in %s: %w", queue, err)
	}
	if ok, err := confirm.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("record hold command in %s: not confirmed (%v)", queue, err)
	}
	return nil
}

// commands is what one holder session has read of the commands stream.
// Safe for concurrent use.
type commands struct {
	mu   sync.Mutex
	list []command
}

func (cs *commands) add(c command) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.list = append(cs.list, c)
}

// active returns the commands that still last as of now, and forgets
// the others.
func (cs *commands) active(now time.Time, slice time.Duration) []command {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.list = slices.DeleteFunc(cs.list, func(c command) bool { return !now.Before(c.until(slice)) })
	return slices.Clone(cs.list)
}

// follow reads the commands stream on conn from the oldest command that
// may still last, into cs, until conn closes. It returns once the
// consumer is set up; reading goes on in a goroutine that ends when the
// channel closes.
func (cs *commands) follow(conn *amqp.Connection, queue string, from time.Time, onBad func(error)) (done <-chan struct{}, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(100, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch of %s: %w", queue, err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, amqp.Table{"x-stream-offset": from})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", queue, err)
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for d := range deliveries {
			if c, err := readCommand(d.Body); err != nil {
				onBad(err)
			} else {
				cs.add(c)
			}
			_ = d.Ack(false)
		}
	}()
	return finished, nil
}
