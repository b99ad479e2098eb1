package consumer

import (
	"bufio"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"time"
)

// meter sits between the consume connection's socket (after TLS) and
// amqp091-go's frame reader, and holds the bytes of message bodies in
// rebound to the budget, whatever the broker has already dispatched.
//
// The window sets the prefetch from the sizes rebound has seen, but the
// broker fills every slot of a window before rebound reads the first
// message of it: when large messages follow a deep run of small ones, a
// whole window of large ones is on its way (1024 × 8 MB). amqp091-go reads
// whatever arrives into memory, read by the session or not, so the only
// place to stop it is the socket: the meter stops reading while the
// bodies rebound holds (taken by the session, not yet settled) and those
// read off the socket but not yet taken would pass the budget. The broker
// then keeps the rest, as TCP flow control makes it.
//
// It reads the frames as they pass (7-byte header, payload, frame end),
// one at a time, and counts the payload of body frames, from the content
// header frame's body size, so that it stops only between messages: a
// message larger than the budget is still read whole, alone. So what
// rebound holds of message bodies, taken, waiting or half read, stays
// within the budget plus one message (and the 64 KiB it reads ahead).
//
// It also reads the consumer tag and delivery tag of each basic.deliver,
// so that it knows which message is which and whose. amqp091-go drops a
// delivery whose consumer was cancelled already (the broker may send one
// after basic.cancel-ok): once the session says that consumer ended
// (end), its deliveries, those read and those read later, wait no more:
// the meter hands them to the session (orphans, signalled on orphaned) to
// requeue at once, and wakes the reader. Were they counted as waiting,
// one larger than the budget would stop the reader for good, before the
// replies the session waits for. A delivery dropped otherwise is found
// when the session takes a later one (take). Either way the session
// requeues it: a multiple ack would otherwise cover a delivery rebound
// never saw, and the broker would forget a message that was never
// copied.
//
// While it waits, nothing is read on the connection: replies to the
// session's calls and the broker's heartbeats wait too. The read deadline
// amqp091-go sets for heartbeats counts from when reading resumes, and
// Close (or release) ends any wait.
//
// The reader calls Read; take, settle, release and Close may be called
// from any goroutine.
type meter struct {
	net.Conn
	budget int64

	socket *bufio.Reader // the connection, read in large pieces

	mu    sync.Mutex
	ready *sync.Cond
	// received is the body bytes of the messages read whole off the
	// socket, taken the bytes of the deliveries the session took (or
	// that never reached it): what waits in amqp091-go is the
	// difference. held is the bytes taken and not settled.
	received, taken, held int64
	// arrived is the messages read whole and not yet taken, in the order
	// they came, which is their delivery tags' order.
	arrived  []arrival
	peak     int64 // the most of held plus waiting
	released bool  // no more waiting: the connection is closing
	span     time.Duration
	// ended is the consumers the session said ended, newest last (a few:
	// a cancelled consumer's stray deliveries come soon after it ends);
	// orphans the deliveries of theirs not yet handed to the session, and
	// orphaned signals when there are some.
	ended    []string
	orphans  []uint64
	orphaned chan struct{}
	// waitingSince is when Read began to wait, zero while it reads, by
	// now (time.Now unless set).
	waitingSince time.Time
	now          func() time.Time
	// observe hears what rebound holds after each take and settle (the
	// gauge rebound_inflight_bytes); it is called with mu held.
	observe func(bytes int64)

	// The frame being read, on the reader's goroutine only.
	head    [7]byte
	headLen int
	left    int64 // bytes of the frame still to come, its end byte included
	typ     byte
	payload []byte // a frame's first bytes: up to a content header's body size, a basic.deliver's delivery tag
	body    int64  // body bytes of the message in progress still to come
	partial int64  // body bytes of the message in progress read so far
	tag     uint64 // the delivery tag of the last basic.deliver: the message in progress
	by      string // and its consumer tag
}

// arrival is a message read whole off the socket.
type arrival struct {
	tag  uint64 // 0 if its basic.deliver was not read (a basic.get-ok)
	by   string // its consumer tag
	size int64
}

// maxEnded is how many ended consumers the meter remembers.
const maxEnded = 8

// AMQP 0-9-1 frame types, and basic.deliver's class and method.
const (
	frameMethod = 1
	frameHeader = 2 // content header: class, weight, body size, properties
	frameBody   = 3

	classBasic    = 60
	methodDeliver = 60
)

