package e2e

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestTopologyPrintImportsIntoFreshVhost loads `rebound topology print`
// into an empty virtual host with rabbitmqctl and checks that the result
// is a working loop: an application queue that only the printed policy
// points at rebound dead-letters into the inbox, and with rebound running
// a rejected message comes back and ends parked.
func TestTopologyPrintImportsIntoFreshVhost(t *testing.T) {
	t.Parallel()
	url := brokertest.Require(t).PrivateVhost(t)
	e := newTestEnv(t, with(fastLoop, "REBOUND_AMQP_URL", url))
	app := e.Prefix + "policy-app"
	pattern := "^" + regexp.QuoteMeta(app) + "$"

	out, stderr, err := e.cli("topology", "print", "--app-pattern", pattern)
	if err != nil {
		t.Fatalf("topology print: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "delay queues") {
		t.Errorf("no note about delay queues on stderr: %q", stderr)
	}
	// Decoded with the names RabbitMQ reads, spelled here and not taken
	// from the command's types, so a renamed field fails here, as it would
	// fail an import.
	type entry struct {
		Name        string `json:"name"`
		VHost       string `json:"vhost"`
		Destination string `json:"destination"`
	}
	var doc struct {
		Exchanges []entry `json:"exchanges"`
		Queues    []entry `json:"queues"`
		Bindings  []entry `json:"bindings"`
		Policies  []entry `json:"policies"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("output is not definitions JSON: %v\n%s", err, out)
	}
	if len(doc.Exchanges) == 0 || len(doc.Queues) == 0 || len(doc.Bindings) == 0 || len(doc.Policies) == 0 {
		t.Fatalf("a section is empty:\n%s", out)
	}
	vhosts := map[string]string{}
	for _, x := range doc.Exchanges {
		vhosts["exchange "+x.Name] = x.VHost
	}
	for _, q := range doc.Queues {
		vhosts["queue "+q.Name] = q.VHost
	}
	for _, b := range doc.Bindings {
		vhosts["binding to "+b.Destination] = b.VHost
	}
	for _, p := range doc.Policies {
		vhosts["policy "+p.Name] = p.VHost
	}
	for what, vhost := range vhosts {
		if vhost != e.vhost() {
			t.Errorf("%s: vhost %q, want %q", what, vhost, e.vhost())
		}
	}
	// RabbitMQ imports into the virtual hosts each entry names.
	if err := e.Broker.ImportDefinitions(context.Background(), out); err != nil {
		t.Fatalf("rabbitmqctl import_definitions: %v", err)
	}

	// Before rebound runs: the inbox, parking queue and dead-letter binding
	// exist because of the import alone.
	for _, q := range []string{e.Vars["REBOUND_INBOX_QUEUE"], e.Vars["REBOUND_PARKING_QUEUE"]} {
		if n := e.QueueLen(q); n != 0 {
			t.Fatalf("queue %s after import: %d messages, want an empty queue", q, n)
		}
	}
	// The application queue has no arguments: only the policy routes its
	// rejects to rebound.
	if _, err := e.Ch.QueueDeclare(app, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Ch.PublishWithContext(context.Background(), "", app, false, false, amqp.Publishing{
		MessageId: "imported-1", Body: []byte("hello"),
	}); err != nil {
		t.Fatal(err)
	}
	var d amqp.Delivery
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ok bool
		if d, ok, err = e.Ch.Get(app, false); err != nil {
			t.Fatal(err)
		} else if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("message never reached the application queue")
		}
	}
	if err := d.Reject(false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.QueueLenOr(e.Vars["REBOUND_INBOX_QUEUE"], 0) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the rejected message did not reach the inbox: policy or binding missing")
		}
		time.Sleep(50 * time.Millisecond)
	}

	e.startInProcess()
	rej := e.rejectAll(app)
	parked := e.parked(1, 30*time.Second)
	if len(parked) != 1 || parked[0].MessageId != "imported-1" {
		t.Fatalf("parked %d messages, want imported-1", len(parked))
	}
	p := parked[0]
	if p.Headers["x-retry-origin-queue"] != app || p.Headers["x-retry-parked-reason"] != "max-retries" {
		t.Errorf("parked headers: %v", p.Headers)
	}
	// fastLoop allows 2 retries: the message came back twice.
	if n := len(rej.seen()); n != 2 {
		t.Errorf("the application queue saw the message %d times after the first reject, want 2", n)
	}
	// The delay queue rebound declared runs lazy by the printed policy.
	delayQueue := e.Vars["REBOUND_DELAY_QUEUE_PREFIX"] + "20"
	listed := e.Broker.MustCtl(t, "-q", "list_queues", "-p", e.vhost(), "name", "policy", "--no-table-headers")
	if !slices.Contains(strings.Split(listed, "\n"), delayQueue+"\t"+"rebound-delay-queues-lazy") {
		t.Errorf("delay queue %s does not have the lazy policy:\n%s", delayQueue, listed)
	}
}

func TestTopologyDeclare(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, with(nil, "REBOUND_QUEUE_TYPE", "quorum"))
	out, stderr, err := e.cli("topology", "declare")
	if err != nil {
		t.Fatalf("topology declare: %v\n%s", err, stderr)
	}
	for _, want := range []string{
		"exchange " + e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"] + " (fanout, durable)",
		"queue " + e.Vars["REBOUND_INBOX_QUEUE"] + " (durable, x-dead-letter-exchange=, x-dead-letter-routing-key=" + e.Vars["REBOUND_PARKING_QUEUE"] +
			", x-dead-letter-strategy=at-least-once, x-overflow=reject-publish, x-queue-type=quorum)",
		"queue " + e.Vars["REBOUND_PARKING_QUEUE"],
		"binding " + e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"] + " -> " + e.Vars["REBOUND_INBOX_QUEUE"],
	} {
		if !strings.Contains(out, want) {
			t.Errorf("declare output lacks %q:\n%s", want, out)
		}
	}
	for _, q := range []string{e.Vars["REBOUND_INBOX_QUEUE"], e.Vars["REBOUND_PARKING_QUEUE"]} {
		if n := e.QueueLen(q); n != 0 {
			t.Errorf("queue %s: %d messages, want an empty queue", q, n)
		}
	}
	// Delay queues and their exchanges are declared on first use.
	if strings.Contains(out, "exchange "+e.Vars["REBOUND_DELAY_EXCHANGE"]) {
		t.Errorf("declare output names a delay exchange:\n%s", out)
	}
	// Declaring again is a no-op.
	if _, _, err := e.cli("topology", "declare"); err != nil {
		t.Errorf("second declare: %v", err)
	}
	// Declaring classic queues over the quorum ones is refused, clearly.
	e.Vars["REBOUND_QUEUE_TYPE"] = "classic"
	if _, _, err := e.cli("topology", "declare"); err == nil || !strings.Contains(err.Error(), "topology print") {
		t.Errorf("declare with other queue type: %v, want a precondition error pointing at topology print", err)
	}
}
