package dialer

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
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
	if u, _ := url.Parse(live); s.Host() != u.Host {
		t.Errorf("Host = %q, want the live broker's %q, without credentials", s.Host(), u.Host)
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

// TestDialAsOpensAsThePerson: the console opens a person's connections as
// that person, whatever user the URL names: a wrong password is refused
// without the password in the error, and with the right one the broker
// applies the person's permissions (none here), not the URL's user's.
func TestDialAsOpensAsThePerson(t *testing.T) {
	b := brokertest.Require(t)
	const password = "Qx81vz"
	user, _ := b.User(t, b.URL, password, "^$", "^$", "^$")
	d := New([]string{b.URL}, nil, Client{Name: "rebound test"})
	if _, err := d.DialAs(context.Background(), "console", user, "wrong"+password); err == nil || strings.Contains(err.Error(), password) {
		t.Errorf("DialAs with a wrong password: %v; want refused, without the password", err)
	}
	conn, err := d.DialAs(context.Background(), "console", user, password)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		_, err = ch.QueueDeclare(brokertest.Unique(t)+"q", false, true, false, false, nil)
	}
	if err == nil || !strings.Contains(err.Error(), "ACCESS_REFUSED") {
		t.Errorf("declaring a queue as a person with no permission: %v; want access refused", err)
	}
}

// TestDialViaSeesTheFrames: the wrap DialVia lays over the socket sees
// what the connection reads, as the sidecar's meter of its consume
// connection needs.
func TestDialViaSeesTheFrames(t *testing.T) {
	b := brokertest.Require(t)
	var read atomic.Int64
	wrap := func(c net.Conn) net.Conn { return &countingConn{Conn: c, read: &read} }
	conn, err := New([]string{b.URL}, nil, Client{Name: "rebound test"}).DialVia(context.Background(), "consume", wrap)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before := read.Load()
	if before == 0 {
		t.Fatal("the wrap saw nothing of the handshake")
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if after := read.Load(); after <= before {
		t.Errorf("the wrap read %d bytes before opening a channel and %d after; want the channel's reply counted", before, after)
	}
}

// countingConn counts the bytes read through it.
type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestDial10 opens an AMQP 1.0 connection as the holder of hold mode
// does, on a broker that serves it (RabbitMQ 4.x), and a refused one
// names the broker without its password.
func TestDial10(t *testing.T) {
	b := brokertest.Require(t)
	if !b.AtLeast(4, 0) {
		t.Skipf("RabbitMQ %s serves AMQP 1.0 only with a plugin; hold mode needs 4.3", b.Version())
	}
	conn, err := New([]string{b.URL}, nil, Client{Name: "rebound test"}).Dial10(context.Background(), "hold")
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	_, err = New([]string{brokertest.RefusingURL(t), brokertest.RefusingURL(t)}, nil, Client{Name: "rebound test"}).Dial10(context.Background(), "hold")
	if err == nil || !strings.Contains(err.Error(), "broker 2 of 2") || strings.Contains(err.Error(), brokertest.RefusingPassword) {
		t.Errorf("Dial10 with every broker refusing: %v; want an error naming each broker, without the password", err)
	}
}
