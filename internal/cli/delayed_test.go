package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/delayed"
	"github.com/rebound-mq/rebound/internal/delayqueue"
)

// TestDelayedUsageErrors: bad flags exit 2, naming the flag, the value
// and what is allowed, before anything connects (the URL points nowhere).
func TestDelayedUsageErrors(t *testing.T) {
	environ := []string{"REBOUND_AMQP_URL=amqp://guest:guest@127.0.0.1:1/"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"delayed", "flush", "--origin", "orders"}, "add --yes"},
		{[]string{"delayed", "cancel", "--origin", "orders"}, "add --yes"},
		{[]string{"delayed", "flush", "--yes"}, "--origin is required"},
		{[]string{"delayed", "flush", "--origin", "(", "--yes"}, `--origin "(": not a regular expression`},
		{[]string{"delayed", "--digits", "4"}, "--digits 4: want 1, 2 or 3"},
		{[]string{"delayed", "--max-delay", "500us"}, "--max-delay 500µs: want a delay of 1ms or more"},
		{[]string{"delayed", "--format", "yaml"}, `--format "yaml": want table or json`},
		{[]string{"delayed", "bogus"}, `unexpected argument "bogus"`},
		{[]string{"topology", "prune"}, "add --yes"},
	} {
		var stderr bytes.Buffer
		err := Run(context.Background(), tc.args, environ, &bytes.Buffer{}, &stderr)
		if code := ExitCode(err, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestDelayedListsAndFlushes: `rebound delayed` lists what waits, as a
// table and as JSON; `delayed flush --dry-run` changes nothing and `flush
// --yes` sends the matching copies back.
func TestDelayedListsAndFlushes(t *testing.T) {
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(false)
	delays, err := delayqueue.New(d.Conn, topo, nil, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for _, delay := range []time.Duration{5 * time.Minute, 10 * time.Minute} {
		if _, err := delays.Ensure(delay); err != nil {
			t.Fatal(err)
		}
	}
	delays.Close()
	publish := func(delay time.Duration, n int) {
		// Copies as a rebound before the return through the inbox
		// published them: the origin queue as routing key.
		exchange := topo.DelayExchangeFor(delay).Name
		for range n {
			if err := d.Ch.PublishWithContext(context.Background(), exchange, d.App, true, false, amqp.Publishing{Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(5*time.Minute, 2)
	publish(10*time.Minute, 3)
	q5, _ := topo.DelayQueue(5 * time.Minute)
	q10, _ := topo.DelayQueue(10 * time.Minute)
	d.WaitQueueLen(q5.Name, 2, 10*time.Second)
	d.WaitQueueLen(q10.Name, 3, 10*time.Second)
	run := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		err := Run(context.Background(), args, d.Environ(), &stdout, &stderr)
		return stdout.String() + stderr.String(), err
	}

	out, err := run("delayed", "--format", "json", "--max-delay", "15m")
	if err != nil {
		t.Fatal(err, out)
	}
	var doc delayedJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err, out)
	}
	if doc.Total != 5 || len(doc.Queues) != 2 || doc.Queues[0] != (delayQueueJSON{Queue: q5.Name, DelayMs: 300000, Messages: 2}) ||
		doc.Queues[1] != (delayQueueJSON{Queue: q10.Name, DelayMs: 600000, Messages: 3}) {
		t.Errorf("delayed --format json: %+v", doc)
	}
	out, err = run("delayed")
	if err != nil || !strings.Contains(out, q10.Name) || !strings.Contains(out, "5 messages in 2 delay queues") {
		t.Errorf("delayed: %v\n%s", err, out)
	}

	out, err = run("delayed", "flush", "--origin", "^"+d.App+"$", "--dry-run")
	if err != nil || !strings.Contains(out, "5 of 5 matching copies would be sent back to their origin queue") {
		t.Errorf("flush --dry-run: %v\n%s", err, out)
	}
	d.WaitQueueLen(q10.Name, 3, 10*time.Second)
	if got := d.QueueLen(d.App); got != 0 {
		t.Errorf("the dry run sent %d copies", got)
	}
	out, err = run("delayed", "flush", "--origin", "^"+d.App+"$", "--yes")
	if err != nil || !strings.Contains(out, "5 of 5 matching copies sent back to their origin queue") {
		t.Errorf("flush --yes: %v\n%s", err, out)
	}
	d.WaitQueueLen(d.App, 5, 10*time.Second)
}

// TestProgressOnlyOnATerminal: progress goes to stderr only when stderr is
// a terminal: not to a buffer, a pipe or the null device.
func TestProgressOnlyOnATerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var buf bytes.Buffer
	for name, stderr := range map[string]io.Writer{"a buffer": &buf, "a pipe": w, "the null device": null} {
		p := newProgress(stderr, "delayed flush")
		if p.w != nil {
			t.Errorf("%s taken for a terminal", name)
		}
		p.show(delayed.Progress{Read: 1, Total: 2})
		p.done()
	}
	if buf.Len() > 0 {
		t.Errorf("progress written to a buffer: %q", buf.String())
	}
}
