package console

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"html/template"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rebound-mq/rebound/internal/parking"
)

// Reading a queue holds its messages unacknowledged until the read ends,
// and a second reader meanwhile sees only what the first has not taken:
// two people reading at once would each see part of the queue, one of
// them perhaps an empty one. So every read the console makes of a queue
// takes that queue's turn: reads run one after the other, each sees every
// message, and a person whose read waits behind a long action (a paced
// replay) is told who holds the turn and shown their last reading, never
// an empty queue.

// turn is one queue's turn to be read. Safe for concurrent use.
type turn struct {
	sem chan struct{} // holds one token while someone reads

	mu     sync.Mutex
	holder string // who reads now, and what: for the person who waits
	since  time.Time
}

func newTurn() *turn { return &turn{sem: make(chan struct{}, 1)} }

// take waits for the turn until ctx is done; holder says who takes it.
// release gives it back.
func (t *turn) take(ctx context.Context, holder string, now time.Time) (release func(), err error) {
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	t.mu.Lock()
	t.holder, t.since = holder, now
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		t.holder = ""
		t.mu.Unlock()
		<-t.sem
	}, nil
}

// busy says who holds the turn and since when; "" when no one does.
func (t *turn) busy() (holder string, since time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.holder, t.since
}

// busyError is a read that waited too long for its turn.
type busyError struct {
	queue, holder string
	since         time.Time
}

func (e busyError) Error() string {
	return fmt.Sprintf("%s is being read by %s (since %s): try again in a moment", e.queue, e.holder, e.since.UTC().Format(time.TimeOnly))
}

// groupRow is one failure group on the groups page.
type groupRow struct {
	ID           string
	Count        int
	Origin       string // the origin most of its messages have; "" when unknown
	OtherOrigins int
	Reason       string // likewise the parked reason
	OtherReasons int
	Policy       string
	Error        string    // a sample of the error reported with the failure; "" when none
	First, Last  time.Time // earliest and latest parked; zero when unknown
	// Hours counts its messages parked in each of the last sparkHours
	// hours, oldest first.
	Hours []int
}

// Spark is the group's sparkline.
func (g groupRow) Spark() template.HTML { return sparkline(g.Hours) }

// sparkHours is how many hours the sparkline covers.
const sparkHours = 24

// keepPerGroup is how many messages of one group a reading keeps for the
// group and message pages; the group's counts cover all of them.
const keepPerGroup = 500

// reading is one read of the parking queue, summarised.
type reading struct {
	user    string
	at      time.Time
	took    time.Duration
	scanned int
	groups  []groupRow
	kept    map[string][]parking.Message // by group, at most keepPerGroup each
}

// group returns the row and the kept messages of group id.
func (r *reading) group(id string) (groupRow, []parking.Message, bool) {
	for _, g := range r.groups {
		if g.ID == id {
			return g, r.kept[id], true
		}
	}
	return groupRow{}, nil, false
}

// summary gathers parked messages into failure groups (the group the
// sidecar wrote, or computed alike: parking.Message.Group) as they are
// read, counting parks per hour over the sparkHours hours before now and
// keeping at most keepPerGroup messages of each group: its memory grows
// with what it keeps, not with the queue.
type summary struct {
	now  time.Time
	by   map[string]*groupAcc
	kept map[string][]parking.Message
}

type groupAcc struct {
	row                        groupRow
	origins, reasons, policies map[string]int
}

func newSummary(now time.Time) *summary {
	return &summary{now: now, by: map[string]*groupAcc{}, kept: map[string][]parking.Message{}}
}

// add counts m.
func (s *summary) add(m parking.Message) {
	a := s.by[m.Group]
	if a == nil {
		a = &groupAcc{row: groupRow{ID: m.Group, Hours: make([]int, sparkHours)},
			origins: map[string]int{}, reasons: map[string]int{}, policies: map[string]int{}}
		s.by[m.Group] = a
	}
	g := &a.row
	g.Count++
	a.origins[m.Origin]++
	a.reasons[m.Reason]++
	a.policies[m.Policy]++
	if g.Error == "" {
		g.Error = cmp.Or(m.Reported, m.Error)
	}
	if at := m.ParkedAt; !at.IsZero() {
		if g.First.IsZero() || at.Before(g.First) {
			g.First = at
		}
		if at.After(g.Last) {
			g.Last = at
		}
		if h := int(s.now.Sub(at) / time.Hour); h >= 0 && h < sparkHours {
			g.Hours[sparkHours-1-h]++
		}
	}
	if len(s.kept[m.Group]) < keepPerGroup {
		s.kept[m.Group] = append(s.kept[m.Group], m)
	}
}

// groups returns the groups, largest first, and the messages kept of
// each.
func (s *summary) groups() ([]groupRow, map[string][]parking.Message) {
	rows := make([]groupRow, 0, len(s.by))
	for _, a := range s.by {
		g := a.row
		g.Origin, g.OtherOrigins = parking.Most(a.origins)
		g.Reason, g.OtherReasons = parking.Most(a.reasons)
		g.Policy, _ = parking.Most(a.policies)
		rows = append(rows, g)
	}
	slices.SortFunc(rows, func(a, b groupRow) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.ID, b.ID)) })
	return rows, s.kept
}

// messageKey names one parked message in a URL: message ids are the
// producer's, may be missing or shared, so the key also hashes when it
// was parked and its body.
func messageKey(m parking.Message) string {
	h := sha256.New()
	h.Write([]byte(m.ID()))
	h.Write([]byte{0})
	h.Write([]byte(m.ParkedAt.UTC().Format(time.RFC3339Nano)))
	h.Write([]byte{0})
	h.Write(m.Delivery.Body)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// sparkline draws counts as an inline SVG bar chart, one bar a count,
// scaled to the largest; it holds numbers only, so it is safe HTML.
func sparkline(counts []int) template.HTML {
	const w, h, bar = 96, 20, 4
	top := slices.Max(append([]int{1}, counts...))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="parks per hour, last %d hours">`,
		w, h, w, h, len(counts))
	for i, n := range counts {
		if n == 0 {
			continue
		}
		bh := max(1, n*h/top)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d"><title>%d</title></rect>`, i*bar, h-bh, bar-1, bh, n)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
