package dialer

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
)

// hangUp listens on a port and closes every connection at once, counting
// them: a broker that is there but will not talk.
func hangUp(t *testing.T) (url string, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return "amqp://guest:guest@" + l.Addr().String() + "/", accepted
}

func TestDialSkipsBrokersThatFailAndStartsWithTheLastThatWorked(t *testing.T) {
	live := brokertest.Require(t).URL
	first, firstCalls := hangUp(t)
	s := New([]string{first, brokertest.RefusingURL(t), live}, nil, Client{Name: "rebound test"})
	s.next.Store(0) // New starts at a random one
	conn, err := s.Dial(context.Background(), "test")
	if err != nil {
		t.Fatalf("dial with the live broker third: %v", err)
	}
	conn.Close()
	if got := s.next.Load(); got != 2 {
		t.Errorf("after dialling, the preferred broker is %d, want 2 (the live one)", got)
	}
	if n := firstCalls.Load(); n != 1 {
		t.Errorf("the first dial reached the first broker %d times, want 1", n)
	}
	conn, err = s.Dial(context.Background(), "test")
	if err != nil {
		t.Fatalf("second dial: %v", err)
	}
	conn.Close()
	if n := firstCalls.Load(); n != 1 {
		t.Errorf("the second dial went to the first broker again (%d connections), want straight to the live one", n-1)
	}
}

func TestDialErrorNamesEveryBrokerButNoPassword(t *testing.T) {
	s := New([]string{brokertest.RefusingURL(t), brokertest.RefusingURL(t)}, nil, Client{Name: "rebound"})
	_, err := s.Dial(context.Background(), "consume")
	if err == nil {
		t.Fatal("dial succeeded with every broker refusing")
	}
	msg := err.Error()
	for _, want := range []string{"connect: ", "broker 1 of 2", "broker 2 of 2", "connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, brokertest.RefusingPassword) {
		t.Errorf("error %q holds the password", msg)
	}
}

func TestDialStopsTryingOnceCancelled(t *testing.T) {
	s := New([]string{brokertest.RefusingURL(t), brokertest.RefusingURL(t), brokertest.RefusingURL(t)}, nil, Client{Name: "rebound"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Dial(ctx, "consume")
	if err == nil {
		t.Fatal("dial succeeded with a cancelled context")
	}
	if n := strings.Count(err.Error(), "broker "); n != 1 {
		t.Errorf("a cancelled dial tried %d brokers, want 1: %v", n, err)
	}
}

// TestDialAbandonsAHandshakeWhenCancelled: a server that accepts the
// connection and never answers holds the AMQP handshake for up to 30s;
// cancelling the context ends it at once.
func TestDialAbandonsAHandshakeWhenCancelled(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	t.Cleanup(func() {
		l.Close()
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- c // held open, silent
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	conn, err := New([]string{"amqp://guest:guest@" + l.Addr().String() + "/"}, nil, Client{Name: "rebound"}).Dial(ctx, "test")
	if err == nil {
		conn.Close()
		t.Fatal("Dial succeeded against a server that never answers")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Dial returned after %s, want soon after the context's 200ms deadline", took.Round(time.Millisecond))
	}
}

// TestDialIntroducesRebound: the broker lists each connection with the
// name, product and version the Dialer's Client gives, as the management
// UI shows them.
func TestDialIntroducesRebound(t *testing.T) {
	b := brokertest.Require(t)
	name := "rebound 9.9.9 on " + brokertest.Unique(t)
	conn, err := New([]string{b.URL}, nil, Client{Name: name, Version: "9.9.9", Platform: "go1.99"}).Dial(context.Background(), "consume")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := map[string]string{
		"connection_name": name + " consume",
		"product":         "rebound",
		"version":         "9.9.9",
		"platform":        "go1.99 (amqp091-go)",
	}
	var got map[string]string
	ok := brokertest.Await(10*time.Second, func() bool {
		var conns []struct {
			Props json.RawMessage `json:"client_properties"`
		}
		out := b.MustCtl(t, "-q", "list_connections", "client_properties", "--formatter", "json")
		if err := json.Unmarshal([]byte(out), &conns); err != nil {
			t.Fatalf("list_connections: %v\n%s", err, out)
		}
		for _, c := range conns {
			// Another test's connection still opening lists its
			// properties as "none": not a list, and not ours.
			var list [][]any
			if json.Unmarshal(c.Props, &list) != nil {
				continue
			}
			props := map[string]string{}
			for _, p := range list {
				if len(p) == 3 {
					k, _ := p[0].(string)
					v, _ := p[2].(string)
					props[k] = v
				}
			}
			if props["connection_name"] == want["connection_name"] {
				got = props
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no connection named %q listed by the broker", want["connection_name"])
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("client property %s = %q, want %q", k, got[k], v)
		}
	}
}
