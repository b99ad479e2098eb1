package consumer

import (
	"math/rand/v2"
	"testing"
)

const kib, mib = 1 << 10, 1 << 20

func TestWindow(t *testing.T) {
	w := newWindow(1024, 64*mib)
	step := func(what string, do func(), want int) {
		t.Helper()
		do()
		if got := w.want(); got != want {
			t.Errorf("%s: window %d, want %d", what, got, want)
		}
	}
	receive := func(n int, size int64) func() {
		return func() {
			for range n {
				w.received(size)
			}
		}
	}
	step("nothing seen yet", func() {}, 1)
	step("a small message: one more than seen is not counted on", receive(1, kib), 1)
	step("slow start: one more a delivery", receive(9, kib), 10)
	step("the ceiling holds small messages", receive(2000, kib), 1024)
	step("one 8 MB message shrinks it at once", receive(1, 8*mib), 8)
	step("small ones after it grow it back by one each", receive(8, kib), 8)
	step("...doubling a window", receive(8, kib), 16)
	step("until the large one is a ceiling back", receive(1024, kib), 1024)
	step("idle: nothing is known of the next", w.idle, 1)
	step("a message larger than the budget passes, alone", receive(1, 100*mib), 1)
	step("and keeps the window at one while it is among the last", receive(5, kib), 5)
	step("empty messages", func() {
		w.idle()
		receive(3000, 0)()
	}, 1024)

	w2 := newWindow(4, 1*mib)
	for range 10 {
		w2.received(kib)
	}
	if got := w2.want(); got != 4 {
		t.Errorf("ceiling 4: window %d", got)
	}
}

// TestWindowProperties plays a broker that sends the next message
// whenever fewer are unacked than the window allows, one at a time (the
// meter, which stops reading between messages, makes a real broker look
// like that), and rebound settles them in delivery order, as the acker
// does. Whatever the sizes, the window stays within [1, ceiling], the
// bytes unacked within the budget plus one message (the one that showed it
// was large), and after a change to steady sizes the window settles on
// what the budget holds within a bounded number of deliveries.
func TestWindowProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	sizes := []int64{100, kib, 64 * kib, mib, 8 * mib, 100 * mib}
	for round := range 300 {
		ceiling := []int{1, 16, 256, 1024}[r.IntN(4)]
		budget := []int64{1 * mib, 64 * mib, 256 * mib}[r.IntN(3)]
		w := newWindow(ceiling, budget)
		var unacked []int64
		for step := range 5000 {
			// Sizes come in runs, as streams do.
			size := sizes[(step/500+round)%len(sizes)]
			if r.IntN(10) == 0 {
				size = sizes[r.IntN(len(sizes))]
			}
			want := w.want()
			if want < 1 || want > ceiling {
				t.Fatalf("round %d step %d: window %d outside [1, %d]", round, step, want, ceiling)
			}
			if len(unacked) < want {
				var largest int64
				for _, s := range unacked {
					largest = max(largest, s)
				}
				w.received(size)
				unacked = append(unacked, size)
				var held int64
				for _, s := range unacked {
					held += s
				}
				if limit := budget + max(size, largest); held > limit {
					t.Fatalf("round %d step %d: %d bytes unacked in %d deliveries, budget %d", round, step, held, len(unacked), budget)
				}
			}
			if len(unacked) > 0 && r.IntN(3) > 0 {
				unacked = unacked[1:]
			}
		}
		// Steady sizes: the window settles on what the budget holds.
		steady := sizes[r.IntN(len(sizes))]
		for range 2*ceiling + 64 {
			w.received(steady)
		}
		if got, want := w.want(), int(min(max(budget/steady, 1), int64(ceiling))); got != want {
			t.Fatalf("round %d: after steady %d-byte messages the window is %d, want %d", round, steady, got, want)
		}
	}
}
