package e2e

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestMeasureWatchCostOfProcesses measures, when REBOUND_MEASURE_WATCH is
// set, what N rebound processes (the built binary, as N sidecars of one
// vhost run) cost the broker in checks, counted on the wire: every
// process connects through a proxy that counts the AMQP methods it sends,
// so the count does not rest on rebound's own rebound_broker_calls_total
// (shown beside it). After each process has handled its share of 20
// failures a process, to delays drawn from 0 to 10 minutes (so that the
// vhost uses a hundred-odd delay queues), it counts over two windows
// (REBOUND_MEASURE_WINDOW each, default 30s), the first right after the
// burst and the second quiet, the passive queue declarations (the
// checks), and every method but those that move messages (publish, ack,
// nack, reject) and heartbeats. N is 5 and 50 unless
// REBOUND_MEASURE_REPLICAS lists others (1,5,10,50,100); each runs
// without and with a retry rate. It fails when 50 processes make more
// than twice the checks of 5.
//
//	REBOUND_MEASURE_WATCH=1 REBOUND_TEST_BROKER=4.3 go test -run TestMeasureWatchCostOfProcesses -v -timeout 30m ./e2e/
func TestMeasureWatchCostOfProcesses(t *testing.T) {
	brokertest.Measure(t, "REBOUND_MEASURE_WATCH")
	window := brokertest.MeasureWindow("REBOUND_MEASURE_WINDOW", 30*time.Second)
	replicas := []int{5, 50}
	if s := os.Getenv("REBOUND_MEASURE_REPLICAS"); s != "" {
		replicas = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("REBOUND_MEASURE_REPLICAS=%q: want a list of process counts", s)
			}
			replicas = append(replicas, n)
		}
	}
	type row struct {
		n              int
		rate           bool
		phase          string
		checks, calls  float64 // on the wire, a second
		self           float64 // rebound_broker_calls_total's checks, a second
		series, queues int
		methods        string
	}
	var rows []row
	checksOf := map[string]float64{}
	for _, n := range replicas {
		for _, rate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d processes, rate %v", n, rate), func(t *testing.T) {
				vars := map[string]string{"REBOUND_MIN_DELAY": "10m", "REBOUND_MAX_DELAY": "10m", "REBOUND_JITTER": "full",
					"REBOUND_MAX_RETRIES": "5", "REBOUND_MAX_DURATION": "1h", "REBOUND_PREFETCH": "16", "REBOUND_LOG_LEVEL": "error"}
				if rate {
					vars["REBOUND_RETRY_RATE"] = "1000"
				}
				e := newTestEnv(t, vars)
				p := startMethodCounter(t, e.URL())
				procs := make([]*testEnv, n)
				exits := make([]*proc, n)
				for i := range procs {
					procs[i] = e.replica()
					procs[i].Vars["REBOUND_AMQP_URL"] = p.url
					exits[i] = procs[i].launch()
				}
				for i, r := range procs {
					r.waitReady(exits[i].exited)
				}
				msgs := make([]amqp.Publishing, 20*n)
				for i := range msgs {
					msgs[i] = amqp.Publishing{MessageId: strconv.Itoa(i), Headers: amqp.Table{"x-retry-origin-queue": e.App}}
				}
				inbox := e.Vars["REBOUND_INBOX_QUEUE"]
				e.Publish(inbox, msgs...)
				total := func(name string, labels ...string) float64 {
					sum := 0.0
					for _, r := range procs {
						sum += seriesSum(r.metricLines(), name, labels...)
					}
					return sum
				}
				if !brokertest.Await(3*time.Minute, func() bool {
					return total("rebound_messages_retried_total") >= float64(len(msgs)) && e.QueueLen(inbox) == 0
				}) {
					t.Fatalf("%g of %d failures handled", total("rebound_messages_retried_total"), len(msgs))
				}
				if !brokertest.Await(time.Minute, func() bool { return total("rebound_watch_leader") == 1 }) {
					t.Fatalf("%g processes hold the watch token, want 1", total("rebound_watch_leader"))
				}
				self := func() float64 {
					return total("rebound_broker_calls_total", `kind="inbox"`) + total("rebound_broker_calls_total", `kind="parked"`) +
						total("rebound_broker_calls_total", `kind="delay-queue"`) + total("rebound_broker_calls_total", `kind="place"`)
				}
				// Two windows, one after the other: the first takes in
				// what follows a burst of failures (each process shrinks
				// its inbox window after 10 s without a delivery, taking a
				// new consumer), the second a quiet vhost.
				for _, phase := range []string{"after a burst", "quiet"} {
					m0, s0, t0 := p.snapshot(), self(), time.Now()
					time.Sleep(window) // a measurement window, not a wait for a condition
					m1, s1, el := p.snapshot(), self(), time.Since(t0).Seconds()
					d := m1.minus(m0)
					r := row{n: n, rate: rate, phase: phase, checks: float64(d[passiveDeclare]) / el, calls: float64(d.calls()) / el, self: (s1 - s0) / el,
						series: seriesCount(procs, "rebound_delay_queue_messages"),
						queues: delayQueuesOn(t, e), methods: d.String()}
					rows = append(rows, r)
					checksOf[fmt.Sprint(n, rate, phase)] = r.checks
				}
			})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nprocesses  retry rate  window         checks/s (wire)  calls/s (wire)  checks/s (rebound's count)  delay-queue series  delay queues  methods in the window\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "%9d  %10v  %-13s  %15.2f  %14.2f  %26.2f  %18d  %12d  %s\n", r.n, r.rate, r.phase, r.checks, r.calls, r.self, r.series, r.queues, r.methods)
	}
	t.Log(b.String())
	for _, rate := range []bool{false, true} {
		for _, phase := range []string{"after a burst", "quiet"} {
			five, fiveOK := checksOf[fmt.Sprint(5, rate, phase)]
			fifty, fiftyOK := checksOf[fmt.Sprint(50, rate, phase)]
			if fiveOK && fiftyOK && fifty > 2*five+0.1 { // 0.1/s: one inbox read of a window's rounding
				t.Errorf("retry rate %v, %s: 50 processes make %.2f checks a second, more than twice the %.2f of 5", rate, phase, fifty, five)
			}
		}
	}
}

