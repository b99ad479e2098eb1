package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/topology"
)

// Large messages. rebound's window and meter keep the message bytes it
// holds within REBOUND_INFLIGHT_BYTES; these runs check that, with the
// manifests' memory settings, large messages keep rebound's memory under
// the manifests' limit. rebound runs as its own process, the binary `go
// build` makes of the module, with GOMEMLIMIT as the manifests set it and
// every REBOUND_* at its default but the names of bench's queues and the
// HTTP address; its RSS is read from /proc/<pid>/status.

// The manifests' memory settings for the rebound container (deploy/kustomize),
// which deploy/validate checks against each other.
const (
	memoryLimit = 192 << 20 // resources.limits.memory: 192Mi
	goMemLimit  = "144MiB"  // GOMEMLIMIT
)

// Message sizes of the large-message runs.
const (
	largeSize = 8 << 20 // under RabbitMQ 4.x's default max_message_size, 16 MiB (3.10's is 128 MiB)
	smallSize = 1 << 10
)

// stopAbove is the RSS past which a large-message run stops rebound: the
// limit is long passed, and the machine is shared.
const stopAbove = 1 << 30

// largeScenario is one large-message run: the body sizes of the messages
// the inbox holds, in order, when rebound starts.
type largeScenario struct {
	Name  string
	Sizes []int
}

// largeScenarios returns the runs for n messages of largeSize: n alone;
// n/2 of them among messages of smallSize, one in 20, interleaved; and
// n/4 behind a run of smallRun of smallSize, the worst case the window
// does not cover (it is at its deepest when the large messages come, and
// each of them adds its size to the peak up to the window, so a quarter
// of n shows it as well as n, in a quarter of the time).
func largeScenarios(n int) []largeScenario {
	alone := make([]int, n)
	for i := range alone {
		alone[i] = largeSize
	}
	mixed := make([]int, 10*n)
	for i := range mixed {
		mixed[i] = smallSize
		if i%20 == 19 {
			mixed[i] = largeSize
		}
	}
	run := make([]int, smallRun+max(n/4, 1))
	for i := range run {
		run[i] = smallSize
		if i >= smallRun {
			run[i] = largeSize
		}
	}
	return []largeScenario{
		{Name: fmt.Sprintf("%d × 8 MiB waiting", n), Sizes: alone},
		{Name: fmt.Sprintf("%d × 1 KiB and %d × 8 MiB, one in 20, interleaved", len(mixed)-len(mixed)/20, len(mixed)/20), Sizes: mixed},
		{Name: fmt.Sprintf("%d × 1 KiB, then %d × 8 MiB", smallRun, len(run)-smallRun), Sizes: run},
	}
}

// smallRun is how many small messages come before the large ones in the
// worst case: enough for the window to open to REBOUND_PREFETCH's 1024.
const smallRun = 5000

// bytes is the scenario's total of bodies.
func (s largeScenario) bytes() int64 {
	var total int64
	for _, n := range s.Sizes {
		total += int64(n)
	}
	return total
}

// largeResult is one large-message run.
type largeResult struct {
	Scenario    string
	N           int
	Large       int // of the N, those of largeSize
	Bytes       int64
	Elapsed     time.Duration // from rebound's consumer on the inbox to its last copy confirmed
	Peak        int64         // VmHWM when the last copy was confirmed (or when stopped)
	SampledPeak int64         // the largest VmRSS sampled (every 20 ms)
	Idle        int64         // VmRSS once rebound consumed, before the first delivery
	MaxInflight int64         // the largest rebound_inflight_bytes scraped (every 100 ms)
	MaxPrefetch int           // the largest rebound_prefetch scraped
	Stopped     bool          // RSS passed stopAbove and bench stopped rebound
	Moved       int           // copies confirmed when the run ended
}

func (r largeResult) rate() float64 { return float64(r.Moved) / r.Elapsed.Seconds() }

