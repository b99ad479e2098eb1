package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
)

// The snippets docs/consumers.md quotes, run against the broker under test
// beside an in-process rebound: what the guide says works, works.

// snippetsDir holds the guide's runnable snippets (and Node's
// node_modules, which scripts/ensure-clients.sh installs).
const snippetsDir = "../docs/consumers"

// debianPython is the interpreter Debian's python3-pika and
// python3-qpid-proton install for; a pyenv python3 on the PATH does not
// see them.
const debianPython = "/usr/bin/python3"

// snippetClient runs one language's snippets through a small driver that
// loads them as a service would.
type snippetClient struct {
	name string
	// missing says what is not installed, or "" when the client can run.
	missing func() string
	// command runs the driver; its environment says what to do.
	command func(ctx context.Context) *exec.Cmd
}

// nodeDriver produces (ACTION=produce) or takes one message of APP_QUEUE
// and hands it to consumer.js's settle with a handler that fails
// (ACTION=reject) or fails for good (ACTION=permanent).
const nodeDriver = `
const amqp = require('amqplib');
const { settle, PermanentError } = require('./consumer.js');
const { publishOrder } = require('./producer.js');
(async () => {
  const env = process.env;
  const conn = await amqp.connect(env.AMQP_URL);
  try {
    const out = await conn.createConfirmChannel();
    if (env.ACTION === 'produce') {
      await publishOrder(out, env.MESSAGE_ID, { order: 42 }, new Date(Number(env.STARTED_AT)));
      return;
    }
    const ch = await conn.createChannel();
    let msg = false;
    while (!msg) {
      msg = await ch.get(env.APP_QUEUE, { noAck: false });
      if (!msg) await new Promise((r) => setTimeout(r, 20));
    }
    await settle(ch, out, msg, async () => {
      if (env.ACTION === 'permanent') throw new PermanentError('card declined');
      throw new Error('payment service unavailable');
    });
    await ch.close();
  } finally {
    await conn.close();
  }
})().catch((err) => { console.error(err); process.exit(1); });
`

// pythonDriver is nodeDriver with consumer.py and producer.py.
const pythonDriver = `
import os, time
import pika
import consumer, producer

env = os.environ
conn = pika.BlockingConnection(pika.URLParameters(env["AMQP_URL"]))
ch = conn.channel()
ch.confirm_delivery()
if env["ACTION"] == "produce":
    producer.publish_order(ch, env["MESSAGE_ID"], {"order": 42}, int(env["STARTED_AT"]))
else:
    method = None
    while method is None:
        method, props, body = ch.basic_get(env["APP_QUEUE"])
        if method is None:
            time.sleep(0.02)

    def handle(props, body):
        if env["ACTION"] == "permanent":
            raise consumer.PermanentError("card declined")
        raise RuntimeError("payment service unavailable")

    consumer.settle(ch, method, props, body, handle)
conn.close()
`

func snippetClients() []snippetClient {
	return []snippetClient{
		{
			name:    "node-amqplib",
			missing: missingNode("amqplib"),
			command: func(ctx context.Context) *exec.Cmd { return exec.CommandContext(ctx, "node", "-e", nodeDriver) },
		},
		{
			name:    "python-pika",
			missing: missingPython("pika", "python3-pika"),
			command: pythonCommand(pythonDriver),
		},
	}
}

// missingNode says what a driver run by node lacks to require module
// from docs/consumers/node_modules, or "" when nothing.
func missingNode(module string) func() string {
	return func() string {
		if _, err := exec.LookPath("node"); err != nil {
			return "node"
		}
		if _, err := os.Stat(filepath.Join(snippetsDir, "node_modules", module, "package.json")); err != nil {
			return module + " in docs/consumers/node_modules"
		}
		return ""
	}
}

