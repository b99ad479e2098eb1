package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// queueLoad is how busy one classic queue's Erlang process was while it
// was sampled. A queue is one process, which runs on one core at a time,
// so a queue whose process is always busy is a limit no number of
// clients can push past.
type queueLoad struct {
	Queue      string  // name without the run's prefix
	Busy       float64 // share of samples in which the process was running or waiting for a scheduler
	Mailbox    float64 // mean number of messages waiting in its mailbox
	MaxMailbox int
}

// queueSample is what sampling a run's queue processes found.
type queueSample struct {
	Window time.Duration // sampled for this long
	Late   bool          // sampling went on after the run had ended, so the shares include idle time
	Queues []queueLoad
	Err    string // why there are no Queues
}

// busiest returns the queue whose process was busy most often.
func (p queueSample) busiest() (queueLoad, bool) {
	var top queueLoad
	for _, q := range p.Queues {
		if q.Busy > top.Busy {
			top = q
		}
	}
	return top, top.Queue != ""
}

// queueProbe is the outcome of the probed replica run.
type queueProbe struct {
	Replicas int
	Trial    replicaTrial
	queueSample
}

// trialProbe is the outcome of a probed throughput run of one contender.
type trialProbe struct {
	Contender string
	Trial     trial
	queueSample
}

// probeWindow is how long the probe samples. rabbitmqctl takes under a
// second to start, and a probed run moves three times -n messages so that
// it outlasts both: several seconds for the default 20 000.
const probeWindow = 1500 * time.Millisecond

// runProbe runs k replicas once more with 3n messages, untimed for the
// ratios, and samples their queue processes while they move messages.
func runProbe(ctx context.Context, b *broker, k, n int, stdout io.Writer) (*queueProbe, error) {
	n *= 3
	prefix := fmt.Sprintf("%sreplicas%d.probe.", b.prefix, k)
	p := &queueProbe{Replicas: k, Trial: replicaTrial{N: n}}
	var err error
	p.queueSample, err = sampleDuring(ctx, b, prefix, stdout, func(started func()) (time.Time, error) {
		t, err := runReplicaTrial(ctx, b, prefix, k, -1, n, brokerPID(ctx, b.url), started)
		p.Trial = t
		return t.Finished, err
	})
	if err != nil || p.Err != "" {
		return p, err
	}
	fmt.Fprintf(stdout, "probed run, %s: %s\n", nReplicas(k), p.queueSample)
	return p, nil
}

// runTrialProbe runs contender c once more with 3n messages, untimed for
// the ratios, and samples its queue processes while it moves messages.
func runTrialProbe(ctx context.Context, b *broker, c string, n int, stdout io.Writer) (*trialProbe, error) {
	n *= 3
	prefix := fmt.Sprintf("%s%s.probe.", b.prefix, c)
	p := &trialProbe{Contender: c, Trial: trial{Contender: c, N: n}}
	var err error
	p.queueSample, err = sampleDuring(ctx, b, prefix, stdout, func(started func()) (time.Time, error) {
		t, err := runTrial(ctx, b, c, prefix, -1, n, brokerPID(ctx, b.url), "", started)
		p.Trial = t
		return t.Finished, err
	})
	if err != nil || p.Err != "" {
		return p, err
	}
	fmt.Fprintf(stdout, "probed run, %s: %s\n", c, p.queueSample)
	return p, nil
}

// sampleDuring runs run, which calls started once messages are moving and
// returns when the run finished, and samples the queues named prefix* from
// started on for probeWindow. A probed run is only an illustration: when it
// fails without losing messages, the sample says why instead of failing
// the whole bench.
func sampleDuring(ctx context.Context, b *broker, prefix string, stdout io.Writer, run func(started func()) (time.Time, error)) (queueSample, error) {
	res := queueSample{Window: probeWindow}
	var (
		wg       sync.WaitGroup
		loads    []queueLoad
		sampled  time.Time // when sampling ended
		probeErr error
	)
	finished, err := run(func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loads, sampled, probeErr = probeQueues(ctx, prefix, probeWindow)
		}()
	})
	wg.Wait()
	if err != nil && (errors.Is(err, errLost) || ctx.Err() != nil) {
		return res, err
	}
	if err != nil {
		res.Err = fmt.Sprintf("the probed run failed (%v)", err)
		fmt.Fprintln(stdout, res.Err)
		if b.pauseBeforeRetry(ctx) == nil {
			_ = b.sweep(ctx, prefix)
		}
		return res, nil
	}
	if probeErr != nil {
		res.Err, _, _ = strings.Cut(probeErr.Error(), "\n") // the rest is rabbitmqctl's output, on stdout
		fmt.Fprintf(stdout, "probe of the queue processes failed: %v\n", probeErr)
		return res, nil
	}
	res.Queues, res.Late = loads, sampled.After(finished)
	return res, nil
}

