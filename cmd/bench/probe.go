package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Probes look inside the broker while a contender moves messages, with
// one `rabbitmqctl eval` on the node: how busy each of the run's queue
// processes was, which Erlang processes did the work (reductions, the
// VM's unit of work, summed by the module that started each process), and
// what the scheduler threads spent their time on (microstate accounting).
// rabbitmqctl takes a second to start and its own work lands on the
// broker's cores, so probed runs are extra runs, not in the ratios.

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

// groupLoad is the work of the broker's processes started by one module.
type groupLoad struct {
	Module     string
	Reductions int64
}

// queueSample is what probing a run found.
type queueSample struct {
	Window time.Duration // sampled for this long
	Late   bool          // sampling went on after the run had ended, so the shares include idle time
	Queues []queueLoad
	// Groups are the reductions of this run's processes (its virtual
	// host's queues and message stores, its connections and channels, the
	// shovel's worker and Erlang client), by the module that started each,
	// descending; NodeReductions is the whole node's.
	Groups         []groupLoad
	NodeReductions int64
	// Sched is the time the node's scheduler threads spent in each
	// microstate (emulator, port, gc, check_io, aux, other, sleep), summed
	// over them.
	Sched map[string]time.Duration
	Err   string // why there are no Queues
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

// reductions is the total of Groups.
func (p queueSample) reductions() int64 {
	var sum int64
	for _, g := range p.Groups {
		sum += g.Reductions
	}
	return sum
}

// nodeShare is the run's share of the whole node's reductions.
func (p queueSample) nodeShare() float64 {
	if p.NodeReductions == 0 {
		return 0
	}
	return float64(p.reductions()) / float64(p.NodeReductions)
}

// perMessage is the run's reductions per message moved, at the probed
// run's rate.
func (p trialProbe) perMessage() float64 {
	if p.Trial.rate() == 0 || p.Window == 0 {
		return 0
	}
	return float64(p.reductions()) / (p.Trial.rate() * p.Window.Seconds())
}

// schedBusy is the scheduler threads' time not asleep.
func (p queueSample) schedBusy() time.Duration {
	var busy time.Duration
	for state, d := range p.Sched {
		if state != "sleep" {
			busy += d
		}
	}
	return busy
}

// queueProbe is the outcome of the probed replica run.
type queueProbe struct {
	Replicas int
	Trial    replicaTrial
	queueSample
}

// trialProbe is the outcome of a probed run of one contender.
type trialProbe struct {
	Contender string
	Trial     trial
	queueSample
}

// probeWindow is how long a probe samples.
const probeWindow = 1500 * time.Millisecond

// probeStartup is how long bench gives rabbitmqctl to start before it
// starts the contender of a probed run: the probe itself waits on the node
// for the contender's consumer, and samples from then on.
const probeStartup = 3 * time.Second

// runProbe runs k replicas once more with 3n messages, untimed for the
// ratios, and samples their queue processes while they move messages.
func runProbe(ctx context.Context, b *broker, k, n int, stdout io.Writer) (*queueProbe, error) {
	n *= 3
	prefix := fmt.Sprintf("%sreplicas%d.probe.", b.prefix, k)
	p := &queueProbe{Replicas: k, Trial: replicaTrial{N: n}}
	var (
		wg       sync.WaitGroup
		sampled  time.Time
		probeErr error
	)
	t, err := runReplicaTrial(ctx, b, prefix, k, -1, n, b.nodePID(ctx), func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.queueSample, sampled, probeErr = probeBroker(ctx, b, prefix, "", probeWindow)
		}()
	})
	wg.Wait()
	p.Trial = t
	if err := probeOutcome(ctx, b, prefix, &p.queueSample, err, probeErr, sampled, t.Finished, stdout); err != nil {
		return p, err
	}
	fmt.Fprintf(stdout, "probed run, %s: %s\n", nReplicas(k), p.queueSample)
	return p, nil
}

// runTrialProbe runs contender c once more, in mode m, with 3n messages,
// untimed for the ratios, and probes the broker from the moment c
// consumes.
func runTrialProbe(ctx context.Context, b *broker, c contender, m mode, n int, stdout io.Writer) (*trialProbe, error) {
	n *= 3
	prefix := fmt.Sprintf("%s%s.%s.probe.", b.prefix, safeName(c.Name), m)
	p := &trialProbe{Contender: c.Name}
	var (
		wg       sync.WaitGroup
		sampled  time.Time
		probeErr error
	)
	t, err := runTrial(ctx, b, c, m, atDestination, prefix, -1, n, "", hooks{beforeStart: func(src string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.queueSample, sampled, probeErr = probeBroker(ctx, b, prefix, src, probeWindow)
		}()
		select {
		case <-time.After(probeStartup):
		case <-ctx.Done():
		}
	}})
	wg.Wait()
	p.Trial = t
	if err := probeOutcome(ctx, b, prefix, &p.queueSample, err, probeErr, sampled, t.Finished, stdout); err != nil {
		return p, err
	}
	fmt.Fprintf(stdout, "probed run, %s (%s): %s\n", c.Name, m, p.queueSample)
	return p, nil
}

