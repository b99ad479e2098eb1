package parking

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/rebound-mq/rebound/internal/group"
)

// GroupBy names what Groups gathers parked messages by.
type GroupBy string

// What Groups can gather by.
const (
	ByGroup  GroupBy = "group"  // the failure group (package group)
	byOrigin GroupBy = "origin" // the origin queue
	byReason GroupBy = "reason" // the parked reason
	byPolicy GroupBy = "policy" // the label of the policy that parked it
	byError  GroupBy = "error"  // the reported error, normalised
)

// GroupBys lists them, in the order `--group-by` documents.
var GroupBys = []GroupBy{ByGroup, byOrigin, byReason, byPolicy, byError}

// key returns what m is gathered under.
func (by GroupBy) key(m Message) string {
	switch by {
	case byOrigin:
		return m.Origin
	case byReason:
		return m.Reason
	case byPolicy:
		return m.Policy
	case byError:
		return group.Normalize(m.Reported)
	}
	return m.Group
}

// groupRow is one row of Groups: the parked messages that share a key.
type groupRow struct {
	Key   string // the group id, origin, reason, policy or normalised error; "" when unknown
	Count int
	// Origins, Reasons and Policies count the messages by each ("" when
	// unknown). A failure group has one origin; its reasons may differ
	// (max-retries and max-duration of one cause).
	Origins, Reasons, Policies map[string]int
	// Groups counts the failure groups among the messages.
	Groups map[string]int
	// Error is a sample: the first error read that was reported with the
	// failure that parked its message; "" when none was.
	Error string
	// First and Last are the earliest and latest parked times; zero when
	// no message says when it was parked.
	First, Last time.Time
}

// groupListing is what Groups found.
type groupListing struct {
	By      GroupBy
	Scanned int        // messages read from the queue
	Matched int        // messages read that matched the filter
	Groups  []groupRow // largest first, then by key
	// Limited says Groups stopped reading at the filter's limit; Unread
	// is how many of the messages the queue held it did not read (then, or
	// because another command held them).
	Limited bool
	Unread  int
}

// Groups reads the parking queue once, leaving every message in it, and
// gathers the messages f matches by by: the failure groups an operator
// replays or purges one at a time (Filter.Group selects one), or their
// origins, reasons, policies or errors. It keeps no message, so its memory
// grows with the groups, not the queue. The CLI's `rebound parked groups`
// and the console call it alike; a group's messages are List with
// Filter.Group.
func (q Queue) Groups(ctx context.Context, f Filter, by GroupBy, now time.Time) (groupListing, error) {
	l := groupListing{By: by}
	rows := map[string]*groupRow{}
	var err error
	l.Scanned, l.Matched, l.Unread, l.Limited, err = q.scan(ctx, f, now, func(m Message) {
		k := by.key(m)
		g := rows[k]
		if g == nil {
			g = &groupRow{Key: k, Origins: map[string]int{}, Reasons: map[string]int{}, Policies: map[string]int{}, Groups: map[string]int{}}
			rows[k] = g
		}
		g.add(m)
	})
	for _, g := range rows {
		l.Groups = append(l.Groups, *g)
	}
	slices.SortFunc(l.Groups, func(a, b groupRow) int {
		return cmp.Or(b.Count-a.Count, strings.Compare(a.Key, b.Key))
	})
	return l, err
}

func (g *groupRow) add(m Message) {
	g.Count++
	g.Origins[m.Origin]++
	g.Reasons[m.Reason]++
	g.Policies[m.Policy]++
	g.Groups[m.Group]++
	if g.Error == "" {
		g.Error = m.Reported
	}
	if at := m.ParkedAt; !at.IsZero() {
		if g.First.IsZero() || at.Before(g.First) {
			g.First = at
		}
		if at.After(g.Last) {
			g.Last = at
		}
	}
}

// Most returns the value counted most often in counts, the least such
// value on a tie, and how many other values there are.
func Most(counts map[string]int) (value string, others int) {
	best := -1
	for v, n := range counts {
		if n > best || (n == best && v < value) {
			value, best = v, n
		}
	}
	return value, max(len(counts)-1, 0)
}
