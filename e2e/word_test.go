package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/group"
)

// Tests of the consumer's word: the error and the Retry-After a consumer
// attaches to a failure, as headers on AMQP 0-9-1 (through the guide's
// snippets, docs/consumers/word.*) and as annotations on AMQP 1.0, and the
// failure groups rebound files them under.

// wordNodeDriver takes one message of APP_QUEUE and hands it to word.js's
// reportFailure with ERROR and RETRY_AFTER_MS.
const wordNodeDriver = `
const amqp = require('amqplib');
const { reportFailure } = require('./word.js');
(async () => {
  const env = process.env;
  const conn = await amqp.connect(env.AMQP_URL);
  try {
    const ch = await conn.createChannel();
    const out = await conn.createConfirmChannel();
    let msg = false;
    while (!msg) {
      msg = await ch.get(env.APP_QUEUE, { noAck: false });
      if (!msg) await new Promise((r) => setTimeout(r, 20));
    }
    const opts = env.RETRY_AFTER_MS ? { retryAfterMs: Number(env.RETRY_AFTER_MS) } : {};
    await reportFailure(ch, out, msg, new Error(env.ERROR), opts);
    await ch.close();
  } finally {
    await conn.close();
  }
})().catch((err) => { console.error(err); process.exit(1); });
`

// wordPythonDriver is wordNodeDriver with word.py.
const wordPythonDriver = `
import os, time
import pika
import word

env = os.environ
conn = pika.BlockingConnection(pika.URLParameters(env["AMQP_URL"]))
ch = conn.channel()
ch.confirm_delivery()
method = None
while method is None:
    method, props, body = ch.basic_get(env["APP_QUEUE"])
    if method is None:
        time.sleep(0.02)
after = int(env["RETRY_AFTER_MS"]) if env.get("RETRY_AFTER_MS") else None
word.report_failure(ch, method, props, body, RuntimeError(env["ERROR"]), retry_after_ms=after)
conn.close()
`

// wordProtonDriver takes one message of APP_QUEUE over AMQP 1.0 and fails
// it with word10.py's fail.
const wordProtonDriver = `
import os
from urllib.parse import quote
from proton.utils import BlockingConnection
import word10

env = os.environ
conn = BlockingConnection(env["AMQP10_URL"], allowed_mechs="PLAIN", timeout=30)
try:
    receiver = conn.create_receiver("/queues/" + quote(env["APP_QUEUE"], safe=""), credit=1)
    receiver.receive(timeout=30)
    after = int(env["RETRY_AFTER_MS"]) if env.get("RETRY_AFTER_MS") else None
    word10.fail(receiver, RuntimeError(env["ERROR"]), retry_after_ms=after)
finally:
    conn.close()
`

// wordRheaDriver takes one message of APP_QUEUE over AMQP 1.0 and fails
// it with word10.js's fail.
const wordRheaDriver = `
const rhea = require('rhea');
const { fail } = require('./word10.js');
const env = process.env;
const u = new URL(env.AMQP10_URL);
const vhost = decodeURIComponent(u.pathname.slice(1));
const conn = rhea.create_container().connect({
  host: u.hostname, port: Number(u.port || 5672), username: decodeURIComponent(u.username),
  password: decodeURIComponent(u.password), hostname: vhost ? 'vhost:' + vhost : u.hostname, reconnect: false,
});
const timer = setTimeout(() => { console.error('no message in 30 s'); process.exit(1); }, 30000);
conn.on('message', (context) => {
  clearTimeout(timer);
  const opts = env.RETRY_AFTER_MS ? { retryAfterMs: Number(env.RETRY_AFTER_MS) } : {};
  fail(context, new Error(env.ERROR), opts);
  context.connection.close();
});
conn.on('connection_error', (context) => { console.error(context.connection.error); process.exit(1); });
conn.on('disconnected', (context) => { if (context.error) { console.error(context.error); process.exit(1); } });
conn.open_receiver({ source: '/queues/' + encodeURIComponent(env.APP_QUEUE), autoaccept: false, credit_window: 1 });
`

func wordClients() []snippetClient {
	return []snippetClient{
		{name: "go-amqp091", missing: func() string { return "" },
			command: func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, "go", "run", "word.go") }},
		{name: "node-amqplib", missing: missingNode("amqplib"),
			command: func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, "node", "-e", wordNodeDriver) }},
		{name: "python-pika", missing: missingPython("pika", "python3-pika"), command: pythonCommand(wordPythonDriver)},
	}
}

