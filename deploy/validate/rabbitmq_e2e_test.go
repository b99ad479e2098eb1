package validate

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestRabbitMQSetupEndToEnd runs deploy/rabbitmq/setup.sh against a real
// RabbitMQ (the broker under test, see internal/brokertest) in a fresh
// vhost, then rebound as the user the script made: a message an
// application rejects from a queue the policy matches is retried
// (immediately, then through a delay queue) and parked, with no permission
// refused along the way; rebound then exits 0 on SIGTERM. -short skips it.
func TestRabbitMQSetupEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; -short skips it")
	}
	b := brokertest.Require(t)
	bin := buildRebound(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	vhost, reboundUser, appUser, password, _ := runSetup(t, ctx, b, "deploy-validate-")

	rebound, logs, exited := startRebound(t, ctx, bin, userURL(t, b.URL, reboundUser, password, vhost),
		"REBOUND_MIN_DELAY=1s", "REBOUND_JITTER=none", "REBOUND_IMMEDIATE_RETRIES=1", "REBOUND_MAX_RETRIES=2")

	ch := channelAs(t, b, userURL(t, b.URL, appUser, password, vhost))
	// No x-dead-letter-exchange argument: the script's policy supplies it.
	if _, err := ch.QueueDeclare("orders.e2e", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", "orders.e2e", false, false, amqp.Publishing{MessageId: "e2e-1", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	rejects := 0
	for {
		if ctx.Err() != nil {
			t.Fatalf("not parked after %d rejects", rejects)
		}
		if refused(logs.String()) {
			t.Fatal("rebound was refused a permission")
		}
		d, ok, err := ch.Get("orders.e2e", false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			rejects++
			if err := d.Nack(false, false); err != nil {
				t.Fatal(err)
			}
			continue
		}
		p, ok, err := ch.Get("rebound.parked", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			if reason := p.Headers["x-retry-parked-reason"]; reason != "max-retries" || p.MessageId != "e2e-1" {
				t.Errorf("parked %s with reason %v, want e2e-1 with max-retries", p.MessageId, reason)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The original attempt, one immediate and one delayed retry.
	if rejects != 3 {
		t.Errorf("the application saw the message %d times, want 3", rejects)
	}
	// The script's patterns give rebound no permission on the application
	// queues: RabbitMQ 4.2.6 and later refuse its check that the origin
	// exists, and it says so (deploy/README.md), once.
	unchecked := strings.Count(logs.String(), "cannot check whether origin queue orders.e2e exists")
	if want := map[bool]int{true: 1, false: 0}[b.AtLeast(4, 2)]; unchecked != want {
		t.Errorf("RabbitMQ %s: rebound said %d times it cannot check the origin queue, want %d", b.Version(), unchecked, want)
	}
	// Each of the script's policies applies where it should: the one delay
	// queue rebound declared (1s) runs lazy, the application queue
	// dead-letters to rebound, and rebound's own fixed queues have neither.
	out, err := b.Ctl(ctx, nil, "-q", "list_queues", "-p", vhost, "name", "policy", "--no-table-headers")
	if err != nil {
		t.Fatalf("list queues and their policies: %v", err)
	}
	policies := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			policies[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for queue, want := range map[string]string{
		"rebound.delay.1000": "rebound-delay-queues-lazy", "orders.e2e": "rebound-dead-letter",
		"rebound.inbox": "", "rebound.parked": "",
	} {
		if got, ok := policies[queue]; !ok || got != want {
			t.Errorf("queue %s: policy %q (listed: %v), want %q", queue, got, ok, want)
		}
	}
	if refused(logs.String()) {
		t.Error("rebound was refused a permission")
	}
	stopsOnSIGTERM(t, rebound, exited)
}

// buildRebound builds rebound into the test's temporary directory, before
// the scenario's deadline starts: from a cold cache on a busy machine (CI
// runs the other broker's suite beside this one) a build takes minutes.
func buildRebound(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rebound")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build rebound: %v\n%s", err, out)
	}
	return bin
}

// startRebound runs rebound's binary bin with url and env until the test
// ends, waiting until it is ready; exited receives how it ended.
func startRebound(t *testing.T, ctx context.Context, bin, url string, env ...string) (rebound *exec.Cmd, logs *brokertest.SyncBuffer, exited chan error) {
	t.Helper()
	dir := t.TempDir()
	urlFile := filepath.Join(dir, "url")
	if err := os.WriteFile(urlFile, []byte(url), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := brokertest.FreeAddr(t)
	logs = &brokertest.SyncBuffer{}
	rebound = exec.CommandContext(ctx, bin, "run")
	rebound.Env = append(append(os.Environ(), "REBOUND_AMQP_URL_FILE="+urlFile, "REBOUND_HTTP_ADDR="+addr), env...)
	rebound.Stdout, rebound.Stderr = logs, logs
	if err := rebound.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan error, 1)
	go func() { exited <- rebound.Wait() }()
	t.Cleanup(func() {
		_ = rebound.Process.Kill()
		err := <-exited
		exited <- err // for a later receive
		if t.Failed() {
			t.Logf("rebound's log:\n%s", logs.String())
		}
	})
	waitReady(t, ctx, "http://"+addr+"/readyz")
	return rebound, logs, exited
}

// stopsOnSIGTERM sends rebound SIGTERM and checks that it exits 0 within
// 30 s; exited is startRebound's.
func stopsOnSIGTERM(t *testing.T, rebound *exec.Cmd, exited chan error) {
	t.Helper()
	if err := rebound.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup's receive
		if err != nil {
			t.Errorf("rebound did not exit 0 on SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("rebound still running 30s after SIGTERM")
	}
}

// runSetup makes a vhost named prefix and a random suffix, an application
// user with every permission on it, and runs setup.sh there with the
// variables env adds, as an operator would; everything is deleted at
// cleanup. It returns the names setup.sh was given.
func runSetup(t *testing.T, ctx context.Context, b *brokertest.Broker, prefix string, env ...string) (vhost, reboundUser, appUser, password, output string) {
	t.Helper()
	rabbitmqctl := func(t *testing.T, args ...string) {
		t.Helper()
		if _, err := b.Ctl(context.Background(), nil, append([]string{"-q"}, args...)...); err != nil {
			t.Error(err)
		}
	}
	suffix := brokertest.RandomSuffix()
	vhost, reboundUser, appUser = prefix+suffix, "rebound-"+suffix, "app-"+suffix
	password = "pw-" + suffix
	rabbitmqctl(t, "add_vhost", vhost)
	t.Cleanup(func() { rabbitmqctl(t, "delete_vhost", vhost) })
	rabbitmqctl(t, "add_user", appUser, password)
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", appUser) })
	rabbitmqctl(t, "set_permissions", "-p", vhost, appUser, ".*", ".*", ".*")

	setup := exec.CommandContext(ctx, "bash", setupScript)
	setup.Env = append(os.Environ(), "VHOST="+vhost, "REBOUND_USER="+reboundUser, "REBOUND_PASSWORD="+password,
		`APP_QUEUES=^orders\.`, "RABBITMQCTL="+strings.Join(b.CtlCommand(), " "))
	setup.Env = append(setup.Env, env...)
	t.Cleanup(func() { rabbitmqctl(t, "delete_user", reboundUser) })
	out, err := setup.CombinedOutput()
	if err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	return vhost, reboundUser, appUser, password, string(out)
}

// userURL is brokerURL for user and password in vhost.
func userURL(t *testing.T, brokerURL, user, password, vhost string) string {
	t.Helper()
	u, err := amqp.ParseURI(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Username, u.Password, u.Vhost = user, password, vhost
	return u.String()
}

// channelAs opens a channel on url (a user's URL of b), its connection
// closed at cleanup.
func channelAs(t *testing.T, b *brokertest.Broker, url string) *amqp.Channel {
	t.Helper()
	ch, err := b.Dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func waitReady(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal(errors.Join(ctx.Err(), err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func refused(log string) bool {
	return strings.Contains(strings.ToLower(log), "access_refused")
}

// TestRabbitMQSetupHoldEndToEnd is TestRabbitMQSetupEndToEnd in hold mode
// (RabbitMQ 4.3+), quorum queues: setup.sh with DELAY_MODE=hold gives
// rebound's user hold mode's least privilege, no write on the default
// exchange, and declares what that user may not (the hold queue, the
// quorum inbox: they dead-letter to the default exchange). rebound runs as
// that user: a message is retried at once and after a delay, home each
// time from the hold queue, then parked, and no permission is refused
// but the one publish home the holder tries before it goes by
// dead-lettering. A forged origin gets nowhere: messages whose headers,
// or whose routing key into the hold queue, name a queue outside
// REBOUND_ORIGIN_QUEUES are parked, that queue receives nothing, and
// rebound's user cannot publish to it by name. Nothing is lost.
func TestRabbitMQSetupHoldEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test; -short skips it")
	}
	b := brokertest.Require(t)
	if !b.AtLeast(4, 3) {
		t.Skipf("RabbitMQ %s cannot hold", b.Version())
	}
	bin := buildRebound(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	vhost, reboundUser, appUser, password, output := runSetup(t, ctx, b, "deploy-validate-hold-",
		"QUEUE_TYPE=quorum", "DELAY_MODE=hold", "DEFINITIONS_DIR="+b.SharedDir(t))
	// setup.sh warns when the broker's dead-letter window would hold the
	// copies back from their origins (docs/delay-modes.md), and only then.
	window, err := b.Ctl(ctx, nil, "-q", "eval", "application:get_env(rabbit, dead_letter_worker_consumer_prefetch, 32).")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(window)); strings.Contains(output, "dead_letter_worker_consumer_prefetch") != (n < 512) {
		t.Errorf("the broker's dead_letter_worker_consumer_prefetch is %s; setup.sh said:\n%s\nwant a warning naming it exactly when it is below 512", strings.TrimSpace(window), output)
	}
	reboundURL := userURL(t, b.URL, reboundUser, password, vhost)
	rebound, logs, exited := startRebound(t, ctx, bin, reboundURL,
		"REBOUND_DELAY_MODE=hold", "REBOUND_QUEUE_TYPE=quorum", `REBOUND_ORIGIN_QUEUES=^orders\.`,
		"REBOUND_MIN_DELAY=1s", "REBOUND_JITTER=none", "REBOUND_IMMEDIATE_RETRIES=1", "REBOUND_MAX_RETRIES=2")

	ch := channelAs(t, b, userURL(t, b.URL, appUser, password, vhost))
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(exchange, key string, msg amqp.Publishing) {
		t.Helper()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %s to %q: not confirmed (%v)", msg.MessageId, exchange, err)
		}
	}
	const victim = "payments.victim" // a queue of the vhost outside REBOUND_ORIGIN_QUEUES
	for _, q := range []string{"orders.e2e", victim} {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}

	// Retried at once, then after a delay, then parked: each copy home
	// from the hold queue.
	publish("", "orders.e2e", amqp.Publishing{MessageId: "e2e-1", Body: []byte("x")})
	rejects := 0
	for rejects < 3 {
		d, ok, err := ch.Get("orders.e2e", false)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if ctx.Err() != nil {
				t.Fatalf("the message came back %d times, want 3", rejects)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		rejects++
		if err := d.Nack(false, false); err != nil {
			t.Fatal(err)
		}
	}

	// Forged origins, from a user who may write where rebound reads: into
	// the inbox, naming the victim in rebound's origin header, and into
	// the hold queue, routed to the victim.
	publish("rebound.dlx", "", amqp.Publishing{MessageId: "forged-inbox", Headers: amqp.Table{"x-retry-origin-queue": victim}})
	publish("rebound.delay.hold", victim, amqp.Publishing{MessageId: "forged-hold",
		Headers: amqp.Table{"x-retry-origin-queue": victim, "x-retry-due-at": time.Now().UnixMilli()}})

	want := map[string]string{"e2e-1": "max-retries", "forged-inbox": "origin-not-allowed", "forged-hold": "origin-not-allowed"}
	parked := map[string]string{}
	for len(parked) < len(want) {
		p, ok, err := ch.Get("rebound.parked", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if ctx.Err() != nil {
				t.Fatalf("parked %v, want %v", parked, want)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		reason, _ := p.Headers["x-retry-parked-reason"].(string)
		parked[p.MessageId] = reason
	}
	for id, reason := range want {
		if parked[id] != reason {
			t.Errorf("parked %s with reason %q, want %q", id, parked[id], reason)
		}
	}
	// Nothing lost, nothing delivered where it may not go.
	for queue, n := range map[string]int{"orders.e2e": 0, victim: 0, "rebound.delay.hold": 0, "rebound.parked": 0, "rebound.inbox": 0} {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages != n {
			t.Errorf("queue %s holds %d messages, want %d", queue, q.Messages, n)
		}
	}

	// rebound's own user cannot write to the victim by name: no write on
	// the default exchange.
	publishRefused(t, ctx, channelAs(t, b, reboundURL), "", victim)
	for _, line := range strings.Split(logs.String(), "\n") {
		if refused(line) && !strings.Contains(line, "due copies go home by dead-lettering") {
			t.Errorf("rebound was refused a permission: %s", line)
		}
	}
	stopsOnSIGTERM(t, rebound, exited)
}

// publishRefused checks that ch's user may not publish to exchange: the
// broker closes the channel with ACCESS_REFUSED.
func publishRefused(t *testing.T, ctx context.Context, ch *amqp.Channel, exchange, key string) {
	t.Helper()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Confirm(false); err != nil {
		t.Error(err)
		return
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{MessageId: "by rebound's user"})
	if err != nil {
		t.Error(err)
		return
	}
	if ok, _ := dc.WaitContext(ctx); ok {
		t.Errorf("rebound's user published to %q, routing key %s", exchange, key)
		return
	}
	cerr := <-closed // amqp091-go nacks what is pending as the channel closes
	if cerr == nil || cerr.Code != amqp.AccessRefused {
		t.Errorf("publishing to %q as rebound's user closed the channel with %v, want ACCESS_REFUSED", exchange, cerr)
	}
}