// seriesSum adds the samples of name whose labels contain every one of
// labels (`kind="inbox"`), from a /metrics page's lines.
func seriesSum(lines []string, name string, labels ...string) float64 {
	sum := 0.0
	for _, line := range lines {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || !(strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			continue
		}
		if slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(rest, l) }) {
			continue
		}
		fields := strings.Fields(rest)
		v, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
		sum += v
	}
	return sum
}

// seriesCount is how many series of name the processes export together.
func seriesCount(procs []*testEnv, name string) int {
	n := 0
	for _, r := range procs {
		for _, line := range r.metricLines() {
			if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
				n++
			}
		}
	}
	return n
}

// delayQueuesOn counts e's delay queues on the broker.
func delayQueuesOn(t *testing.T, e *testEnv) int {
	out := e.Broker.MustCtl(t, "list_queues", "-q", "--no-table-headers", "name")
	n := 0
	prefix := e.Vars["REBOUND_DELAY_QUEUE_PREFIX"]
	for line := range strings.Lines(out) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if _, err := strconv.Atoi(rest); ok && err == nil {
			n++
		}
	}
	return n
}

// passiveDeclare is the methodCounts key of a passive queue.declare: a
// check of a queue's counts.
const passiveDeclare = "queue.declare(passive)"

// methodCounts counts AMQP methods by class.method name.
type methodCounts map[string]int