func (p queueSample) String() string {
	var sb strings.Builder
	for _, q := range p.Queues {
		fmt.Fprintf(&sb, "%s busy %.0f %% (mailbox mean %.1f, max %d)  ", q.Queue, q.Busy*100, q.Mailbox, q.MaxMailbox)
	}
	return strings.TrimSpace(sb.String())
}

// probeQueues samples the classic queues on the broker's node whose names
// start with prefix, with rabbitmqctl eval, for window; it returns their
// load and when sampling ended.
func probeQueues(ctx context.Context, prefix string, window time.Duration) ([]queueLoad, time.Time, error) {
	if strings.ContainsAny(prefix, `"\`) {
		return nil, time.Time{}, fmt.Errorf("prefix %q cannot go into an Erlang string", prefix)
	}
	const every = 2 * time.Millisecond
	expr := fmt.Sprintf(`Prefix = <<"%s">>,
Mine = [{element(4, amqqueue:get_name(Q)), amqqueue:get_pid(Q)} || Q <- rabbit_amqqueue:list()],
Qs = [{N, P} || {N, P} <- Mine, is_pid(P), node(P) =:= node(), binary:longest_common_prefix([N, Prefix]) =:= byte_size(Prefix)],
Sample = fun(P) -> case erlang:process_info(P, [status, message_queue_len]) of undefined -> {waiting, 0}; [{status, S}, {message_queue_len, L}] -> {S, L} end end,
End = erlang:monotonic_time(millisecond) + %d,
Loop = fun Loop(Acc) -> case erlang:monotonic_time(millisecond) >= End of true -> Acc; false -> timer:sleep(%d), Loop([{N, Sample(P)} || {N, P} <- Qs] ++ Acc) end end,
Rows = Loop([]),
[io:format("queue ~s ~b ~b ~b ~b~n", [N,
  length([1 || {M, {S, _}} <- Rows, M =:= N, S =/= waiting]),
  length([1 || {M, _} <- Rows, M =:= N]),
  lists:sum([L || {M, {_, L}} <- Rows, M =:= N]),
  lists:max([0 | [L || {M, {_, L}} <- Rows, M =:= N]])]) || {N, _} <- Qs],
ok.`, prefix, window.Milliseconds(), every.Milliseconds())
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "eval", expr).CombinedOutput()
	ended := time.Now()
	if err != nil {
		return nil, ended, fmt.Errorf("rabbitmqctl eval: %w\n%s", err, out)
	}
	var loads []queueLoad
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 || f[0] != "queue" {
			continue
		}
		var v [4]int
		for i := range v {
			if v[i], err = strconv.Atoi(f[2+i]); err != nil {
				return nil, ended, fmt.Errorf("rabbitmqctl eval: unreadable line %q", line)
			}
		}
		busy, samples, mailboxes, maxMailbox := v[0], v[1], v[2], v[3]
		if samples == 0 {
			continue
		}
		loads = append(loads, queueLoad{Queue: strings.TrimPrefix(f[1], prefix), Busy: float64(busy) / float64(samples),
			Mailbox: float64(mailboxes) / float64(samples), MaxMailbox: maxMailbox})
	}
	slices.SortFunc(loads, func(a, b queueLoad) int { return cmp.Compare(b.Busy, a.Busy) })
	if len(loads) == 0 {
		return nil, ended, fmt.Errorf("rabbitmqctl eval found no queue named %s*:\n%s", prefix, out)
	}
	return loads, ended, nil
}
