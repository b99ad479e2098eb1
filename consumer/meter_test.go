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
	deliver := []byte{0, 60, 0, 60}
	consumer := fmt.Sprintf("rebound-%016x", tag*7919)
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

		done := make(chan struct{})
		go func() { // amqp091-go's reader
			defer close(done)
			buf := make([]byte, 4096)
			for {
				if _, err := m.Read(buf); err != nil {
					return
				}
			}
		}()

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