func newMeter(conn net.Conn, budget int64) *meter {
	m := &meter{Conn: conn, budget: max(budget, 1), socket: bufio.NewReaderSize(conn, 64<<10),
		orphaned: make(chan struct{}, 1), now: time.Now}
	m.ready = sync.NewCond(&m.mu)
	return m
}

// Read waits, between messages, while what rebound holds and what waits
// to be taken would pass the budget, then reads, never past the end of a
// frame: so every frame, and the start of every message, passes the
// check. The socket is read through a buffer of its own, so that this
// costs no system call per frame.
func (m *meter) Read(p []byte) (int, error) {
	m.mu.Lock()
	waited := false
	for m.full() {
		if !waited {
			m.waitingSince = m.now()
		}
		waited = true
		m.ready.Wait()
	}
	m.waitingSince = time.Time{}
	span := m.span
	m.mu.Unlock()
	if waited && span > 0 {
		// amqp091-go's heartbeat deadline, counted from now.
		if err := m.Conn.SetReadDeadline(time.Now().Add(span)); err != nil {
			return 0, err
		}
	}
	limit := int64(len(m.head) - m.headLen)
	if m.left > 0 {
		limit = m.left
	}
	if int64(len(p)) > limit {
		p = p[:limit]
	}
	n, err := m.socket.Read(p)
	m.count(p[:n])
	return n, err
}

// full reports whether reading must wait: between messages, with
// something held or waiting, and no room left in the budget. m.mu is held.
func (m *meter) full() bool {
	waiting := m.received - m.taken
	return !m.released && m.body == 0 && m.held+waiting > 0 && m.held+waiting >= m.budget
}

// count follows the frames in b, as read off the socket.
func (m *meter) count(b []byte) {
	for len(b) > 0 {
		if m.left == 0 {
			k := copy(m.head[m.headLen:], b)
			m.headLen += k
			b = b[k:]
			if m.headLen < len(m.head) {
				return
			}
			m.typ = m.head[0]
			m.left = int64(binary.BigEndian.Uint32(m.head[3:7])) + 1 // the payload, then the frame end
			m.headLen = 0
			m.payload = m.payload[:0]
			continue
		}
		k := min(int64(len(b)), m.left)
		chunk := b[:k]
		b = b[k:]
		m.left -= k
		if m.left == 0 {
			chunk = chunk[:len(chunk)-1] // the frame end
		}
		switch m.typ {
		case frameMethod:
			m.readDeliver(chunk)
		case frameHeader:
			// class (2), weight (2), body size (8): enough to know how
			// much body follows.
			if need := 12 - len(m.payload); need > 0 {
				m.payload = append(m.payload, chunk[:min(need, len(chunk))]...)
				if len(m.payload) == 12 {
					m.body = int64(binary.BigEndian.Uint64(m.payload[4:12]))
					m.partial = 0
					if m.body == 0 {
						m.arrive()
					}
				}
			}
		case frameBody:
			n := int64(len(chunk))
			if n == 0 {
				continue // the frame end alone: the message is where it was
			}
			m.body -= n
			m.partial += n
			if m.body <= 0 {
				m.body = 0
				m.arrive()
			}
		}
	}
}

// readDeliver reads a method frame's payload as it passes, up to a
// basic.deliver's delivery tag: class (2), method (2), consumer tag (a
// short string), delivery tag (8).
func (m *meter) readDeliver(chunk []byte) {
	for len(chunk) > 0 {
		need := 5
		if len(m.payload) >= 5 {
			if binary.BigEndian.Uint16(m.payload[0:2]) != classBasic || binary.BigEndian.Uint16(m.payload[2:4]) != methodDeliver {
				return
			}
			need = 5 + int(m.payload[4]) + 8
		}
		if len(m.payload) >= need {
			return
		}
		k := min(need-len(m.payload), len(chunk))
		m.payload = append(m.payload, chunk[:k]...)
		chunk = chunk[k:]
		if need > 5 && len(m.payload) == need {
			m.tag = binary.BigEndian.Uint64(m.payload[need-8:])
			m.by = string(m.payload[5 : need-8])
			return
		}
	}
}