func (c methodCounts) minus(o methodCounts) methodCounts {
	out := methodCounts{}
	for k, v := range c {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// moving are the methods that move messages rather than ask the broker.
var moving = []string{"basic.publish", "basic.ack", "basic.nack", "basic.reject"}

// calls adds every method but those that move messages.
func (c methodCounts) calls() int {
	n := 0
	for k, v := range c {
		if !slices.Contains(moving, k) {
			n += v
		}
	}
	return n
}

func (c methodCounts) String() string {
	parts := make([]string, 0, len(c))
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, c[k]))
	}
	return strings.Join(parts, ", ")
}

// methodCounter is a TCP proxy in front of the broker that counts the
// AMQP 0-9-1 methods its clients send, by name; url is the broker URL
// through it.
type methodCounter struct {
	url    string
	mu     sync.Mutex
	counts methodCounts
}

func startMethodCounter(t *testing.T, brokerURL string) *methodCounter {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	u.Host = ln.Addr().String()
	c := &methodCounter{url: u.String(), counts: methodCounts{}}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			open = append(open, client, server)
			mu.Unlock()
			conns.Add(2)
			go func() { defer conns.Done(); _, _ = io.Copy(client, server); client.Close() }()
			go func() { defer conns.Done(); c.relay(client, server); server.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, conn := range open {
			conn.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	return c
}

// amqpMethods names the methods a rebound sends, by class and method id.
var amqpMethods = map[[2]uint16]string{
	{10, 11}: "connection.start-ok", {10, 31}: "connection.tune-ok", {10, 40}: "connection.open",
	{10, 50}: "connection.close", {10, 51}: "connection.close-ok",
	{20, 10}: "channel.open", {20, 20}: "channel.flow", {20, 21}: "channel.flow-ok", {20, 40}: "channel.close", {20, 41}: "channel.close-ok",
	{40, 10}: "exchange.declare", {40, 20}: "exchange.delete", {40, 30}: "exchange.bind",
	{50, 10}: "queue.declare", {50, 20}: "queue.bind", {50, 30}: "queue.purge", {50, 40}: "queue.delete", {50, 50}: "queue.unbind",
	{60, 10}: "basic.qos", {60, 20}: "basic.consume", {60, 30}: "basic.cancel", {60, 40}: "basic.publish", {60, 70}: "basic.get",
	{60, 80}: "basic.ack", {60, 90}: "basic.reject", {60, 110}: "basic.recover", {60, 120}: "basic.nack",
	{85, 10}: "confirm.select", {90, 10}: "tx.select",
}

// relay copies what a client sends to the server, counting its methods:
// the protocol header, then frames (type, channel, size, payload, end).
func (c *methodCounter) relay(client io.Reader, server io.Writer) {
	r := bufio.NewReader(client)
	header := make([]byte, 8)
	if _, err := io.ReadFull(r, header); err != nil {
		return
	}
	if _, err := server.Write(header); err != nil {
		return
	}
	frame := make([]byte, 7)
	for {
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		body := make([]byte, be32(frame[3:7])+1)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if frame[0] == 1 && len(body) >= 5 { // a method frame
			id := [2]uint16{be16(body[0:2]), be16(body[2:4])}
			name, ok := amqpMethods[id]
			if !ok {
				name = fmt.Sprintf("%d.%d", id[0], id[1])
			}
			if name == "queue.declare" && declaresPassively(body[4:]) {
				name = passiveDeclare
			}
			c.mu.Lock()
			c.counts[name]++
			c.mu.Unlock()
		}
		if _, err := server.Write(append(frame, body...)); err != nil {
			return
		}
	}
}

// be16 and be32 read AMQP's big-endian integers (this package's binary
// is the rebound binary).
func be16(b []byte) uint16 { return uint16(b[0])<<8 | uint16(b[1]) }
func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// declaresPassively reads queue.declare's arguments (reserved short,
// queue name, then the bits, passive first).
func declaresPassively(args []byte) bool {
	if len(args) < 3 {
		return false
	}
	at := 2 + 1 + int(args[2])
	return at < len(args) && args[at]&1 == 1
}

func (c *methodCounter) snapshot() methodCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := methodCounts{}
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}