// probeOutcome sorts out a probed run: a probed run is only an
// illustration, so when it fails without losing messages, or the probe
// fails, the sample says why instead of failing the whole bench.
func probeOutcome(ctx context.Context, b *broker, prefix string, s *queueSample, runErr, probeErr error, sampled, finished time.Time, stdout io.Writer) error {
	if runErr != nil && (errors.Is(runErr, errLost) || ctx.Err() != nil) {
		return runErr
	}
	if runErr != nil {
		*s = queueSample{Window: probeWindow, Err: fmt.Sprintf("the probed run failed (%v)", runErr)}
		fmt.Fprintln(stdout, s.Err)
		if b.pauseBeforeRetry(ctx) == nil {
			_ = b.sweep(ctx, prefix)
		}
		return nil
	}
	if probeErr != nil {
		msg, _, _ := strings.Cut(probeErr.Error(), "\n") // the rest is rabbitmqctl's output
		*s = queueSample{Window: probeWindow, Err: msg}
		fmt.Fprintf(stdout, "probe of the broker failed: %v\n", probeErr)
		return nil
	}
	s.Late = sampled.After(finished)
	return nil
}

func (p queueSample) String() string {
	var sb strings.Builder
	for _, q := range p.Queues {
		fmt.Fprintf(&sb, "%s busy %.0f %% (mailbox mean %.1f, max %d)  ", q.Queue, q.Busy*100, q.Mailbox, q.MaxMailbox)
	}
	if total := p.reductions(); total > 0 {
		for _, g := range p.Groups[:min(4, len(p.Groups))] {
			fmt.Fprintf(&sb, "%s %.0f %%  ", g.Module, float64(g.Reductions)/float64(total)*100)
		}
	}
	return strings.TrimSpace(sb.String())
}

// probeBroker samples, on the broker's node, for window from the moment
// queue src has a consumer (at once when src is ""): the classic queues
// whose names start with prefix, every 2 ms; the reductions of the run's
// processes, grouped by the module that started each; and the scheduler
// threads' microstates. It returns what it found and when sampling ended.
//
// The expression must hold no '$': Debian's rabbitmqctl wrapper hands its
// arguments to a shell.
func probeBroker(ctx context.Context, b *broker, prefix, src string, window time.Duration) (queueSample, time.Time, error) {
	res := queueSample{Window: window}
	for _, s := range []string{prefix, src, b.vhost()} {
		if strings.ContainsAny(s, `"\$`+"`") {
			return res, time.Time{}, fmt.Errorf("%q cannot go into an Erlang string", s)
		}
	}
	out, err := b.ctl(ctx, "eval", probeExpr(prefix, src, b.vhost(), window))
	ended := time.Now()
	if err != nil {
		return res, ended, err
	}
	if err := res.parse(out, prefix); err != nil {
		return res, ended, err
	}
	if len(res.Queues) == 0 {
		return res, ended, fmt.Errorf("rabbitmqctl eval found no queue named %s*:\n%s", prefix, out)
	}
	return res, ended, nil
}

