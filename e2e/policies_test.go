package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// Policies chosen by origin queue, with several replicas on one inbox: a
// message gets its own queue's policy whichever replica takes it, and
// replicas configured differently find each other.

// services sets e up as a vhost shared by three services: orders with
// the default policy (3 retries), payments (1 retry) and mail (5
// retries), each an application queue whose consumer rejects every
// message, and configures their policies. It returns the queues by
// service and their retries.
func (e *testEnv) services() (queues map[string]string, retries map[string]int) {
	e.t.Helper()
	for k, v := range servicePolicies(e.Prefix, 5) {
		e.Vars[k] = v
	}
	queues = map[string]string{"orders": e.App, "payments": e.Prefix + "payments.capture", "mail": e.Prefix + "mail.send"}
	retries = map[string]int{"orders": 3, "payments": 1, "mail": 5}
	for _, s := range []string{"payments", "mail"} {
		e.Declare(queues[s], amqp.Table{"x-dead-letter-exchange": e.Vars["REBOUND_DEAD_LETTER_EXCHANGE"]})
	}
	for _, q := range queues {
		e.rejectAll(q)
	}
	return queues, retries
}

// servicePolicies are the variables of services' policies, with the mail
// policy's retries given.
func servicePolicies(prefix string, mailRetries int) map[string]string {
	return map[string]string{
		"REBOUND_BACKOFF": "constant", "REBOUND_MIN_DELAY": "20ms", "REBOUND_MAX_RETRIES": "3",
		"REBOUND_POLICIES":                    "payments,mail",
		"REBOUND_POLICY_PAYMENTS_QUEUES":      "^" + strings.ReplaceAll(prefix, ".", `\.`) + `payments\.`,
		"REBOUND_POLICY_PAYMENTS_MAX_RETRIES": "1",
		"REBOUND_POLICY_MAIL_QUEUES":          `mail\.send$`,
		"REBOUND_POLICY_MAIL_MAX_RETRIES":     strconv.Itoa(mailRetries),
		"REBOUND_POLICY_MAIL_MIN_DELAY":       "30ms",
	}
}

// publishServices sends n messages to each service's queue, ids
// "<service>-<i>".
func (e *testEnv) publishServices(queues map[string]string, n int) {
	e.t.Helper()
	for s, q := range queues {
		msgs := make([]amqp.Publishing, n)
		for i := range msgs {
			msgs[i] = amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", s, i)}
		}
		e.Publish(q, msgs...)
	}
}

// TestEachOriginGetsItsOwnPolicy: two replicas configured alike share one
// inbox; every message is parked after exactly its own queue's number of
// retries, under its policy's label, whichever replica handled each
// attempt, and no conflict is counted.
func TestEachOriginGetsItsOwnPolicy(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	queues, retries := e.services()
	replicas := []*testEnv{e, e.replica()}
	for _, r := range replicas {
		r.startInProcess()
	}
	const n = 40
	e.publishServices(queues, n)
	parked := e.parkedAll3(queues, n)
	byService := map[string]int{}
	for id, d := range parked {
		service, _, _ := strings.Cut(id, "-")
		byService[service]++
		label, _ := d.Headers["x-retry-policy"].(string)
		if got := d.Headers["x-retry-count"]; got != int64(retries[service]) {
			t.Errorf("%s parked after %v retries, want %s's %d (policy %s)", id, got, service, retries[service], label)
		}
		if want := map[string]string{"orders": "default:", "payments": "payments:", "mail": "mail:"}[service]; !strings.HasPrefix(label, want) {
			t.Errorf("%s parked under policy %q, want %s...", id, label, want)
		}
	}
	conflicts := policyConflicts(replicas)
	if conflicts != 0 {
		t.Errorf("%d policy conflicts between replicas configured alike", conflicts)
	}
	t.Logf("POLICIES broker=%s replicas=2 configured=alike parked=%v conflicts=%d", e.Broker.Version(), byService, conflicts)
}

// TestReplicasConfiguredDifferentlyAreFound: the second replica's mail
// policy allows 7 retries where the first's allows 5. The messages that
// pass through both show it in rebound_policy_conflicts_total (and are
// parked after 5 to 7 retries, as the replicas happen to take them: what
// the metric warns of), and none is lost.
func TestReplicasConfiguredDifferentlyAreFound(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, nil)
	queues, _ := e.services()
	other := e.replica()
	other.Vars["REBOUND_POLICY_MAIL_MAX_RETRIES"] = "7"
	replicas := []*testEnv{e, other}
	for _, r := range replicas {
		r.startInProcess()
	}
	const n = 40
	e.publishServices(queues, n)
	parked := e.parkedAll3(queues, n)
	conflicts := 0
	brokertest.Await(10*time.Second, func() bool {
		conflicts = policyConflicts(replicas)
		return conflicts > 0
	})
	if conflicts == 0 {
		t.Errorf("no policy conflict counted between replicas configured differently")
	}
	mail := 0
	for id, d := range parked {
		if strings.HasPrefix(id, "mail-") {
			mail++
			// Each attempt is decided by whichever replica takes it: one
			// parks from 5 retries on, the other at 7.
			if c, _ := d.Headers["x-retry-count"].(int64); c < 5 || c > 7 {
				t.Errorf("%s parked after %d retries, want 5 to 7", id, c)
			}
		}
	}
	t.Logf("POLICIES broker=%s replicas=2 configured=differently parked=%d mail=%d conflicts=%d", e.Broker.Version(), len(parked), mail, conflicts)
}

// policyConflicts is rebound_policy_conflicts_total summed over replicas.
func policyConflicts(replicas []*testEnv) int {
	sum := 0
	for _, r := range replicas {
		sum += r.metricTotal("rebound_policy_conflicts_total")
	}
	return sum
}

// parkedAll3 waits until every message publishServices sent (n per
// service) is parked, and fails the test for every one missing.
func (e *testEnv) parkedAll3(queues map[string]string, n int) map[string]amqp.Delivery {
	e.t.Helper()
	total := n * len(queues)
	parked := map[string]amqp.Delivery{}
	brokertest.Await(time.Minute, func() bool {
		for _, d := range e.Drain(e.Vars["REBOUND_PARKING_QUEUE"]) {
			parked[d.MessageId] = d
		}
		return len(parked) >= total
	})
	lost := 0
	for s := range queues {
		for i := range n {
			if _, ok := parked[fmt.Sprintf("%s-%d", s, i)]; !ok {
				lost++
			}
		}
	}
	if lost > 0 {
		e.t.Errorf("%d of %d messages not parked within a minute", lost, total)
	}
	e.logAccount(total, lost, 0, 0, "-", 0)
	return parked
}