// TestConsumerWordOverHeaders: a consumer that republishes a failure with
// the guide's snippet, in Go, Node and Python, is heard: its Retry-After
// is the copy's delay (above the policy's 50ms), read once; its error is
// kept, stamped with the retry it was reported at, and names the group; a
// later plain rejection is filed under the origin, not the old error; and
// the parked message's group is the first failure's, numbers and addresses
// aside, as `rebound parked groups` lists it.
func TestConsumerWordOverHeaders(t *testing.T) {
	for _, c := range wordClients() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			requireClient(t, c.missing())
			e := newTestEnv(t, map[string]string{
				"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "50ms", "REBOUND_MAX_DELAY": "10s", "REBOUND_MAX_RETRIES": "2",
			})
			e.startInProcess()
			env := []string{"AMQP_URL=" + e.URL(), "APP_QUEUE=" + e.App, "INBOX_QUEUE=" + e.Vars["REBOUND_INBOX_QUEUE"]}
			first := "TimeoutError: db down after 3012 ms on 10.1.2.3"
			errorGroup := group.Of(e.App, first, "")

			e.Publish(e.App, amqp.Publishing{MessageId: "w1", Body: []byte(`{"order":1}`)})
			runSnippet(t, c, append(env, "ERROR="+first, "RETRY_AFTER_MS=1500")...)
			d := e.Get(e.App, 30*time.Second)
			h := d.Headers
			if h["x-retry-error"] != first || h["x-retry-error-retry"] != int64(0) || h["x-retry-group"] != errorGroup ||
				h["x-retry-last-delay-ms"] != int64(1500) || h["x-retry-after"] != nil || h["x-retry-count"] != int64(1) {
				t.Errorf("first copy: error %v at %v, group %v (want %s), last delay %v, retry-after %v, count %v",
					h["x-retry-error"], h["x-retry-error-retry"], h["x-retry-group"], errorGroup, h["x-retry-last-delay-ms"], h["x-retry-after"], h["x-retry-count"])
			}
			if got := e.metricBecomes(`rebound_retry_after_total{outcome="applied",policy="default"}`, "1"); got != "1" {
				t.Errorf("rebound_retry_after_total applied = %q, want 1", got)
			}

			// A plain rejection says nothing new: the group is the
			// origin's, the old error travels on with its stamp.
			if err := d.Nack(false, false); err != nil {
				t.Fatal(err)
			}
			d = e.Get(e.App, 30*time.Second)
			h = d.Headers
			if h["x-retry-group"] != group.Of(e.App, "", group.Retry) || h["x-retry-error"] != first || h["x-retry-error-retry"] != int64(0) ||
				h["x-retry-last-delay-ms"] != int64(50) {
				t.Errorf("after a plain rejection: group %v, error %v at %v, last delay %v; want the origin's group, the old error at 0, 50",
					h["x-retry-group"], h["x-retry-error"], h["x-retry-error-retry"], h["x-retry-last-delay-ms"])
			}
			if err := d.Reject(true); err != nil { // back in the queue for the snippet
				t.Fatal(err)
			}

			// The same cause again, other numbers: parked (2 retries), in
			// the first failure's group.
			second := "TimeoutError: db down after 2990 ms on 10.1.2.4"
			runSnippet(t, c, append(env, "ERROR="+second)...)
			out, stderr, err := e.cli("parked", "groups", "--format", "json")
			for i := 0; err == nil && i < 100; i++ {
				var doc parkedGroups
				if jerr := json.Unmarshal([]byte(out), &doc); jerr != nil {
					t.Fatalf("parked groups: %v\n%s", jerr, out)
				}
				if doc.Matched > 0 {
					if len(doc.Groups) != 1 || doc.Groups[0].Key != errorGroup || doc.Groups[0].Count != 1 || doc.Groups[0].Error != second ||
						doc.Groups[0].Reason != "max-retries" || doc.Groups[0].Origin != e.App {
						t.Errorf("parked groups = %s; want one group %s of 1, max-retries, error %q", out, errorGroup, second)
					}
					break
				}
				time.Sleep(100 * time.Millisecond)
				out, stderr, err = e.cli("parked", "groups", "--format", "json")
			}
			if err != nil {
				t.Fatalf("parked groups: %v\n%s", err, stderr)
			}
		})
	}
}

