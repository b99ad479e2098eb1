package declarer_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/republisher"
)

// notices collects what an Origins noticed.
type notices struct {
	mu  sync.Mutex
	got []string
}

func (n *notices) add(msg string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got = append(n.got, msg)
}

func (n *notices) list() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.got)
}

// TestOriginsExists: a queue seen to exist is trusted for a minute,
// then checked again; a missing one is checked every time.
func TestOriginsExists(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	o := declarer.NewOrigins(b.Dial(t, b.URL), nil, nil, now)
	for queue, want := range map[string]bool{d.App: true, brokertest.Unique(t) + "missing": false} {
		got, checked, err := o.Exists(queue)
		if err != nil || got != want || !checked {
			t.Errorf("Exists(%s) = %v, %v, %v; want %v, checked", queue, got, checked, err, want)
		}
	}
	// Cached for a minute: the queue's deletion is not seen at once.
	if _, err := d.Ch.QueueDelete(d.App, false, false, false); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := o.Exists(d.App); !ok {
		t.Error("Exists rechecked within the minute")
	}
	offset.Add(int64(time.Hour))
	if ok, _, err := o.Exists(d.App); ok || err != nil {
		t.Errorf("Exists after the recheck = %v, %v; want false", ok, err)
	}
}

// TestOriginsWithoutPermission: RabbitMQ 4.2.6 and later refuse a passive
// declaration of a queue the user has no permission on (3.10 answers
// it). A refusal must not end the session: the origin counts as existing,
// unchecked, said once, until a copy sent straight to it comes back: the
// broker's own word, which Exists then goes by.
func TestOriginsWithoutPermission(t *testing.T) {
	t.Parallel()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(false)
	if _, err := declarer.Declare(d.Conn, topo); err != nil {
		t.Fatal(err)
	}
	// Publishing to the default exchange, as rebound's user does, and
	// nothing on the queues.
	_, url := b.User(t, b.URL, "pw", "^x$", `^amq\.default$`, "^x$")
	conn := b.Dial(t, url)
	p, err := republisher.New(conn, topo, 4, 30*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var n notices
	o := declarer.NewOrigins(conn, p.ReturnedSince, n.add, time.Now)
	refused := b.AtLeast(4, 2)
	for range 2 {
		if ok, checked, err := o.Exists(d.App); !ok || checked == refused || err != nil {
			t.Errorf("Exists on RabbitMQ %s = %v, checked %v, %v; want true, checked %v", b.Version(), ok, checked, err, !refused)
		}
	}
	if want := map[bool]int{true: 1, false: 0}[refused]; len(n.list()) != want {
		t.Errorf("notices %q, want %d", n.list(), want)
	}

	gone := brokertest.Unique(t) + "gone"
	outcome := make(chan republisher.Outcome, 1)
	if err := p.Publish(context.Background(), topology.Direct(gone), amqp.Publishing{MessageId: "straight"},
		func(o republisher.Outcome, _ time.Duration) { outcome <- o }); err != nil {
		t.Fatal(err)
	}
	if got := <-outcome; got != republisher.Returned {
		t.Fatalf("copy to a missing queue: %v, want Returned", got)
	}
	if ok, _, err := o.Exists(gone); ok || err != nil {
		t.Errorf("Exists(%s) after its copy came back = %v, %v; want false", gone, ok, err)
	}
}