// missingPython says what Debian's python3 lacks to import module (the
// Debian package that installs it), or "" when nothing.
func missingPython(module, debianPackage string) func() string {
	return func() string {
		if err := exec.Command(debianPython, "-c", "import "+module).Run(); err != nil {
			return "Debian's " + debianPackage + " for " + debianPython
		}
		return ""
	}
}

// pythonCommand runs driver with Debian's python3, leaving no bytecode
// beside the snippets.
func pythonCommand(driver string) func(ctx context.Context) *exec.Cmd {
	return func(ctx context.Context) *exec.Cmd {
		cmd := exec.CommandContext(ctx, debianPython, "-c", driver)
		cmd.Env = append(cmd.Env, "PYTHONDONTWRITEBYTECODE=1")
		return cmd
	}
}

// requireClient skips the test when the client is not installed, or
// fails it where a broker is required (CI, REBOUND_REQUIRE_BROKER): there
// `make test` installed it.
func requireClient(t *testing.T, what string) {
	t.Helper()
	if what == "" {
		return
	}
	msg := what + " is not installed; scripts/ensure-clients.sh installs it (make test runs it)"
	if brokertest.Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// runSnippet runs c's driver with env and fails the test if it fails.
func runSnippet(t *testing.T, c snippetClient, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := c.command(ctx)
	cmd.Dir = snippetsDir
	cmd.Env = append(append(os.Environ(), cmd.Env...), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s driver (%s): %v\n%s", c.name, strings.Join(env, " "), err, out.String())
	}
}

// TestConsumerGuideSnippets runs docs/consumers.md's Node and Python
// snippets against the broker beside rebound:
//   - the producer's x-task-started-at decodes, with rebound's own codec, as
//     the time it set, sent as a long;
//   - the consumer's rejection, without requeue, reaches rebound through the
//     dead-letter exchange: the message comes back from rebound, retry 1,
//     its first death "rejected";
//   - the consumer's permanent failure is handed over confirmed and parked
//     non-retryable with its error and origin, the original acked.
func TestConsumerGuideSnippets(t *testing.T) {
	for _, c := range snippetClients() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			requireClient(t, c.missing())
			e := newTestEnv(t, map[string]string{
				"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "50ms", "REBOUND_MAX_RETRIES": "5",
			})
			e.startInProcess()
			env := []string{"AMQP_URL=" + e.URL(), "APP_QUEUE=" + e.App, "INBOX_QUEUE=" + e.Vars["REBOUND_INBOX_QUEUE"]}
			codec := headers.NewCodec(headers.DefaultNames())
			decode := func(d amqp.Delivery) headers.State {
				t.Helper()
				st, problems := codec.Decode(d.Headers, d.Timestamp, time.Now(), nil)
				if len(problems) > 0 {
					t.Errorf("%s: rebound cannot read %v", d.MessageId, problems)
				}
				return st
			}

			t.Run("producer headers", func(t *testing.T) {
				started := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
				runSnippet(t, c, append(env, "ACTION=produce", "MESSAGE_ID=produced", "STARTED_AT="+strconv.FormatInt(started.UnixMilli(), 10))...)
				d := e.Get(e.App, 10*time.Second)
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
				if v, ok := d.Headers["x-task-started-at"].(int64); !ok {
					t.Errorf("x-task-started-at sent as %T (%v), want a long", d.Headers["x-task-started-at"], d.Headers["x-task-started-at"])
				} else if v != started.UnixMilli() {
					t.Errorf("x-task-started-at = %d, want %d", v, started.UnixMilli())
				}
				if st := decode(d); !st.StartedAt.Equal(started) {
					t.Errorf("rebound reads the task start as %s, want %s", st.StartedAt, started)
				}
				if d.MessageId != "produced" || d.DeliveryMode != amqp.Persistent || d.Timestamp.IsZero() {
					t.Errorf("message id %q, delivery mode %d, timestamp %s: want produced, persistent, set", d.MessageId, d.DeliveryMode, d.Timestamp)
				}
			})

			t.Run("reject without requeue", func(t *testing.T) {
				e.Publish(e.App, amqp.Publishing{MessageId: "flaky", Body: []byte(`{"order":1}`)})
				runSnippet(t, c, append(env, "ACTION=reject")...)
				// Only rebound puts it back, 50ms later, with its retry count.
				d := e.Get(e.App, 30*time.Second)
				if err := d.Ack(false); err != nil {
					t.Fatal(err)
				}
				// The broker's newest x-death names the delay queue it came
				// back from; rebound's origin header names the application's.
				st := decode(d)
				if d.MessageId != "flaky" || st.Retries != 1 || d.Headers["x-retry-origin-queue"] != e.App || st.FirstDeathReason != "rejected" {
					t.Errorf("came back as %q, retry %d, origin %v, first death %q; want flaky, 1, %s, rejected",
						d.MessageId, st.Retries, d.Headers["x-retry-origin-queue"], st.FirstDeathReason, e.App)
				}
			})

			t.Run("permanent failure", func(t *testing.T) {
				e.Publish(e.App, amqp.Publishing{MessageId: "declined", Body: []byte(`{"order":2}`), ContentType: "application/json"})
				runSnippet(t, c, append(env, "ACTION=permanent")...)
				parked := e.parked(1, 30*time.Second)
				if len(parked) != 1 {
					t.Fatalf("parked %d messages, want 1", len(parked))
				}
				p := parked[0]
				st := decode(p)
				if p.MessageId != "declined" || p.Headers["x-retry-parked-reason"] != "non-retryable" || !st.NonRetryable ||
					p.Headers["x-retry-error"] != "card declined" || st.Origin != e.App || p.ContentType != "application/json" {
					t.Errorf("parked %q: reason %v, non-retryable %v, error %v, origin %q, content type %q; want declined, non-retryable, true, card declined, %s, application/json",
						p.MessageId, p.Headers["x-retry-parked-reason"], st.NonRetryable, p.Headers["x-retry-error"], st.Origin, p.ContentType, e.App)
				}
				if n := e.QueueLen(e.App); n != 0 {
					t.Errorf("%d messages left in the application queue: the original was not acked", n)
				}
			})
		})
	}
}

