package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// delayResult is how late retries of one delay came back.
type delayResult struct {
	Delay         time.Duration
	Lazy          bool // the delay queue ran in lazy mode, set by a policy
	Samples       int
	Min, P50, P99 time.Duration
	Max           time.Duration
	BgAchieved    float64 // background messages per second
}

// measureDelay runs the whole retry loop for real: an application queue
// dead-letters to rebound, a consumer rejects each message once and times
// the redelivery. The error of one message is (redelivered at - rejected
// at) - delay; it includes every hop (dead-lettering, rebound, the delay
// queue's TTL, dead-lettering back) and the consumer's own latency.
// Meanwhile a background load of bgRate msgs/s goes through the same
// rebound into the same delay queue. With lazy, a policy puts the delay
// queue in lazy mode, as deploy/rabbitmq/setup.sh does.
func measureDelay(ctx context.Context, b *broker, delay time.Duration, lazy bool, o options, stdout io.Writer) (delayResult, error) {
	// rebound sends the copies to the delay queue of the delay rounded as
	// the default policy rounds its least delay: up.
	queued := policy.Policy{}.RoundUp(delay)
	res := delayResult{Delay: delay, Lazy: lazy}
	prefix := fmt.Sprintf("%sdelay%d.%s.", b.prefix, delay.Milliseconds(), res.mode())
	topo := topology.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
	}
	delayQueue, _ := topo.DelayQueue(queued)
	app, bg := prefix+"app", prefix+"bg"
	defer b.deleteExchanges(topo.DeadLetterExchange, topo.DelayExchangeFor(queued).Name)
	defer b.deleteQueues(app, bg, topo.InboxQueue, topo.ParkingQueue, delayQueue.Name)
	if lazy {
		p := topo.Policies("")[0] // with classic queues, the one that makes the delay queues lazy
		p.Name = prefix + "lazy"
		stop, err := b.setPolicy(ctx, p.Name, p.Pattern, p.ApplyTo, p.Priority, p.Definition)
		if err != nil {
			return res, err
		}
		defer stop()
	}
	if err := b.declareTopology(topo, queued); err != nil {
		return res, err
	}
	if err := b.declare(app, amqp.Table{"x-dead-letter-exchange": topo.DeadLetterExchange}); err != nil {
		return res, err
	}
	if err := b.declare(bg, nil); err != nil {
		return res, err
	}

	r, err := startRebound(ctx, b.url, topo, reboundSettings{Delay: delay})
	if err != nil {
		return res, err
	}
	defer func() { _ = r.stop() }()
	if _, err := b.waitFor(ctx, topo.InboxQueue, 5*time.Millisecond, 30*time.Second, func(_, consumers int) bool { return consumers > 0 }); err != nil {
		return res, fmt.Errorf("rebound did not start consuming: %w", err)
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var loadWG sync.WaitGroup
	var bgSent int
	var bgErr error
	loadStarted := time.Now()
	loadWG.Add(1)
	go func() {
		defer loadWG.Done()
		bgSent, bgErr = backgroundLoad(loadCtx, b.url, topo.InboxQueue, bg, o.bgRate)
	}()

	errs, err := rejectOnce(ctx, b.url, app, o.delayMsgs, delay)
	stopLoad()
	loadWG.Wait()
	res.BgAchieved = float64(bgSent) / time.Since(loadStarted).Seconds()
	if err != nil {
		return res, err
	}
	if bgErr != nil {
		return res, bgErr
	}
	slices.Sort(errs)
	res.Samples = len(errs)
	res.Min, res.Max = errs[0], errs[len(errs)-1]
	res.P50, res.P99 = percentile(errs, 0.50), percentile(errs, 0.99)
	fmt.Fprintf(stdout, "delay %s, %s delay queue: %d samples, error p50 %s p99 %s max %s, background %.0f msg/s\n",
		delay, res.mode(), res.Samples, res.P50, res.P99, res.Max, res.BgAchieved)
	return res, nil
}

