package republisher

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/topology"
)

// source declares a queue of e's with n messages, ids "0".."n-1", and
// waits until the broker counts them all.
func (e *testEnv) source(suffix string, n int) string {
	e.t.Helper()
	queue := e.Prefix + suffix
	e.Declare(queue, nil)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = msg(string(rune('0' + i)))
	}
	e.Publish(queue, msgs...)
	e.WaitQueueLen(queue, n, 10*time.Second)
	return queue
}

// sourceMover opens a Mover, with window, on a new source queue of n
// messages.
func (e *testEnv) sourceMover(n, window int) (from string, m *Mover) {
	e.t.Helper()
	from = e.source("from", n)
	m, err := OpenMover(e.conn, e.topo, from, window, 10*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	return from, m
}

// TestMoverRemovesOnlyWhatWasConfirmed: a message moved to a queue that
// takes it is removed; one moved where nothing routes is returned and
// stays, as does one read and left alone.
func TestMoverRemovesOnlyWhatWasConfirmed(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	from, m := e.sourceMover(3, 2)
	var outcomes []Outcome
	report := func(o Outcome) { outcomes = append(outcomes, o) }
	for i := 0; ; i++ {
		d, ok, err := m.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		switch i {
		case 0:
			err = m.Move(d, topology.Direct(e.origin), amqp.Publishing{MessageId: d.MessageId, Body: d.Body}, report)
		case 1:
			err = m.Move(d, topology.Direct(e.Prefix+"nowhere"), amqp.Publishing{MessageId: d.MessageId, Body: d.Body}, report)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(outcomes)
	if !slices.Equal(outcomes, []Outcome{Confirmed, Returned}) {
		t.Errorf("outcomes %v, want one confirmed and one returned", outcomes)
	}
	e.WaitQueueLen(from, 2, 10*time.Second)
	e.WaitQueueLen(e.origin, 1, 10*time.Second)
}

// TestMoverSettlesWhenThePublishChannelDies: when the channel the copies
// go out on dies (a broker restart, the connection closed), every copy in
// flight is reported, Settle returns, and the messages whose copies were
// not confirmed stay.
func TestMoverSettlesWhenThePublishChannelDies(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	from, m := e.sourceMover(2, 8)
	var reads []amqp.Delivery
	for {
		d, ok, err := m.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		reads = append(reads, d)
	}
	// The first copy opens the publisher; its channels then close under
	// it before the second copy's confirm can be read.
	if err := m.Move(reads[0], topology.Direct(e.origin), amqp.Publishing{Body: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Settle(); err != nil {
		t.Fatal(err)
	}
	var outcome Outcome = -1
	if err := m.Move(reads[1], topology.Direct(e.origin), amqp.Publishing{Body: []byte("x")}, func(o Outcome) { outcome = o }); err != nil {
		t.Fatal(err)
	}
	_ = m.pub.ch.Close()
	done := make(chan error, 1)
	go func() { done <- m.Settle() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Settle still waiting 10s after its channel closed")
	}
	if outcome != Closed && outcome != Confirmed {
		t.Errorf("the second copy's outcome is %v, want closed (or confirmed, had the confirm come first)", outcome)
	}
	if err := m.Move(reads[1], topology.Direct(e.origin), amqp.Publishing{}, nil); err == nil {
		t.Error("Move after the publishing channel died succeeded")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	want := 1
	if outcome == Confirmed {
		want = 0
	}
	e.WaitQueueLen(from, want, 10*time.Second)
}

// TestMoverOnAMissingQueue says so.
func TestMoverOnAMissingQueue(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, false)
	if _, err := OpenMover(e.conn, e.topo, e.Prefix+"missing", 1, time.Second); !errors.Is(err, ErrNoQueue) {
		t.Errorf("OpenMover on a missing queue: %v, want ErrNoQueue", err)
	}
}

// TestMoverClosingAfterAcksKeepsThemOnAQuorumQueue: the messages a Mover
// removed stay removed when it closes right after the last acks. Without
// the round trip Close makes after them, RabbitMQ (3.10 and 4.3) undid
// most of the acks a quorum queue received just before the channel
// closed: the messages came back.
func TestMoverClosingAfterAcksKeepsThemOnAQuorumQueue(t *testing.T) {
	t.Parallel()
	e := newTestEnv(t, true)
	from := e.Prefix + "from"
	e.Declare(from, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	const n, taken = 1000, 300
	msgs := make([]amqp.Publishing, n)
	e.Publish(from, msgs...)
	e.WaitQueueLen(from, n, 30*time.Second)
	m, err := OpenMover(e.conn, e.topo, from, 1, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Read them all, then remove them all, as Settle does a window of
	// moved messages once their copies are confirmed.
	var read []amqp.Delivery
	for range taken {
		d, ok, err := m.Next(context.Background())
		if err != nil || !ok {
			t.Fatalf("Next: %v, %v", ok, err)
		}
		read = append(read, d)
	}
	for _, d := range read {
		if err := m.Remove(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	e.WaitQueueLen(from, n-taken, 10*time.Second)
	// The messages acked came back within a second, when they did: wait
	// as long for them to, and they must not.
	if brokertest.Await(2*time.Second, func() bool { return e.QueueLen(from) != n-taken }) {
		t.Errorf("%d messages in the queue after the Mover removed %d of %d and closed; want %d", e.QueueLen(from), taken, n, n-taken)
	}
}
