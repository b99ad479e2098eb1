package consumer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

// frame encodes one AMQP 0-9-1 frame.
func frame(typ byte, payload []byte) []byte {
	out := []byte{typ, 0, 1, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[3:], uint32(len(payload)))
	out = append(out, payload...)
	return append(out, 0xCE)
}

// deliveryFrames is what the broker sends for delivery tag of size body
// bytes: basic.deliver, the content header, the body in frames of at most
// frameMax bytes.
func deliveryFrames(tag uint64, size, frameMax int) []byte {
	return deliveryFramesBy(fmt.Sprintf("rebound-%016x", tag*7919), tag, size, frameMax)
}

// deliveryFramesBy is deliveryFrames for consumer tag consumer.
func deliveryFramesBy(consumer string, tag uint64, size, frameMax int) []byte {
	deliver := []byte{0, 60, 0, 60}
	deliver = append(deliver, byte(len(consumer)))
	deliver = append(deliver, consumer...)
	deliver = binary.BigEndian.AppendUint64(deliver, tag)
	deliver = append(deliver, 0) // redelivered
	for _, short := range []string{"", "rt.inbox"} {
		deliver = append(deliver, byte(len(short)))
		deliver = append(deliver, short...)
	}
	out := frame(1, deliver)
	header := make([]byte, 14)
	binary.BigEndian.PutUint16(header[0:], 60)
	binary.BigEndian.PutUint64(header[4:], uint64(size))
	out = append(out, frame(frameHeader, header)...)
	for size > 0 {
		n := min(size, frameMax)
		out = append(out, frame(frameBody, bytes.Repeat([]byte{'x'}, n))...)
		size -= n
	}
	return out
}

// chunkedConn hands out its stream in random pieces, as a socket does,
// and calls check on the reader's goroutine before each.
type chunkedConn struct {
	net.Conn // nil: only Read and Close are used
	r        *rand.Rand
	stream   []byte
	check    func()
}

func (c *chunkedConn) Read(p []byte) (int, error) {
	if c.check != nil {
		c.check()
	}
	if len(c.stream) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), 1+c.r.IntN(3000), len(c.stream))
	copy(p, c.stream[:n])
	c.stream = c.stream[n:]
	return n, nil
}

func (c *chunkedConn) Close() error                       { return nil }
func (c *chunkedConn) SetReadDeadline(time.Time) error    { return nil }
func (c *chunkedConn) SetDeadline(time.Time) error        { return nil }
func (c *chunkedConn) SetWriteDeadline(t time.Time) error { return nil }

// TestMeterHoldsBytesToTheBudget plays the broker's side of a consume
// connection with messages of random sizes, some larger than the budget,
// and the session's: it takes each message once the meter has read it
// whole, and settles what it took in random order of time. Whatever the
// sizes and however the socket splits the stream, the bodies held, waiting
// and half read never pass the budget by more than one message, and
// every message gets through.
func TestMeterHoldsBytesToTheBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 30 {
		budget := int64([]int{4 << 10, 32 << 10, 256 << 10}[r.IntN(3)])
		var sizes []int64
		var stream []byte
		var largest int64
		for i := range 50 + r.IntN(100) {
			size := int64([]int{0, 10, 1000, 5000, 20000, 70000}[r.IntN(6)])
			sizes = append(sizes, size)
			largest = max(largest, size)
			stream = append(stream, deliveryFrames(uint64(i+1), int(size), 4096)...)
		}
		var m *meter
		conn := &chunkedConn{r: rand.New(rand.NewPCG(uint64(round), 9)), stream: stream}
		var violation string
		conn.check = func() { // on the reader's goroutine, where partial lives
			m.mu.Lock()
			total := m.held + m.received - m.taken + m.partial
			m.mu.Unlock()
			if total > budget+largest && violation == "" {
				violation = "over the budget"
				t.Errorf("round %d: %d bytes held, waiting and half read, budget %d, largest message %d", round, total, budget, largest)
			}
		}
		m = newMeter(conn, budget)
		done := readToTheEnd(m)

		var mu sync.Mutex
		var held []int64
		settler := rand.New(rand.NewPCG(uint64(round), 10))
		deadline := time.Now().Add(20 * time.Second)
		taken := 0
		for taken < len(sizes) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d of %d messages taken in 20s: the meter waits forever", round, taken, len(sizes))
			}
			progressed := false
			// As amqp091-go hands them over: each once read whole.
			for taken < len(sizes) && m.waitingMessages() > 0 {
				if dropped := m.take(uint64(taken+1), sizes[taken]); len(dropped) > 0 {
					t.Fatalf("round %d: taking delivery %d, the meter says %v were dropped", round, taken+1, dropped)
				}
				mu.Lock()
				held = append(held, sizes[taken])
				mu.Unlock()
				taken++
				progressed = true
			}
			mu.Lock()
			if len(held) > 0 && (settler.IntN(2) == 0 || !progressed) {
				k := 1 + settler.IntN(len(held))
				var n int64
				for _, s := range held[:k] {
					n += s
				}
				held = held[k:]
				mu.Unlock()
				m.settle(n)
			} else {
				mu.Unlock()
			}
			if !progressed {
				time.Sleep(100 * time.Microsecond) // let the reader run
			}
		}
		m.settle(1 << 40)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the reader did not reach the end of the stream", round)
		}
		if got := m.bytes(); got != 0 {
			t.Errorf("round %d: %d bytes counted after everything was taken and settled", round, got)
		}
	}
}

