package console

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/delayed"
	"github.com/rebound-mq/rebound/internal/parking"
	"github.com/rebound-mq/rebound/policy"
)

// parkingQueue is the parking queue as sess reaches it: through their
// connection, as their user.
func (s *Server) parkingQueue(ctx context.Context, sess *session) (parking.Queue, error) {
	conn, err := sess.connection(ctx)
	if err != nil {
		return parking.Queue{}, err
	}
	return parking.Queue{Conn: conn, Router: s.opt.Router, ConfirmTimeout: s.opt.ConfirmTimeout}, nil
}

// readParked returns sess's reading of the parking queue: their last one
// if it is younger than ShareReading, else a new one taken in the queue's
// turn. A person whose turn does not come within TurnWait gets a
// busyError, and their last reading if they have one.
func (s *Server) readParked(ctx context.Context, sess *session) (*reading, error) {
	if r := s.lastReading(sess.user, s.opt.ShareReading); r != nil {
		return r, nil
	}
	wait, cancel := context.WithTimeout(ctx, s.opt.TurnWait)
	defer cancel()
	release, err := s.parked.take(wait, sess.user+" (reading)", s.now())
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		holder, since := s.parked.busy()
		return s.lastReading(sess.user, 0), busyError{queue: s.opt.Router.Topology.ParkingQueue, holder: holder, since: since}
	}
	defer release()
	// Someone of the same user may have read it while this one waited.
	if r := s.lastReading(sess.user, s.opt.ShareReading); r != nil {
		return r, nil
	}
	q, err := s.parkingQueue(ctx, sess)
	if err != nil {
		return nil, err
	}
	start := s.now()
	sum := newSummary(start)
	scanned, _, err := q.Visit(ctx, parking.Filter{}, start, sum.add)
	if err != nil {
		return nil, brokerError("read "+q.Name(), err)
	}
	r := &reading{user: sess.user, at: start, took: time.Since(start), scanned: scanned}
	r.groups, r.kept = sum.groups()
	s.keep(sess.user, func() { s.readings[sess.user] = r })
	return r, nil
}

// lastReading is user's last reading of the parking queue if it is
// younger than fresh (0: whatever its age), else nil.
func (s *Server) lastReading(user string, fresh time.Duration) *reading {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.readings[user]
	if r == nil || (fresh > 0 && s.now().Sub(r.at) >= fresh) {
		return nil
	}
	return r
}

// keep stores what store stores (a reading of user's) unless user's last
// session ended while it was being read: forget ran then, and the
// reading, parked bodies among it, must not outlive the sessions. The
// session check is made under s.mu, which forget takes after the last
// session is gone, so a reading either is stored before forget drops it
// or is not stored at all.
func (s *Server) keep(user string, store func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions.hasUser(user) {
		store()
	}
}

// forget drops every reading after an action changed the queues, and
// user's (all of them, at sign-out).
func (s *Server) forget(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if user == "" {
		s.readings = map[string]*reading{}
		s.surveys = map[string]*survey{}
		return
	}
	delete(s.readings, user)
	delete(s.surveys, user)
}

// groupsView is the groups page's data.
type groupsView struct {
	Queue   string
	Groups  []groupRow
	Scanned int
	At      time.Time
	Took    time.Duration
	Stale   string // why an older reading is shown; "" when it is fresh
}

// readingOrBusy reads the parking queue for a page: a busy queue with an
// earlier reading shows that reading, said to be stale.
func (s *Server) readingOrBusy(w http.ResponseWriter, r *http.Request, sess *session) (*reading, string, bool) {
	rd, err := s.readParked(r.Context(), sess)
	var busy busyError
	if errors.As(err, &busy) && rd != nil {
		return rd, busy.Error() + "; shown: your reading of " + rd.at.UTC().Format(time.TimeOnly), true
	}
	if err != nil {
		s.fail(w, r, sess, brokerStatus(err), "Parking queue", err)
		return nil, "", false
	}
	return rd, "", true
}

func (s *Server) groupsPage(w http.ResponseWriter, r *http.Request, sess *session) {
	rd, stale, ok := s.readingOrBusy(w, r, sess)
	if !ok {
		return
	}
	s.render(w, http.StatusOK, "groups", "Failure groups", "groups", sess, groupsView{
		Queue: s.opt.Router.Topology.ParkingQueue, Groups: rd.groups, Scanned: rd.scanned, At: rd.at, Took: rd.took, Stale: stale,
	})
}

// groupView is a group page's data.
type groupView struct {
	Group    groupRow
	Messages []messageRow
	Shown    int
	Stale    string
	Targets  bool // the form offers a redirect target
	// CanaryWait is how long a canary is watched unless the form says
	// otherwise (config.CanaryWait), as the CLI prints it.
	CanaryWait string
}

// messageRow is one message in a group's list.
type messageRow struct {
	Key     string
	ID      string
	Origin  string
	Reason  string
	Retries int
	Parked  time.Time
	Error   string
	Bytes   int
}

