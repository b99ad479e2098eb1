package topology_test

import (
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// TestWatchTokenHasOneHolder: of three connections that join the watch,
// one holds the token; when its connection closes, another does, and
// the queue never keeps more than one token ready however many joined.
func TestWatchTokenHasOneHolder(t *testing.T) {
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(false)
	conns := make([]*amqp.Connection, 3)
	tokens := make([]<-chan amqp.Delivery, 3)
	for i := range conns {
		conns[i] = b.Dial(t, d.URL())
		ch, err := conns[i].Channel()
		if err != nil {
			t.Fatal(err)
		}
		if tokens[i], err = topo.JoinWatch(ch, "candidate"); err != nil {
			t.Fatal(err)
		}
	}
	holders := map[int]bool{}
	take := func(from map[int]bool) int {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			for i := range tokens {
				if from[i] {
					continue
				}
				select {
				case _, ok := <-tokens[i]:
					if ok {
						return i
					}
				default:
				}
			}
			select {
			case <-deadline:
				t.Fatal("no candidate got the token within 15s")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	first := take(holders)
	holders[first] = true
	// The queue holds at most one token besides the one held.
	d.WaitQueueLen(topo.WatchQueue(), 1, 10*time.Second)
	if err := conns[first].Close(); err != nil {
		t.Fatal(err)
	}
	second := take(holders)
	for i := range tokens {
		if i == first || i == second {
			continue
		}
		select {
		case <-tokens[i]:
			t.Errorf("candidate %d got a token while %d holds one", i, second)
		case <-time.After(time.Second): // a token, if any, would have come by now
		}
	}
}

// TestWatchInHoldModeWithoutDefaultExchangeWrite: in hold mode the token
// goes through the watch queue's own exchange, so a user without write on
// the default exchange (hold mode's least privilege) still holds it.
func TestWatchInHoldModeWithoutDefaultExchangeWrite(t *testing.T) {
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(false)
	topo.Hold = true
	own := "^" + regexp.QuoteMeta(d.Prefix) + ".*$"
	_, url := b.User(t, d.URL(), "pw", own, own, own)
	ch, err := b.Dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	token, err := topo.JoinWatch(ch, "candidate")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-token:
		if !ok {
			t.Fatal("the watch channel closed without a token")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no token within 15s")
	}
}