// mibPerSecond is the bodies moved per second, in MiB.
func (r largeResult) mibPerSecond() float64 {
	return float64(r.Bytes) / float64(1<<20) / r.Elapsed.Seconds()
}

// under reports whether the peak RSS stayed within the manifests' limit.
func (r largeResult) under() bool { return !r.Stopped && r.Peak <= memoryLimit }

// buildRebound builds rebound's binary into a new directory and returns
// its path and what removes it.
func buildRebound(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "rebound-bench-bin")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "rebound")
	if _, err := goCommand(ctx, "build", "-o", bin, "github.com/rebound-mq/rebound"); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}

// largePayload is the bodies' bytes, shared by every message.
var largePayload = bytes.Repeat([]byte("rebound large message 0123456789."), largeSize/32+1)[:largeSize]

// measureLarge runs every scenario with n large messages, one after the
// other.
func measureLarge(ctx context.Context, b *broker, bin string, n int, stdout io.Writer) ([]largeResult, error) {
	var out []largeResult
	for i, sc := range largeScenarios(n) {
		prefix := fmt.Sprintf("%slarge%d.", b.prefix, i+1)
		r, err := runLarge(ctx, b, bin, sc, prefix, stdout)
		if serr := b.sweep(context.Background(), prefix); serr != nil {
			fmt.Fprintf(stdout, "could not delete what the large-message run left (%s*): %v\n", prefix, serr)
		}
		if err != nil {
			return out, fmt.Errorf("large messages, %s: %w", sc.Name, err)
		}
		fmt.Fprintln(stdout, r.line())
		out = append(out, r)
	}
	return out, nil
}

func (r largeResult) line() string {
	stopped := ""
	if r.Stopped {
		stopped = fmt.Sprintf(" (stopped past %s, %d of %d moved)", mib(stopAbove), r.Moved, r.N)
	}
	return fmt.Sprintf("large: %-50s %6.2fs %7.0f msg/s %6.1f MiB/s  RSS peak %s (sampled %s, idle %s)  in flight ≤ %s, prefetch ≤ %d%s",
		r.Scenario, r.Elapsed.Seconds(), r.rate(), r.mibPerSecond(), mib(r.Peak), mib(r.SampledPeak), mib(r.Idle),
		mib(r.MaxInflight), r.MaxPrefetch, stopped)
}

