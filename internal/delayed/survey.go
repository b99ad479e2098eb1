package delayed

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/republisher"
)

// originWaiting is what waits in the delay queues for one origin queue.
type originWaiting struct {
	Origin string // the queue the copies go back to (route.Router.WaitingOrigin)
	Count  int
	// Earliest and Latest are the first and last due times
	// (x-retry-due-at); zero when no copy says (copies of a rebound before
	// the header).
	Earliest, Latest time.Time
	// NoDueTime counts the copies that do not say when they are due.
	NoDueTime int
	// Due counts the copies by when they are due, in the windows of
	// DueWindows; a copy past the last window counts in the last.
	Due [len(dueWindows)]int
}

// dueWindows are the windows Survey counts due times in: due within a
// minute, ten minutes, an hour, a day, and later.
var dueWindows = [...]time.Duration{time.Minute, 10 * time.Minute, time.Hour, 24 * time.Hour, 1<<63 - 1}

// Survey is what Survey found: the copies waiting per origin queue.
type Survey struct {
	Queues  int             // delay queues read
	Read    int             // copies read
	Origins []originWaiting // most copies first, then by origin
}

// Survey reads every copy waiting in queues (as Find returned them) once,
// holding the lock of the delay queues as Move does, and counts them by
// origin queue and due time, leaving every one where it was: requeued
// when its queue is done, it keeps its place in time. It is what a
// person sees before flushing or cancelling the copies of an origin.
func (dp Deployment) Survey(ctx context.Context, queues []Queue, now time.Time) (s Survey, err error) {
	unlock, err := dp.lock(ctx)
	if err != nil {
		return s, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	by := map[string]*originWaiting{}
	for _, q := range queues {
		if ctx.Err() != nil {
			break
		}
		if err := dp.surveyQueue(ctx, q, now, by, &s); err != nil {
			return s, err
		}
		s.Queues++
	}
	for _, w := range by {
		s.Origins = append(s.Origins, *w)
	}
	slices.SortFunc(s.Origins, func(a, b originWaiting) int {
		return cmp.Or(b.Count-a.Count, strings.Compare(a.Origin, b.Origin))
	})
	return s, ctx.Err()
}

// surveyQueue is Survey on one delay queue.
func (dp Deployment) surveyQueue(ctx context.Context, q Queue, now time.Time, by map[string]*originWaiting, s *Survey) (err error) {
	m, err := republisher.OpenMover(dp.Conn, dp.Router.Topology, q.Name, 1, time.Second)
	if errors.Is(err, republisher.ErrNoQueue) {
		return nil // deleted since it was found: nothing waited in it
	}
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()

	for {
		d, ok, err := m.Next(ctx)
		if err != nil || !ok {
			return err
		}
		s.Read++
		st, _ := dp.Router.Codec.Decode(d.Headers, d.Timestamp, now, nil)
		origin := dp.Router.WaitingOrigin(d, st)
		w := by[origin]
		if w == nil {
			w = &originWaiting{Origin: origin}
			by[origin] = w
		}
		w.add(st.DueAt, now)
	}
}

// add counts one copy due at due (zero: unknown) as of now.
func (w *originWaiting) add(due, now time.Time) {
	w.Count++
	if due.IsZero() {
		w.NoDueTime++
		return
	}
	if w.Earliest.IsZero() || due.Before(w.Earliest) {
		w.Earliest = due
	}
	if due.After(w.Latest) {
		w.Latest = due
	}
	in := due.Sub(now)
	for i, window := range dueWindows {
		if in <= window || i == len(dueWindows)-1 {
			w.Due[i]++
			return
		}
	}
}