// probeExpr is the Erlang expression probeBroker evaluates on the node.
func probeExpr(prefix, src, vhost string, window time.Duration) string {
	const every = 2 * time.Millisecond
	return fmt.Sprintf(`Prefix = <<"%s">>, Src = <<"%s">>, VHost = <<"%s">>,
Consumers = fun(Name) -> case rabbit_amqqueue:lookup(rabbit_misc:r(VHost, queue, Name)) of {ok, Q} -> case catch rabbit_amqqueue:info(Q, [consumers]) of [{consumers, C}] -> C; _ -> 0 end; _ -> 0 end end,
WaitUntil = erlang:monotonic_time(millisecond) + 60000,
Wait = fun Wait() -> case Src =:= <<>> orelse Consumers(Src) > 0 of true -> ok; false -> case erlang:monotonic_time(millisecond) > WaitUntil of true -> timeout; false -> timer:sleep(1), Wait() end end end,
io:format("waited ~p~n", [Wait()]),
Mine = [{element(4, amqqueue:get_name(Q)), amqqueue:get_pid(Q)} || Q <- rabbit_amqqueue:list()],
Qs = [{N, P} || {N, P} <- Mine, is_pid(P), node(P) =:= node(), binary:longest_common_prefix([N, Prefix]) =:= byte_size(Prefix)],
Red = fun() -> maps:from_list([{P, R} || P <- erlang:processes(), P =/= self(), {reductions, R} <- [erlang:process_info(P, reductions)]]) end,
Kind = fun(P) -> case catch proc_lib:translate_initial_call(P) of {M, _, _} -> M; _ -> unknown end end,
AncKey = list_to_atom([36 | "ancestors"]),
Anc = fun(P) -> case erlang:process_info(P, dictionary) of {dictionary, D} -> case lists:keyfind(AncKey, 1, D) of {_, As} -> As; false -> [] end; _ -> [] end end,
VSup = case catch rabbit_vhost_sup_sup:get_vhost_sup(VHost) of {ok, VS} -> [VS]; _ -> [] end,
Conns = fun() -> [P || P <- rabbit_networking:connections(), node(P) =:= node(), (catch rabbit_reader:info(P, [vhost])) =:= [{vhost, VHost}]] end,
Ours = fun(P, Roots) -> lists:member(P, Roots) orelse lists:any(fun(A) -> lists:member(A, Roots) end, Anc(P)) orelse
  lists:prefix("amqp_", atom_to_list(Kind(P))) orelse lists:prefix("rabbit_shovel", atom_to_list(Kind(P))) end,
ConnRoots = fun(Cs) -> Cs ++ [hd(Anc(C)) || C <- Cs, Anc(C) =/= []] end,
StartRoots = ConnRoots(Conns()),
R0 = Red(),
Old = erlang:system_flag(microstate_accounting, true),
erlang:system_flag(microstate_accounting, reset),
Sample = fun(P) -> case erlang:process_info(P, [status, message_queue_len]) of undefined -> {waiting, 0}; [{status, S}, {message_queue_len, L}] -> {S, L} end end,
End = erlang:monotonic_time(millisecond) + %d,
Loop = fun Loop(Acc) -> case erlang:monotonic_time(millisecond) >= End of true -> Acc; false -> timer:sleep(%d), Loop([{N, Sample(P)} || {N, P} <- Qs] ++ Acc) end end,
Rows = Loop([]),
Stats = erlang:statistics(microstate_accounting),
erlang:system_flag(microstate_accounting, Old),
R1 = Red(),
Roots = VSup ++ StartRoots ++ ConnRoots(Conns()),
[io:format("queue ~s ~b ~b ~b ~b~n", [N,
  length([1 || {M, {S, _}} <- Rows, M =:= N, S =/= waiting]),
  length([1 || {M, _} <- Rows, M =:= N]),
  lists:sum([L || {M, {_, L}} <- Rows, M =:= N]),
  lists:max([0 | [L || {M, {_, L}} <- Rows, M =:= N]])]) || {N, _} <- Qs],
Deltas = [{P, R - maps:get(P, R0, 0)} || {P, R} <- maps:to_list(R1)],
io:format("total ~b~n", [lists:sum([D || {_, D} <- Deltas])]),
Groups = lists:foldl(fun({P, D}, Acc) -> case Ours(P, Roots) of true -> maps:update_with(Kind(P), fun(X) -> X + D end, D, Acc); false -> Acc end end, #{}, Deltas),
[io:format("group ~p ~b~n", [K, D]) || {K, D} <- maps:to_list(Groups), D > 0],
[io:format("msacc ~p ~p ~b~n", [T, S, erlang:convert_time_unit(C, perf_counter, microsecond)]) || #{type := T, counters := Cs} <- Stats, {S, C} <- maps:to_list(Cs)],
ok.`, prefix, src, vhost, window.Milliseconds(), every.Milliseconds())
}

// parse reads probeBroker's output into s.
func (s *queueSample) parse(out, prefix string) error {
	groups := map[string]int64{}
	s.Sched = map[string]time.Duration{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "waited" && f[1] != "ok":
			return fmt.Errorf("rabbitmqctl eval: the source had no consumer after a minute")
		case len(f) == 6 && f[0] == "queue":
			var v [4]int
			for i := range v {
				var err error
				if v[i], err = strconv.Atoi(f[2+i]); err != nil {
					return fmt.Errorf("rabbitmqctl eval: unreadable line %q", line)
				}
			}
			busy, samples, mailboxes, maxMailbox := v[0], v[1], v[2], v[3]
			if samples == 0 {
				continue
			}
			s.Queues = append(s.Queues, queueLoad{Queue: strings.TrimPrefix(f[1], prefix), Busy: float64(busy) / float64(samples),
				Mailbox: float64(mailboxes) / float64(samples), MaxMailbox: maxMailbox})
		case len(f) == 3 && f[0] == "group":
			r, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				return fmt.Errorf("rabbitmqctl eval: unreadable line %q", line)
			}
			groups[f[1]] += r
		case len(f) == 2 && f[0] == "total":
			s.NodeReductions, _ = strconv.ParseInt(f[1], 10, 64)
		case len(f) == 4 && f[0] == "msacc" && f[1] == "scheduler":
			us, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				return fmt.Errorf("rabbitmqctl eval: unreadable line %q", line)
			}
			s.Sched[f[2]] += time.Duration(us) * time.Microsecond
		}
	}
	slices.SortFunc(s.Queues, func(a, b queueLoad) int { return cmp.Compare(b.Busy, a.Busy) })
	for m, r := range groups {
		s.Groups = append(s.Groups, groupLoad{Module: m, Reductions: r})
	}
	slices.SortFunc(s.Groups, func(a, b groupLoad) int {
		return cmp.Or(cmp.Compare(b.Reductions, a.Reductions), cmp.Compare(a.Module, b.Module))
	})
	return nil
}