// runLarge fills a fresh inbox with the scenario's messages, starts the
// rebound binary on it, samples its memory until every copy is confirmed,
// and checks that every copy came back to the application queue (the
// default policy's delays are a second or less).
func runLarge(ctx context.Context, b *broker, bin string, sc largeScenario, prefix string, stdout io.Writer) (largeResult, error) {
	res := largeResult{Scenario: sc.Name, N: len(sc.Sizes), Bytes: sc.bytes()}
	for _, size := range sc.Sizes {
		if size == largeSize {
			res.Large++
		}
	}
	topo := topology.Topology{
		InboxQueue: prefix + "inbox", DeadLetterExchange: prefix + "dlx", DelayExchange: prefix + "delay",
		DelayQueuePrefix: prefix + "delay.", ParkingQueue: prefix + "parked",
	}
	app := prefix + "app"
	var args amqp.Table
	if !topology.VersionAtLeast(b.version(), 3, 12) {
		// Before 3.12 a classic queue keeps its messages in memory too:
		// the copies coming back need not weigh on the shared broker.
		args = amqp.Table{"x-queue-mode": "lazy"}
	}
	if err := b.declare(app, args); err != nil {
		return res, err
	}
	if err := b.declareTopology(topo); err != nil {
		return res, err
	}
	fmt.Fprintf(stdout, "large: filling the inbox with %s (%d messages, %s)\n", sc.Name, res.N, mib(res.Bytes))
	if err := b.fill(ctx, topo.InboxQueue, res.N, func(i int) amqp.Publishing {
		m := message(i, app)
		m.Body = largePayload[:sc.Sizes[i]]
		return m
	}); err != nil {
		return res, err
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "run")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "GOMEMLIMIT=" + goMemLimit,
		"REBOUND_AMQP_URL=" + b.url, "REBOUND_HTTP_ADDR=" + addr,
		"REBOUND_INBOX_QUEUE=" + topo.InboxQueue, "REBOUND_DEAD_LETTER_EXCHANGE=" + topo.DeadLetterExchange,
		"REBOUND_DELAY_EXCHANGE=" + topo.DelayExchange, "REBOUND_DELAY_QUEUE_PREFIX=" + topo.DelayQueuePrefix,
		"REBOUND_PARKING_QUEUE=" + topo.ParkingQueue,
	}
	logs := &tailBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = io.Discard, logs
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start rebound: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func(sig syscall.Signal) error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(sig)
		select {
		case err := <-exited:
			if sig == syscall.SIGTERM && err != nil {
				return fmt.Errorf("rebound: %w\n%s", err, logs)
			}
			return nil
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("rebound did not stop within 30s of %s", sig)
		}
	}
	defer func() { _ = stop(syscall.SIGKILL) }()
	pid := strconv.Itoa(cmd.Process.Pid)

	if _, err := b.waitFor(ctx, topo.InboxQueue, 5*time.Millisecond, time.Minute, func(_, consumers int) bool { return consumers > 0 }); err != nil {
		return res, fmt.Errorf("rebound did not start consuming: %w\n%s", err, logs)
	}
	start := time.Now()
	res.Idle, _ = procMemory(pid)
	metrics := "http://" + addr + "/metrics"
	deadline := start.Add(5*time.Minute + time.Duration(res.Bytes/(1<<20))*100*time.Millisecond)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		rss, peak := procMemory(pid)
		res.SampledPeak, res.Peak = max(res.SampledPeak, rss), max(res.Peak, peak)
		if rss > stopAbove {
			res.Elapsed, res.Stopped = time.Since(start), true
			_ = stop(syscall.SIGKILL)
			fmt.Fprintf(stdout, "large: rebound's RSS passed %s: stopped\n", mib(stopAbove))
			return res, nil
		}
		if i%5 == 0 {
			if m, err := scrape(ctx, metrics); err == nil {
				res.Moved = int(m["rebound_messages_retried_total"])
				res.MaxInflight = max(res.MaxInflight, int64(m["rebound_inflight_bytes"]))
				res.MaxPrefetch = max(res.MaxPrefetch, int(m["rebound_prefetch"]))
				if res.Moved >= res.N {
					res.Elapsed = time.Since(start)
					break
				}
			}
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d of %d copies confirmed after %s: %w\n%s", res.Moved, res.N, time.Since(start).Round(time.Second), errLost, logs)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-exited:
			stopped = true
			return res, fmt.Errorf("rebound exited: %v\n%s", err, logs)
		case <-tick.C:
		}
	}
	_, peak := procMemory(pid)
	res.Peak = max(res.Peak, peak)
	if err := stop(syscall.SIGTERM); err != nil {
		return res, err
	}
	if _, err := b.waitFor(ctx, app, 50*time.Millisecond, time.Minute, func(m, _ int) bool { return m >= res.N }); err != nil {
		return res, fmt.Errorf("copies back in the application queue: %w (%w)", err, errLost)
	}
	return res, nil
}

// scrape reads a Prometheus text exposition and returns each metric's
// samples summed over their labels.
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics sums the samples of each metric of a Prometheus text
// exposition over their labels.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return out, fmt.Errorf("metrics: unreadable line %q", line)
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return out, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return out, fmt.Errorf("metrics: value of %q: %w", line, err)
		}
		out[name] += v
	}
	return out, s.Err()
}

// tailBuffer keeps the last max bytes written to it: a process's log,
// written by the goroutine exec starts, read by bench when it fails.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