// TestConsumersGuideQuotesTheSnippets: every code block of
// docs/consumers.md marked with a file comment is that file, byte for
// byte, and every snippet file is quoted: the guide shows what the test
// above runs.
func TestConsumersGuideQuotesTheSnippets(t *testing.T) {
	guide, err := os.ReadFile("../docs/consumers.md")
	if err != nil {
		t.Fatal(err)
	}
	quoted, err := quotedFiles(string(guide))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(snippetsDir, "*.*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		if ext := filepath.Ext(name); ext != ".js" && ext != ".py" && ext != ".go" {
			continue
		}
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := quoted["consumers/"+name]
		switch {
		case !ok:
			t.Errorf("docs/consumers.md does not quote %s", name)
		case got != string(want):
			t.Errorf("docs/consumers.md's block for %s differs from the file:\n%s", name, got)
		}
		delete(quoted, "consumers/"+name)
	}
	for name := range quoted {
		t.Errorf("docs/consumers.md quotes %s, which is not a snippet file", name)
	}
}

// quotedFile is the comment that marks a code block as a file's contents.
var quotedFile = regexp.MustCompile("(?m)^<!-- file: (\\S+) -->\n```[a-z]*\n")

// quotedFiles returns each marked block's contents by the file it names.
func quotedFiles(guide string) (map[string]string, error) {
	out := map[string]string{}
	for _, m := range quotedFile.FindAllStringSubmatchIndex(guide, -1) {
		name, body := guide[m[2]:m[3]], guide[m[1]:]
		end := strings.Index(body, "\n```\n")
		if end < 0 {
			return nil, errors.New("the block for " + name + " is not closed")
		}
		out[name] = body[:end+1]
	}
	return out, nil
}
