package delayed

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayqueue"
)

// lease publishes a lease of queues for replica into the in-use queue, as
// a running replica does.
func (e *env) lease(replica string, queues ...string) {
	e.t.Helper()
	e.publishLease(delayqueue.Lease{Replica: replica, Queues: queues})
}

// publishLease publishes l into the in-use queue as a replica does (its
// JSON, expiring after an hour), and waits for the broker's confirm, so
// that a reading of the leases after it finds it.
func (e *env) publishLease(l delayqueue.Lease) {
	e.t.Helper()
	body, err := json.Marshal(l)
	if err != nil {
		e.t.Fatal(err)
	}
	e.Publish(e.topo.InUseQueue(), amqp.Publishing{ContentType: "application/json", Expiration: "3600000", Body: body})
}

// exchangeExists reports whether the exchange exists, with a passive
// declaration on a channel of its own.
func (e *env) exchangeExists(name string) bool {
	e.t.Helper()
	ch, err := e.dp.Conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	defer closeChannel(ch)
	err = ch.ExchangeDeclarePassive(name, amqp.ExchangeFanout, true, false, false, false, nil)
	if err != nil && !isCode(err, amqp.NotFound) {
		e.t.Fatal(err)
	}
	return err == nil
}

// TestPruneDeletesOnlyEmptyUnusedDelayQueues: of four delay queues, prune
// deletes the empty one no replica leases, with its exchange, and keeps
// the one that holds a message, the one a replica leases and the one a
// consumer reads; it deletes the exchange a replica's sweep left without
// its queue. A dry run deletes nothing. Classic and quorum delay queues.
func TestPruneDeletesOnlyEmptyUnusedDelayQueues(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType, nil)
		e.declareDelays(time.Second, 3*time.Second, 4*time.Second)
		holds, leased, read := e.delayQueue(10*time.Minute), e.delayQueue(3*time.Second), e.delayQueue(4*time.Second)
		e.seed(waiting{id: "w", origin: e.app("a"), delay: 10 * time.Minute})
		e.lease("replica-1", leased)
		reader, err := e.Conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := reader.Consume(read, "", false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		orphan := e.topo.DelayExchangeFor(5 * time.Second)
		if err := declarer.Exchange(e.Ch, orphan); err != nil {
			t.Fatal(err)
		}
		grid := Delays(2, 10*time.Minute)

		res, err := e.dp.Prune(context.Background(), grid, true)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{e.delayQueue(time.Second): "", holds: whyMessages, leased: whyLeased, read: whyConsumers}
		check := func(what string, res pruneResult) {
			t.Helper()
			got := map[string]string{}
			for _, q := range res.Queues {
				if q.Deleted != (q.Why == "") {
					t.Errorf("%s: %s deleted %v, why %q", what, q.Name, q.Deleted, q.Why)
				}
				got[q.Name] = q.Why
			}
			if len(got) != len(want) {
				t.Errorf("%s: %v, want %v", what, got, want)
			}
			for name, why := range want {
				if got[name] != why {
					t.Errorf("%s: %s: %q, want %q", what, name, got[name], why)
				}
			}
		}
		check("dry run", res)
		if !e.exchangeExists(orphan.Name) || len(e.find()) != 4 {
			t.Fatalf("the dry run deleted something: %d delay queues, orphan exchange %v", len(e.find()), e.exchangeExists(orphan.Name))
		}

		res, err = e.dp.Prune(context.Background(), grid, false)
		if err != nil {
			t.Fatal(err)
		}
		check("prune", res)
		left := map[string]int{}
		for _, q := range e.find() {
			left[q.Name] = q.Messages
		}
		if _, ok := left[e.delayQueue(time.Second)]; ok || len(left) != 3 || left[holds] != 1 {
			t.Errorf("delay queues after prune: %v; want all but %s, %s still holding its message", left, e.delayQueue(time.Second), holds)
		}
		if e.exchangeExists(e.topo.DelayExchangeFor(time.Second).Name) || e.exchangeExists(orphan.Name) {
			t.Error("an exchange of a deleted delay queue, or one left without its queue, still exists")
		}
		// What prune kept still routes: a copy published to the held
		// queue's exchange lands in it.
		e.seed(waiting{id: "w2", origin: "a", delay: 10 * time.Minute})
		e.WaitQueueLen(holds, 2, 10*time.Second)
	})
}