// TestRetryAfterUnreadableIsCounted: a Retry-After rebound cannot read is
// ignored and counted, and the copy goes out with the policy's delay.
func TestRetryAfterUnreadableIsCounted(t *testing.T) {
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "50ms", "REBOUND_MAX_RETRIES": "3"})
	e.startInProcess()
	e.Publish(e.Vars["REBOUND_INBOX_QUEUE"], amqp.Publishing{MessageId: "bad", Body: []byte("x"),
		Headers: amqp.Table{"x-retry-origin-queue": e.App, "x-retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}})
	d := e.Get(e.App, 30*time.Second)
	if d.Headers["x-retry-last-delay-ms"] != int64(50) || d.Headers["x-retry-after"] != nil {
		t.Errorf("copy: last delay %v, retry-after %v; want 50 and none", d.Headers["x-retry-last-delay-ms"], d.Headers["x-retry-after"])
	}
	if got := e.metricBecomes(`rebound_retry_after_total{outcome="ignored-invalid",policy="default"}`, "1"); got != "1" {
		t.Errorf("rebound_retry_after_total ignored-invalid = %q, want 1", got)
	}
	if got := e.metricBecomes(`rebound_invalid_headers_total{header="x-retry-after"}`, "1"); got != "1" {
		t.Errorf("rebound_invalid_headers_total x-retry-after = %q, want 1", got)
	}
}

// TestConsumerWordOverAMQP10: on RabbitMQ 4, an AMQP 1.0 consumer fails a
// delivery with the modified outcome and the guide's annotations
// (docs/consumers/word10.py with Qpid Proton, word10.go with go-amqp,
// word10.js with rhea).
// From a quorum queue rebound reads them: the error names the group and
// is kept as x-retry-error, the Retry-After is the delay, and the
// annotations are gone from the copy. From a classic queue the broker
// drops them: the copy has the policy's delay and the origin's group (the
// guide says: use headers there).
func TestConsumerWordOverAMQP10(t *testing.T) {
	amqp10Broker(t)
	e := newTestEnv(t, map[string]string{"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "50ms", "REBOUND_MAX_DELAY": "10s", "REBOUND_MAX_RETRIES": "3"})
	e.startInProcess()
	quorum := e.Prefix + "quorum-app"
	e.Declare(quorum, amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"]})
	cause := "TimeoutError: db down after 3012 ms"
	for _, c := range []snippetClient{
		{name: "python-proton", missing: missingPython("proton", "python3-qpid-proton"), command: pythonCommand(wordProtonDriver)},
		{name: "go-amqp", missing: func() string { return "" },
			command: func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, "go", "run", "word10.go") }},
		{name: "node-rhea", missing: missingNode("rhea"),
			command: func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, "node", "-e", wordRheaDriver) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			requireClient(t, c.missing())
			for _, tc := range []struct {
				queue     string
				heard     bool
				wantDelay int64
			}{
				{quorum, true, 1500},
				{e.App, false, 50},
			} {
				id := c.name + "-" + tc.queue
				e.Publish(tc.queue, amqp.Publishing{MessageId: id, Body: []byte("x")})
				runSnippet(t, c, "AMQP10_URL="+e.URL(), "APP_QUEUE="+tc.queue, "ERROR="+cause, "RETRY_AFTER_MS=1500")
				d := e.Get(tc.queue, 30*time.Second)
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
				h := d.Headers
				wantGroup, wantError := group.Of(tc.queue, "", group.Retry), any(nil)
				if tc.heard {
					wantGroup, wantError = group.Of(tc.queue, cause, ""), cause
				}
				if d.MessageId != id || h["x-retry-group"] != wantGroup || h["x-retry-error"] != wantError || h["x-retry-last-delay-ms"] != tc.wantDelay ||
					h["x-opt-retry-error"] != nil || h["x-opt-retry-after"] != nil {
					t.Errorf("%s: message %s, group %v, error %v, last delay %v, annotations %v %v; want %s, %s, %v, %d, none",
						tc.queue, d.MessageId, h["x-retry-group"], h["x-retry-error"], h["x-retry-last-delay-ms"], h["x-opt-retry-error"], h["x-opt-retry-after"],
						id, wantGroup, wantError, tc.wantDelay)
				}
			}
		})
	}
}