// TestMeterReleaseEndsWaits: a reader waiting on a full budget reads on
// once the meter is released, as the connection closes.
func TestMeterReleaseEndsWaits(t *testing.T) {
	stream := append(deliveryFrames(1, 5000, 4096), deliveryFrames(2, 5000, 4096)...)
	m := newMeter(&chunkedConn{r: rand.New(rand.NewPCG(1, 1)), stream: stream}, 1000)
	buf := make([]byte, 64<<10)
	for m.bytes() == 0 {
		if _, err := m.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	read := make(chan error, 1)
	go func() {
		_, err := m.Read(buf)
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("read past a full budget: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	m.release()
	select {
	case <-read:
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after release")
	}
}

// TestMeterNamesDeliveriesThatNeverReachedTheSession: deliveries read off
// the socket but never taken (amqp091-go drops one whose consumer was
// cancelled already) are named when a later one is taken, whatever the
// consumer tag's length and however the socket splits the frames, and
// their bytes no longer count.
func TestMeterNamesDeliveriesThatNeverReachedTheSession(t *testing.T) {
	sizes := []int{100, 0, 3000, 10, 70000, 5}
	var stream []byte
	for i, size := range sizes {
		stream = append(stream, deliveryFrames(uint64(i+1), size, 4096)...)
		// Frames of other methods and channels in between.
		stream = append(stream, frame(1, []byte{0, 50, 0, 11, 0, 0, 0, 0})...)
	}
	for seed := range uint64(20) {
		m := newMeter(&chunkedConn{r: rand.New(rand.NewPCG(seed, 5)), stream: slices.Clone(stream)}, 1<<30)
		buf := make([]byte, 4096)
		for {
			if _, err := m.Read(buf); err != nil {
				break
			}
		}
		var got [][]uint64
		for _, tag := range []uint64{1, 4, 6} {
			got = append(got, m.take(tag, int64(sizes[tag-1])))
		}
		want := [][]uint64{nil, {2, 3}, {5}}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: taking deliveries 1, 4 and 6, the meter named %v as dropped, want %v", seed, got, want)
		}
		m.settle(int64(sizes[0] + sizes[3] + sizes[5]))
		if b := m.bytes(); b != 0 {
			t.Errorf("seed %d: %d bytes counted after the deliveries taken were settled", seed, b)
		}
	}
}

// waitingMessages is how many messages were read whole and not taken.
func (m *meter) waitingMessages() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.arrived)
}

// readToTheEnd reads m, as amqp091-go's reader does, until it fails (the
// end of the stream); done is closed then.
func readToTheEnd(m *meter) (done <-chan struct{}) {
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		buf := make([]byte, 4096)
		for {
			if _, err := m.Read(buf); err != nil {
				return
			}
		}
	}()
	return ended
}

// basicFrame is a basic method frame with a short string argument (a
// consumer tag), as basic.cancel-ok and basic.consume-ok are.
func basicFrame(method uint16, consumer string) []byte {
	payload := []byte{0, 60, 0, byte(method)}
	payload = append(payload, byte(len(consumer)))
	return frame(1, append(payload, consumer...))
}

// gatedConn hands out its parts one after the other, each in random
// pieces, and waits before part i+1 until gates[i] is closed.
type gatedConn struct {
	chunkedConn
	parts [][]byte
	gates []chan struct{}
	next  int // the part to hand out next
}