// TestPruneRefusesWhileAReplicaHasNoLease: with more consumers on the
// inbox than leases, prune deletes nothing; once every consumer's replica
// has leased, it goes on.
func TestPruneRefusesWhileAReplicaHasNoLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "classic", nil)
	e.declareDelays(time.Second)
	replica, err := e.Conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replica.Consume(e.topo.InboxQueue, "", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	grid := Delays(2, 10*time.Second)
	res, err := e.dp.Prune(context.Background(), grid, false)
	if !errors.Is(err, ErrUnleased) || len(res.Queues) != 0 || len(e.find()) != 1 {
		t.Fatalf("prune with an unleased replica: %+v, %v; want ErrUnleased and nothing deleted", res, err)
	}
	e.lease("replica-1")
	res, err = e.dp.Prune(context.Background(), grid, false)
	if err != nil || len(res.Queues) != 1 || !res.Queues[0].Deleted || len(e.find()) != 0 {
		t.Fatalf("prune once the replica leased: %+v, %v; want the queue deleted", res, err)
	}
}

// TestDeleteQueueRestoresWhatItFindsInUse: when the queue turns out to
// hold a message once its way in is closed, deleteQueue puts the
// exchange and binding back as they were and keeps it. Classic and
// quorum delay queues.
func TestDeleteQueueRestoresWhatItFindsInUse(t *testing.T) {
	brokertest.EachQueueType(t, func(t *testing.T, queueType string) {
		e := newEnv(t, queueType, nil)
		e.seed(waiting{id: "w", origin: "a", delay: time.Minute})
		q := Queue{Name: e.delayQueue(time.Minute), Delay: time.Minute}
		e.WaitQueueLen(q.Name, 1, 10*time.Second)
		why, err := e.dp.deleteQueue(q)
		if err != nil || why != whyMessages {
			t.Fatalf("deleteQueue of a queue holding a copy: %q, %v; want it kept", why, err)
		}
		e.seed(waiting{id: "w2", origin: "a", delay: time.Minute}) // through the exchange, restored
		e.WaitQueueLen(q.Name, 2, 10*time.Second)
	})
}

// TestReadLeasesTakesEachReplicasNewest: a replica's newest lease names
// every delay queue it still uses, so an older one naming a queue it has
// since forgotten does not count, in whichever order the two wait; a
// lease without a sequence counts whole.
func TestReadLeasesTakesEachReplicasNewest(t *testing.T) {
	e := newEnv(t, "classic", nil)
	for _, l := range []delayqueue.Lease{
		{Replica: "a", Queues: []string{"q1"}, Sequence: 2},
		{Replica: "a", Queues: []string{"q1", "forgotten-by-a"}, Sequence: 1},
		{Replica: "b", Queues: []string{"q2", "forgotten-by-b"}, Sequence: 7},
		{Replica: "b", Queues: []string{"q2"}, Sequence: 8},
		{Replica: "unsequenced", Queues: []string{"q3"}},
	} {
		e.publishLease(l)
	}
	l, err := e.dp.ReadLeases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]bool{"q1": true, "q2": true, "q3": true}; !maps.Equal(l.Queues, want) {
		t.Errorf("leased queues %v, want %v", l.Queues, want)
	}
	if want := map[string]bool{"a": true, "b": true, "unsequenced": true}; !maps.Equal(l.Replicas, want) {
		t.Errorf("replicas %v, want %v", l.Replicas, want)
	}
}
