package simulate

// fifo is a first-in first-out queue on a slice that reuses its front
// once half of it has been consumed, so a long run does not keep every
// element it ever held.
type fifo[T any] struct {
	buf  []T
	head int
}

func (q *fifo[T]) push(v T) { q.buf = append(q.buf, v) }

func (q *fifo[T]) len() int { return len(q.buf) - q.head }

// at returns the i-th element from the front; 0 <= i < len.
func (q *fifo[T]) at(i int) *T { return &q.buf[q.head+i] }

// pop removes and returns the front element; the queue must not be empty.
func (q *fifo[T]) pop() T {
	v := q.buf[q.head]
	q.head++
	if q.head >= 1024 && 2*q.head >= len(q.buf) {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	return v
}