func (c *gatedConn) Read(p []byte) (int, error) {
	for len(c.stream) == 0 {
		if c.next == len(c.parts) {
			return 0, io.EOF
		}
		if c.next > 0 {
			<-c.gates[c.next-1]
		}
		c.stream = c.parts[c.next]
		c.next++
	}
	return c.chunkedConn.Read(p)
}

// TestMeterRequeuesWhatAnEndedConsumerIsSent plays a consumer replaced
// for a new prefetch, whose queue sends it a delivery after
// basic.cancel-ok, larger than the whole budget: amqp091-go drops it.
// Once the session says the consumer ended (its deliveries channel closed
// on basic.cancel-ok), the meter hands that delivery over to be requeued
// and reads on: basic.qos-ok, basic.consume-ok and the new consumer's
// first delivery, which the session takes; the meter counts nothing
// left. The delivery comes before or after the session says so. Before,
// the meter counted its bytes as waiting to be taken and stopped reading
// for good, before the replies the session waited for.
func TestMeterRequeuesWhatAnEndedConsumerIsSent(t *testing.T) {
	const budget = 1000
	old, next := "rebound-old", "rebound-new"
	before := append(deliveryFramesBy(old, 1, 100, 4096), deliveryFramesBy(old, 2, 100, 4096)...)
	before = append(before, basicFrame(31, old)...) // basic.cancel-ok
	stray := deliveryFramesBy(old, 3, 5000, 4096)
	after := append(frame(1, []byte{0, 60, 0, 11}), basicFrame(21, next)...) // basic.qos-ok, basic.consume-ok
	after = append(after, deliveryFramesBy(next, 4, 10, 4096)...)
	for _, strayFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("stray read before the end: %v", strayFirst), func(t *testing.T) {
			ended := make(chan struct{})
			conn := &gatedConn{chunkedConn: chunkedConn{r: rand.New(rand.NewPCG(1, 2))}, parts: [][]byte{slices.Concat(before, stray, after)}}
			if !strayFirst {
				conn.parts = [][]byte{before, slices.Concat(stray, after)}
				conn.gates = []chan struct{}{ended}
			}
			clock := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
			var clockMu sync.Mutex
			now := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }
			m := newMeter(conn, budget)
			m.now = now
			done := readToTheEnd(m)
			await := func(what string, cond func() bool) {
				t.Helper()
				for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("waited 10 s for %s", what)
					}
				}
			}
			// The session takes the old consumer's two deliveries, and
			// they are acked.
			await("the first two deliveries", func() bool { return m.waitingMessages() >= 2 })
			for tag := uint64(1); tag <= 2; tag++ {
				if dropped := m.take(tag, 100); len(dropped) > 0 {
					t.Fatalf("taking %d: %v named dropped", tag, dropped)
				}
			}
			m.settle(200)
			if strayFirst {
				// The stray, alone past the budget, stops the reader: a
				// stall, with nothing held.
				await("the reader to wait on the stray", func() bool { return !m.waitingSinceZero() })
				clockMu.Lock()
				clock = clock.Add(time.Minute)
				clockMu.Unlock()
				if got := m.stalled(now()); got != time.Minute {
					t.Errorf("stalled for %v, want a minute", got)
				}
			}
			m.end(old)
			close(ended)
			var requeued []uint64
			await("the stray handed over", func() bool {
				select {
				case <-m.orphaned:
					requeued = append(requeued, m.takeOrphans()...)
				default:
				}
				return len(requeued) > 0
			})
			if !slices.Equal(requeued, []uint64{3}) {
				t.Fatalf("handed over %v to requeue, want [3]", requeued)
			}
			await("the new consumer's delivery", func() bool { return m.waitingMessages() >= 1 })
			if dropped := m.take(4, 10); len(dropped) > 0 {
				t.Fatalf("taking 4: %v named dropped, the stray twice?", dropped)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the reader did not reach the end of the stream")
			}
			if got := m.stalled(now()); got != 0 {
				t.Errorf("stalled for %v after the stray was handed over", got)
			}
			m.settle(10)
			if got := m.bytes(); got != 0 {
				t.Errorf("%d bytes counted after everything was taken or handed over and settled", got)
			}
		})
	}
}

// waitingSinceZero reports whether Read is not waiting.
func (m *meter) waitingSinceZero() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waitingSince.IsZero()
}