// mode names the delay queue's mode: "lazy" when a policy set it.
func (r delayResult) mode() string {
	if r.Lazy {
		return "lazy"
	}
	return "default"
}

// percentile of sorted xs, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// rejectOnce publishes n messages to app at 50 per second, rejects each on
// its first delivery and returns, for each, its redelivery time minus the
// reject time minus delay.
func rejectOnce(ctx context.Context, url, app string, n int, delay time.Duration) ([]time.Duration, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("delay consumer: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("delay consumer: open channel: %w", err)
	}
	deliveries, err := ch.Consume(app, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("delay consumer: consume %s: %w", app, err)
	}
	pubCh, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("delay publisher: open channel: %w", err)
	}

	pubErr := make(chan error, 1)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := range n {
			select {
			case <-ctx.Done():
				pubErr <- ctx.Err()
				return
			case <-tick.C:
			}
			if err := pubCh.PublishWithContext(ctx, "", app, false, false, message(i, "")); err != nil {
				pubErr <- fmt.Errorf("delay publisher: %w", err)
				return
			}
		}
		pubErr <- nil
	}()

	rejectedAt := make(map[string]time.Time, n)
	errs := make([]time.Duration, 0, n)
	deadline := time.After(time.Duration(n)*20*time.Millisecond + delay + time.Minute)
	for len(errs) < n {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-pubErr:
			if err != nil {
				return nil, err
			}
		case <-deadline:
			return nil, fmt.Errorf("delay %s: only %d of %d messages came back: %w", delay, len(errs), n, errLost)
		case d, ok := <-deliveries:
			if !ok {
				return nil, fmt.Errorf("delay consumer: deliveries stopped")
			}
			now := time.Now()
			if _, retried := d.Headers["x-retry-count"]; !retried {
				rejectedAt[d.MessageId] = now
				if err := d.Reject(false); err != nil {
					return nil, fmt.Errorf("delay consumer: reject: %w", err)
				}
				continue
			}
			if err := d.Ack(false); err != nil {
				return nil, fmt.Errorf("delay consumer: ack: %w", err)
			}
			if at, ok := rejectedAt[d.MessageId]; ok {
				errs = append(errs, now.Sub(at)-delay)
				delete(rejectedAt, d.MessageId)
			}
		}
	}
	return errs, nil
}

// backgroundLoad publishes rate messages per second into rebound's inbox,
// each bound back to queue bg, until ctx is cancelled. It returns how many
// it sent.
func backgroundLoad(ctx context.Context, url, inbox, bg string, rate int) (int, error) {
	if rate == 0 {
		<-ctx.Done()
		return 0, nil
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return 0, fmt.Errorf("background load: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("background load: open channel: %w", err)
	}
	// Send in 10 ms slices, catching up on the ones a slow tick missed.
	const slice = 10 * time.Millisecond
	tick := time.NewTicker(slice)
	defer tick.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return sent, nil
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * float64(rate))
		for ; sent < due; sent++ {
			if err := ch.PublishWithContext(ctx, "", inbox, false, false, message(sent, bg)); err != nil {
				if ctx.Err() != nil {
					return sent, nil
				}
				return sent, fmt.Errorf("background load: %w", err)
			}
		}
	}
}

// delayTable renders how late the retries of each delay came back.
func delayTable(rs []delayResult) string {
	var sb strings.Builder
	sb.WriteString("\n| delay | delay queue | samples | error min | p50 | p99 | max | background load |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		mode := r.mode()
		if r.Lazy {
			mode += " (policy)"
		}
		fmt.Fprintf(&sb, "| %s | %s | %d | %s | %s | %s | %s | %.0f msg/s |\n", r.Delay, mode, r.Samples,
			ms(r.Min), ms(r.P50), ms(r.P99), ms(r.Max), r.BgAchieved)
	}
	return sb.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
