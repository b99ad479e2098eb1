package consumer

import "sync"

// window chooses the inbox's prefetch so that the deliveries rebound
// holds unacked fit its byte budget (REBOUND_INFLIGHT_BYTES), judging by
// the sizes it has just seen: deep for small messages, shallow for large
// ones, never more than the ceiling (REBOUND_PREFETCH), never less than
// one, so that a message larger than the budget still passes, alone.
// RabbitMQ ignores basic.qos's byte limit, so the bound is rebound's own;
// and amqp091-go buffers every delivery the broker sends whether rebound
// reads it or not, so only the prefetch holds them back.
//
// The window grows the way TCP's slow start does: by one a delivery,
// doubling every window, because it never counts on more deliveries than
// it has seen; and it never counts on fewer bytes than the largest of the
// deliveries it would hold, so one large message shrinks it at once. It
// starts at one, and returns to one after a while without deliveries:
// nothing is known of the next messages then, and a deep window would let
// the broker push a whole window of large ones before rebound saw the
// first. While a resource alarm blocks publishing, the session stops
// consuming altogether.
//
// RabbitMQ applies a consumer's prefetch when the consumer starts, never
// after (basic.qos changes only the consumers started after it, on 3.10
// and 4.3 alike, and a channel-wide prefetch is refused on quorum
// queues), so the session applies a new window by cancelling its
// consumer and consuming again (see session.refit).
//
// The window alone cannot bound the bytes: the broker fills every slot of
// a window before rebound reads any of those messages, so when large
// messages follow a deep run of small ones, a whole window of them is on
// its way. The meter holds that back at the socket; the window keeps the
// prefetch, what the broker counts as this replica's, to what the budget
// holds, so that large messages wait in the queue for whichever replica
// has room, and a crash hands back no more than that.
//
// A window is safe for concurrent use.
type window struct {
	mu      sync.Mutex
	ceiling int   // REBOUND_PREFETCH
	budget  int64 // REBOUND_INFLIGHT_BYTES

	count int64 // deliveries received so far, the index of the next
	known int64 // deliveries received since the window last started over
	// recent holds the deliveries that may be the largest of the last
	// ceiling: sizes decreasing from the front, indexes increasing.
	recent []sized
}

type sized struct {
	index int64
	size  int64
}

// newWindow returns a window of at most ceiling deliveries (at least 1)
// and budget bytes (at least 1).
func newWindow(ceiling int, budget int64) *window {
	return &window{ceiling: max(ceiling, 1), budget: max(budget, 1)}
}

// received counts a delivery of size bytes rebound now holds.
func (w *window) received(size int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	size = max(size, 0)
	for len(w.recent) > 0 && w.recent[len(w.recent)-1].size <= size {
		w.recent = w.recent[:len(w.recent)-1]
	}
	w.recent = append(w.recent, sized{index: w.count, size: size})
	w.count++
	w.known = min(w.known+1, int64(w.ceiling))
	// Forget what is older than the longest window.
	for len(w.recent) > 0 && w.recent[0].index <= w.count-1-int64(w.ceiling) {
		w.recent = w.recent[1:]
	}
}

// idle forgets the sizes seen: the next window starts at one.
func (w *window) idle() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recent = w.recent[:0]
	w.known = 0
}

// want is the prefetch to ask the broker for now: the largest n, within
// [1, ceiling] and no more than the deliveries seen since the window
// started over, whose last n deliveries all fit n to the budget (n times
// the largest of them is at most the budget), or 1 before any delivery. A large message shrinks the window at once; as it
// recedes, the window grows by one a delivery, doubling every window,
// until the message falls out of the last ceiling deliveries.
func (w *window) want() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.recent) == 0 {
		return 1
	}
	// recent[j] is the largest of the last n deliveries for n from its
	// distance back, a_j, up to (not including) a_{j-1}: try the deepest
	// range first.
	upper := w.known
	for j := range w.recent {
		a := w.count - w.recent[j].index // how many deliveries back
		n := min(int64(w.fit(w.recent[j].size)), upper)
		if n >= a || j == len(w.recent)-1 {
			return int(max(n, 1))
		}
		upper = a - 1
	}
	return 1
}

// fit is how many deliveries of size bytes the budget holds, within
// [1, ceiling].
func (w *window) fit(size int64) int {
	if size <= 0 {
		return w.ceiling
	}
	n := w.budget / size
	return int(min(max(n, 1), int64(w.ceiling)))
}