// arrive records that the message in progress was read whole.
func (m *meter) arrive() {
	m.mu.Lock()
	m.received += m.partial
	a := arrival{tag: m.tag, by: m.by, size: m.partial}
	if a.tag != 0 && slices.Contains(m.ended, a.by) {
		m.orphan(a)
	} else {
		m.arrived = append(m.arrived, a)
	}
	m.peak = max(m.peak, m.held+m.received-m.taken)
	m.mu.Unlock()
	m.partial, m.tag, m.by = 0, 0, ""
}

// orphan hands a, a delivery of an ended consumer, to the session to
// requeue: it waits no more. m.mu is held.
func (m *meter) orphan(a arrival) {
	m.taken += a.size
	m.orphans = append(m.orphans, a.tag)
	select {
	case m.orphaned <- struct{}{}:
	default: // signalled already
	}
}

// end records that the session's consumer tag ended (its deliveries
// channel closed after basic.cancel-ok): its deliveries read and not
// taken, and those read later, are orphans, and the reader reads on.
func (m *meter) end(consumer string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.ended) == maxEnded {
		m.ended = slices.Delete(m.ended, 0, 1)
	}
	m.ended = append(m.ended, consumer)
	kept := m.arrived[:0]
	for _, a := range m.arrived {
		if a.tag != 0 && a.by == consumer {
			m.orphan(a)
		} else {
			kept = append(kept, a)
		}
	}
	clear(m.arrived[len(kept):])
	m.arrived = kept
	m.report()
	m.ready.Broadcast()
}

// takeOrphans returns the deliveries of ended consumers not handed to the
// session yet, for it to requeue.
func (m *meter) takeOrphans() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	tags := m.orphans
	m.orphans = nil
	return tags
}

// stalled is how long Read has waited while rebound holds nothing taken
// (what waits is only in amqp091-go, for the session to take): 0 when it
// reads, or waits on deliveries rebound holds.
func (m *meter) stalled(now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waitingSince.IsZero() || m.held > 0 {
		return 0
	}
	return max(now.Sub(m.waitingSince), 0)
}

// take records that the session took the delivery tag of size body
// bytes, and returns the tags of the deliveries read off the socket
// before it that never reached the session, and of the orphans not handed
// over yet: their bytes wait no more.
func (m *meter) take(tag uint64, size int64) (dropped []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Orphans first: the acker must register them before tag.
	dropped, m.orphans = m.orphans, nil
	for len(m.arrived) > 0 && m.arrived[0].tag != 0 && m.arrived[0].tag < tag {
		dropped = append(dropped, m.arrived[0].tag)
		m.taken += m.arrived[0].size
		m.arrived = m.arrived[1:]
	}
	if len(m.arrived) > 0 && (m.arrived[0].tag == tag || m.arrived[0].tag == 0) {
		m.arrived = m.arrived[1:]
	}
	if len(m.arrived) == 0 {
		m.arrived = nil // do not keep a large backing array alive
	}
	m.taken += size
	m.held += size
	m.report()
	return dropped
}

// settle records that deliveries of size body bytes in all were acked or
// requeued.
func (m *meter) settle(size int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held = max(m.held-size, 0)
	m.report()
	m.ready.Broadcast()
}

// report hands what rebound holds to observe, if set. m.mu is held: the
// session's takes and the acker's settles report in the order they
// happen, so the last report is never a stale one.
func (m *meter) report() {
	if m.observe != nil {
		m.observe(m.held + m.received - m.taken)
	}
}

// bytes is what rebound holds of message bodies: taken and not settled,
// and read off the socket but not taken yet.
func (m *meter) bytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held + m.received - m.taken
}

// peakBytes is the most bytes has been.
func (m *meter) peakBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}

// release ends every wait, for good: the connection is closing, and its
// close handshake must be read.
func (m *meter) release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = true
	m.ready.Broadcast()
}

// SetReadDeadline remembers the span amqp091-go asks for (it sets one
// after every frame, for heartbeats), so that a wait does not use it up.
func (m *meter) SetReadDeadline(t time.Time) error {
	m.rememberSpan(t)
	return m.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline for both directions.
func (m *meter) SetDeadline(t time.Time) error {
	m.rememberSpan(t)
	return m.Conn.SetDeadline(t)
}

// rememberSpan keeps how long from now the deadline t is, 0 for none.
func (m *meter) rememberSpan(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.IsZero() {
		m.span = 0
	} else {
		m.span = time.Until(t)
	}
}

func (m *meter) Close() error {
	m.release()
	return m.Conn.Close()
}