func rowOf(m parking.Message) messageRow {
	return messageRow{Key: messageKey(m), ID: m.ID(), Origin: m.Origin, Reason: m.Reason, Retries: m.Retries,
		Parked: m.ParkedAt, Error: m.Error, Bytes: len(m.Delivery.Body)}
}

func (s *Server) groupPage(w http.ResponseWriter, r *http.Request, sess *session) {
	rd, stale, ok := s.readingOrBusy(w, r, sess)
	if !ok {
		return
	}
	g, ms, found := rd.group(r.PathValue("id"))
	if !found {
		s.fail(w, r, sess, http.StatusNotFound, "No such group", errors.New("no parked message of this group (replayed or purged since?)"))
		return
	}
	wait, _ := config.CanaryWait(s.opt.Router.Policies, nil)
	v := groupView{Group: g, Shown: len(ms), Stale: stale, CanaryWait: policy.FormatDuration(wait)}
	for _, m := range ms {
		v.Messages = append(v.Messages, rowOf(m))
	}
	s.render(w, http.StatusOK, "group", "Group "+g.ID, "groups", sess, v)
}

func (s *Server) messagePage(w http.ResponseWriter, r *http.Request, sess *session) {
	rd, stale, ok := s.readingOrBusy(w, r, sess)
	if !ok {
		return
	}
	_, ms, _ := rd.group(r.PathValue("id"))
	for _, m := range ms {
		if messageKey(m) == r.PathValue("key") {
			v := s.messageView(m, s.now())
			v.Group, v.Stale = r.PathValue("id"), stale
			s.render(w, http.StatusOK, "message", "Message "+m.ID(), "groups", sess, v)
			return
		}
	}
	s.fail(w, r, sess, http.StatusNotFound, "No such message", errors.New("this message is no longer parked (replayed or purged since?)"))
}

// survey is one reading of the delay queues.
type survey struct {
	at     time.Time
	queues []delayed.Queue
	survey delayed.Survey
	looked int
}

// delayedView is the delayed page's data.
type delayedView struct {
	Queues  []delayed.Queue
	Survey  delayed.Survey
	Total   int
	Looked  int
	At      time.Time
	Windows []string
}

// dueWindowNames name delayed.DueWindows for the page.
var dueWindowNames = []string{"≤ 1 min", "≤ 10 min", "≤ 1 h", "≤ 1 day", "later"}

// deployment is the delay queues as sess reaches them.
func (s *Server) deployment(ctx context.Context, sess *session) (delayed.Deployment, error) {
	conn, err := sess.connection(ctx)
	if err != nil {
		return delayed.Deployment{}, err
	}
	router := s.opt.Router
	router.Topology = router.Topology.ForServer(conn.Properties)
	return delayed.Deployment{Conn: conn, Router: router, ConfirmTimeout: s.opt.ConfirmTimeout}, nil
}

// readDelayed finds the delay queues and reads what waits in them for
// sess, in the delay queues' turn, sharing their last reading as
// readParked does.
func (s *Server) readDelayed(ctx context.Context, sess *session) (*survey, error) {
	fresh := func() *survey {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sv := s.surveys[sess.user]; sv != nil && s.now().Sub(sv.at) < s.opt.ShareReading {
			return sv
		}
		return nil
	}
	if sv := fresh(); sv != nil {
		return sv, nil
	}
	wait, cancel := context.WithTimeout(ctx, s.opt.TurnWait)
	defer cancel()
	release, err := s.delays.take(wait, sess.user+" (reading)", s.now())
	if err != nil {
		holder, since := s.delays.busy()
		return nil, errors.Join(ctx.Err(), busyError{queue: "the delay queues", holder: holder, since: since})
	}
	defer release()
	if sv := fresh(); sv != nil {
		return sv, nil
	}
	dp, err := s.deployment(ctx, sess)
	if err != nil {
		return nil, err
	}
	now := s.now()
	queues, err := dp.Find(ctx, s.opt.Delays)
	if err != nil {
		return nil, brokerError("look for delay queues", err)
	}
	sv := &survey{at: now, queues: queues, looked: len(s.opt.Delays)}
	if sv.survey, err = dp.Survey(ctx, queues, now); err != nil {
		return nil, brokerError("read the delay queues", err)
	}
	s.keep(sess.user, func() { s.surveys[sess.user] = sv })
	return sv, nil
}

func (s *Server) delayedPage(w http.ResponseWriter, r *http.Request, sess *session) {
	sv, err := s.readDelayed(r.Context(), sess)
	if err != nil {
		s.fail(w, r, sess, brokerStatus(err), "Delayed copies", err)
		return
	}
	v := delayedView{Queues: sv.queues, Survey: sv.survey, Looked: sv.looked, At: sv.at, Windows: dueWindowNames}
	for _, q := range sv.queues {
		v.Total += q.Messages
	}
	s.render(w, http.StatusOK, "delayed", "Delayed copies", "delayed", sess, v)
}
