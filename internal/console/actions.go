package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/delayed"
	"github.com/rebound-mq/rebound/internal/parking"
	"github.com/rebound-mq/rebound/policy"
)

// An action is previewed (GET: what it would do, counted by a dry run of
// the same code), confirmed (POST with the CSRF token) and then runs as a
// job in the background while its page, reloading itself, shows how far
// it has come. Its moves are packages parking's and delayed's, as the
// commands': a message leaves its queue only once the broker confirmed
// where it went.

// groupAsk is what a person asks of a group: replay (to its origin, or
// redirected with To), or purge.
type groupAsk struct {
	Action     string // replay or purge
	Group      string
	To         string
	Rate       float64
	Canary     int
	CanaryWait time.Duration
	// Seen and AsOf fix what a confirmed action acts on: the messages its
	// preview counted (Seen matched the group), parked before the preview
	// (AsOf). A message parked into the group afterwards is not touched.
	Seen int
	AsOf time.Time
}

// parseGroupAsk reads an ask from r's query or form. A canary is watched
// by default as long as the CLI's (config.CanaryWait): the time the
// longest of the deployment's policies takes to park a message that fails
// every time, plus a minute; a shorter watch cannot see a canary fail.
func (s *Server) parseGroupAsk(r *http.Request) (groupAsk, error) {
	defaultWait, _ := config.CanaryWait(s.opt.Router.Policies, nil)
	a := groupAsk{Action: r.PathValue("action"), Group: r.PathValue("id"), To: r.FormValue("to"), CanaryWait: defaultWait}
	if a.Action != "replay" && a.Action != "purge" {
		return a, fmt.Errorf("unknown action %q: replay or purge", a.Action)
	}
	if v := r.FormValue("rate"); v != "" {
		rate, err := strconv.ParseFloat(v, 64)
		if err != nil || rate < 0 || rate > 1e6 {
			return a, fmt.Errorf("rate %q: want messages a second, 0 (no limit) or more", v)
		}
		a.Rate = rate
	}
	if r.Method == http.MethodPost {
		// The confirm form carries what its preview counted; an action
		// without it would act on whatever the group holds by then.
		seen, err := strconv.Atoi(r.FormValue("seen"))
		if err != nil || seen <= 0 {
			return a, fmt.Errorf("seen %q: want the count of the preview this confirms (confirm from the preview page)", r.FormValue("seen"))
		}
		asOf, err := time.Parse(time.RFC3339Nano, r.FormValue("as_of"))
		if err != nil {
			return a, fmt.Errorf("as_of %q: want the time of the preview this confirms (confirm from the preview page)", r.FormValue("as_of"))
		}
		a.Seen, a.AsOf = seen, asOf
	}
	if v := r.FormValue("canary"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 0 {
			return a, fmt.Errorf("canary %q: want 0 (none) or more messages", v)
		}
		a.Canary = k
	}
	if v := r.FormValue("canary_wait"); v != "" {
		d, err := time.ParseDuration(v)
		if limit := max(24*time.Hour, defaultWait); err != nil || d <= 0 || d > limit {
			return a, fmt.Errorf("canary wait %q: want a duration above 0 and at most %s, such as 30s (default: %s)", v, policy.FormatDuration(limit), policy.FormatDuration(defaultWait))
		}
		a.CanaryWait = d
	}
	return a, nil
}

// query is the ask as a form's values, for the confirm form.
func (a groupAsk) query() url.Values {
	v := url.Values{}
	if a.To != "" {
		v.Set("to", a.To)
	}
	if a.Rate > 0 {
		v.Set("rate", strconv.FormatFloat(a.Rate, 'g', -1, 64))
	}
	if a.Canary > 0 {
		v.Set("canary", strconv.Itoa(a.Canary))
		v.Set("canary_wait", a.CanaryWait.String())
	}
	return v
}

// describe says what the ask does, for the log and the pages.
func (a groupAsk) describe() string {
	switch {
	case a.Action == "purge":
		return "purge group " + a.Group
	case a.To != "":
		return "replay group " + a.Group + " to " + a.To
	}
	return "replay group " + a.Group + " to its origin"
}

// previewView is an action's preview page: what it would do, and the form
// that confirms it.
type previewView struct {
	What    string
	Count   int      // what it would act on
	Lines   []string // more of what the dry run found
	Action  string   // where the confirm form posts
	Fields  url.Values
	Back    string
	Nothing bool // nothing to do: no confirm button
}

// asked serves h what a person asks of an action (parse reads it from
// the query or the form), refusing an ask that does not parse (400).
func asked[A any](s *Server, parse func(*http.Request) (A, error), h func(http.ResponseWriter, *http.Request, *session, A)) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, sess *session) {
		a, err := parse(r)
		if err != nil {
			s.fail(w, r, sess, http.StatusBadRequest, "Bad request", err)
			return
		}
		h(w, r, sess, a)
	}
}

// preview renders the preview of what, which dry counts in the turn t of
// queue; nav is the section of the page.
func (s *Server) preview(w http.ResponseWriter, r *http.Request, sess *session, t *turn, queue, what, nav string, dry func(context.Context) (previewView, error)) {
	release, err := s.takeTurn(r.Context(), t, queue, sess.user+" (previewing "+what+")")
	if err != nil {
		s.fail(w, r, sess, brokerStatus(err), "Preview", err)
		return
	}
	defer release()
	v, err := dry(r.Context())
	if err != nil {
		s.fail(w, r, sess, brokerStatus(err), "Preview", err)
		return
	}
	v.What, v.Action, v.Nothing = what, r.URL.Path, v.Count == 0
	s.render(w, http.StatusOK, "preview", "Confirm: "+what, nav, sess, v)
}

func (s *Server) groupPreview(w http.ResponseWriter, r *http.Request, sess *session, a groupAsk) {
	s.preview(w, r, sess, s.parked, s.opt.Router.Topology.ParkingQueue, a.describe(), "groups", func(ctx context.Context) (previewView, error) {
		return s.dryGroupAction(ctx, sess, a)
	})
}

// filter is what a confirmed ask acts on: the group's messages parked
// before its preview, at most as many as the preview matched.
func (a groupAsk) filter() parking.Filter {
	return parking.Filter{Group: a.Group, ParkedBefore: a.AsOf, Limit: a.Seen}
}

// dryGroupAction counts what a group's replay or purge would do, and puts
// what it counted in the confirm form, which fixes the action to it.
func (s *Server) dryGroupAction(ctx context.Context, sess *session, a groupAsk) (previewView, error) {
	q, err := s.parkingQueue(ctx, sess)
	if err != nil {
		return previewView{}, err
	}
	v := previewView{Fields: a.query(), Back: "/groups/" + url.PathEscape(a.Group)}
	now := s.now()
	f := parking.Filter{Group: a.Group}
	var seen int
	if a.Action == "purge" {
		l, err := q.List(ctx, f, now)
		if err != nil {
			return v, brokerError("read "+q.Name(), err)
		}
		v.Count, seen = l.Matched, l.Matched
		v.Lines = append(v.Lines, fmt.Sprintf("%d messages of this group would be deleted for good (%d parked read).", l.Matched, l.Scanned))
	} else {
		res, err := q.ReplayWith(ctx, f, now, parking.ReplayOptions{DryRun: true, To: a.To})
		if err != nil {
			return v, brokerError("read "+q.Name(), err)
		}
		v.Count, seen = res.Replayed, res.Matched
		v.Lines = append(v.Lines, fmt.Sprintf("%d of %d matching messages would be replayed (%d parked read); %d would stay parked.", res.Replayed, res.Matched, res.Scanned, len(res.Kept)))
		v.Lines = append(v.Lines, keptLines(res.Kept)...)
		if a.Rate > 0 {
			v.Lines = append(v.Lines, fmt.Sprintf("At most %g messages a second.", a.Rate))
		}
		if a.Canary > 0 {
			v.Lines = append(v.Lines, fmt.Sprintf("%d first, then the rest only if none of them comes back parked within %s.", a.Canary, a.CanaryWait))
		}
	}
	v.Fields.Set("seen", strconv.Itoa(seen))
	v.Fields.Set("as_of", now.UTC().Format(time.RFC3339Nano))
	return v, nil
}

// fewerLine says so when an action found fewer of the messages its
// preview counted than it showed (another person or a replica's expiry
// took them meanwhile); what was parked after the preview is never
// counted in.
func fewerLine(found int, a groupAsk) []string {
	if found >= a.Seen {
		return nil
	}
	return []string{fmt.Sprintf("%d of the %d messages the preview matched were still parked; messages parked after the preview (%s) were not touched",
		found, a.Seen, a.AsOf.Format(time.RFC3339))}
}

// keptLines counts the messages a replay left (or would leave) parked, by
// why.
func keptLines(kept []parking.Kept) []string {
	return byWhy(kept, func(k parking.Kept) string { return k.Why }, "%d stay parked: %s")
}

// keptCopyLines counts the copies a move left where they were, by why.
func keptCopyLines(kept []delayed.Kept) []string {
	return byWhy(kept, func(k delayed.Kept) string { return k.Why }, "%d stay where they were: %s")
}

// byWhy counts items by why, one line each (format takes the count and
// the why), in the order of the whys.
func byWhy[T any](items []T, why func(T) string, format string) []string {
	by := map[string]int{}
	for _, item := range items {
		by[why(item)]++
	}
	var out []string
	for _, w := range slices.Sorted(maps.Keys(by)) {
		out = append(out, fmt.Sprintf(format, by[w], w))
	}
	return out
}

// takeTurn takes t for holder, waiting up to TurnWait.
func (s *Server) takeTurn(ctx context.Context, t *turn, queue, holder string) (func(), error) {
	wait, cancel := context.WithTimeout(ctx, s.opt.TurnWait)
	defer cancel()
	release, err := t.take(wait, holder, s.now())
	if err != nil {
		h, since := t.busy()
		return nil, errors.Join(ctx.Err(), busyError{queue: queue, holder: h, since: since})
	}
	return release, nil
}

func (s *Server) groupAction(w http.ResponseWriter, r *http.Request, sess *session, a groupAsk) {
	s.startJob(w, r, sess, a.describe(), s.parked, "the parking queue's", func(ctx context.Context, j *job, log *zap.Logger) {
		s.runGroupAction(ctx, j, sess, a, log)
	}, zap.Float64("rate", a.Rate), zap.Int("canary", a.Canary))
}

// startJob runs an action as a job in the background, in the turn of the
// queues it reads (what names them for the page), logs its start, and
// sends the person to the job's page. run logs and finishes the job.
func (s *Server) startJob(w http.ResponseWriter, r *http.Request, sess *session, what string, t *turn, queues string,
	run func(ctx context.Context, j *job, log *zap.Logger), fields ...zap.Field) {
	j := s.jobs.start(sess.user, what, s.now())
	log := s.log.With(zap.String("user", sess.user), zap.String("addr", s.clientAddr(r)), zap.String("action", what))
	log.Info("console action started", fields...)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		j.setCancel(cancel)
		j.report("waiting for "+queues+" turn", 0)
		release, err := t.take(ctx, sess.user+" ("+what+")", s.now())
		if err != nil {
			j.finish(0, nil, err)
			return
		}
		defer release()
		defer s.forget("") // what every person read before is stale now
		run(ctx, j, log)
	}()
	http.Redirect(w, r, "/jobs/"+j.id, http.StatusSeeOther)
}

// runGroupAction runs a group's replay or purge as j.
func (s *Server) runGroupAction(ctx context.Context, j *job, sess *session, a groupAsk, log *zap.Logger) {
	q, err := s.parkingQueue(ctx, sess)
	if err != nil {
		j.finish(0, nil, err)
		return
	}
	f := a.filter()
	if a.Action == "purge" {
		j.report("deleting", 0)
		scanned, removed, err := q.Purge(ctx, f, s.now())
		log.Info("console action done", zap.Int("purged", removed), zap.Int("read", scanned), zap.Error(err))
		j.finish(removed, append([]string{fmt.Sprintf("purged %d messages (%d parked read)", removed, scanned)}, fewerLine(removed, a)...), err)
		return
	}
	if q.PubConn, err = sess.dialAgain(ctx, "publish"); err != nil {
		j.finish(0, nil, err)
		return
	}
	defer q.PubConn.Close()
	opt := parking.ReplayOptions{Rate: a.Rate, To: a.To, Progress: func(res parking.ReplayResult) {
		j.report(fmt.Sprintf("%d replayed so far, %d kept parked", res.Replayed, len(res.Kept)), res.Replayed)
	}}
	var res parking.ReplayResult
	var lines []string
	if a.Canary > 0 {
		var c parking.CanaryResult
		c, err = q.ReplayCanary(ctx, f, a.Canary, a.CanaryWait, time.Second, s.now, opt, func(c parking.ReplayResult) {
			j.report(fmt.Sprintf("canary: %d replayed; watching %s for %s", c.Replayed, q.Name(), a.CanaryWait), c.Replayed)
		})
		lines = append(lines, fmt.Sprintf("canary: %d replayed", c.Canaries.Replayed))
		if len(c.Back) > 0 {
			lines = append(lines, fmt.Sprintf("canary: %d of them came back parked within %s: the rest stay parked", len(c.Back), c.Watched.Round(time.Second)))
			err = errors.Join(err, fmt.Errorf("%d canaries came back parked: replay stopped", len(c.Back)))
		}
		res = c.Rest
		res.Replayed += c.Canaries.Replayed
		res.Kept = append(res.Kept, c.Canaries.Kept...)
	} else {
		res, err = q.ReplayWith(ctx, f, s.now(), opt)
	}
	lines = append(lines, fmt.Sprintf("replayed %d messages; %d stay parked", res.Replayed, len(res.Kept)))
	lines = append(lines, keptLines(res.Kept)...)
	if err == nil {
		lines = append(lines, fewerLine(res.Replayed+len(res.Kept), a)...)
	}
	log.Info("console action done", zap.Int("replayed", res.Replayed), zap.Int("kept", len(res.Kept)), zap.Error(err))
	j.finish(res.Replayed, lines, err)
}

// delayedAsk is a flush or cancel of the copies of the origin queues a
// regular expression matches.
type delayedAsk struct {
	Op     delayed.Op
	Name   string // flush or cancel
	Origin string
	re     *regexp.Regexp
}

func parseDelayedAsk(r *http.Request) (delayedAsk, error) {
	a := delayedAsk{Name: r.PathValue("action"), Origin: r.FormValue("origin")}
	switch a.Name {
	case "flush":
		a.Op = delayed.Flush
	case "cancel":
		a.Op = delayed.Cancel
	default:
		return a, fmt.Errorf("unknown action %q: flush or cancel", a.Name)
	}
	if a.Origin == "" {
		return a, errors.New("origin: a regular expression of the origin queues whose copies to move is required (^orders$ for one queue)")
	}
	re, err := regexp.Compile(a.Origin)
	if err != nil {
		return a, fmt.Errorf("origin %q: not a regular expression: %w", a.Origin, err)
	}
	a.re = re
	return a, nil
}

func (a delayedAsk) describe() string {
	if a.Op == delayed.Cancel {
		return "cancel (park) the delayed copies of origins matching " + a.Origin
	}
	return "flush the delayed copies of origins matching " + a.Origin + " back now"
}

// moveDelayed finds the delay queues and moves (or, dry, counts) as a
// says, in the delay queues' turn, reporting progress to progress.
func (s *Server) moveDelayed(ctx context.Context, sess *session, a delayedAsk, dry bool, progress func(delayed.Progress)) (delayed.Result, error) {
	dp, err := s.deployment(ctx, sess)
	if err != nil {
		return delayed.Result{}, err
	}
	queues, err := dp.Find(ctx, s.opt.Delays)
	if err != nil {
		return delayed.Result{}, brokerError("look for delay queues", err)
	}
	if !dry {
		if dp.PubConn, err = sess.dialAgain(ctx, "publish"); err != nil {
			return delayed.Result{}, err
		}
		defer dp.PubConn.Close()
	}
	return dp.Move(ctx, queues, delayed.Options{Op: a.Op, Origins: a.re, DryRun: dry, Progress: progress}, s.now)
}

func (s *Server) delayedPreview(w http.ResponseWriter, r *http.Request, sess *session, a delayedAsk) {
	s.preview(w, r, sess, s.delays, "the delay queues", a.describe(), "delayed", func(ctx context.Context) (previewView, error) {
		res, err := s.moveDelayed(ctx, sess, a, true, nil)
		if err != nil {
			return previewView{}, err
		}
		v := previewView{Fields: url.Values{"origin": {a.Origin}}, Back: "/delayed", Count: res.Matched - len(res.Kept)}
		v.Lines = append(v.Lines, fmt.Sprintf("%d of %d matching copies would move; %d other copies would go back into a delay queue for the time they still had to wait; %d read in %d delay queues.",
			v.Count, res.Matched, res.Redelayed, res.Read, res.Queues))
		for _, why := range slices.Sorted(maps.Keys(res.Left)) {
			v.Lines = append(v.Lines, fmt.Sprintf("%d left in place: %s", res.Left[why], why))
		}
		v.Lines = append(v.Lines, keptCopyLines(res.Kept)...)
		return v, nil
	})
}

func (s *Server) delayedAction(w http.ResponseWriter, r *http.Request, sess *session, a delayedAsk) {
	s.startJob(w, r, sess, a.describe(), s.delays, "the delay queues'", func(ctx context.Context, j *job, log *zap.Logger) {
		res, err := s.moveDelayed(ctx, sess, a, false, func(p delayed.Progress) {
			j.report(fmt.Sprintf("%d of %d copies read", p.Read, p.Total), 0)
		})
		moved := res.Sent + res.Parked
		lines := []string{fmt.Sprintf("%d of %d matching copies moved; %d other copies put back for the time they still had to wait; %d read in %d delay queues",
			moved, res.Matched, res.Redelayed, res.Read, res.Queues)}
		lines = append(lines, keptCopyLines(res.Kept)...)
		log.Info("console action done", zap.Int("moved", moved), zap.Int("redelayed", res.Redelayed), zap.Int("kept", len(res.Kept)), zap.Error(err))
		j.finish(moved, lines, err)
	})
}

// job is one action running, or run, in the background.
type job struct {
	id, user, what string
	started        time.Time

	mu       sync.Mutex
	progress string
	count    int
	done     bool
	lines    []string
	err      error
	ended    time.Time
	cancel   context.CancelFunc
}

func (j *job) setCancel(c context.CancelFunc) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cancel = c
}

func (j *job) report(progress string, count int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.progress, j.count = progress, count
}

func (j *job) finish(count int, lines []string, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.done, j.count, j.lines, j.err, j.ended = true, count, lines, err, time.Now()
}

// jobView is the job page's data.
type jobView struct {
	ID, What, Progress string
	Count              int
	Done               bool
	Lines              []string
	Error              string
	Started            time.Time
	Took               time.Duration
}

func (j *job) view(now time.Time) jobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := jobView{ID: j.id, What: j.what, Progress: j.progress, Count: j.count, Done: j.done, Lines: j.lines, Started: j.started, Took: now.Sub(j.started)}
	if j.done {
		v.Took = j.ended.Sub(j.started)
	}
	if j.err != nil {
		v.Error = j.err.Error()
	}
	return v
}

// jobs holds the jobs, by id: those of the last day. Safe for concurrent
// use.
type jobs struct {
	mu   sync.Mutex
	byID map[string]*job
}

func (js *jobs) start(user, what string, now time.Time) *job {
	id, err := randomID()
	if err != nil {
		id = strconv.FormatInt(now.UnixNano(), 36)
	}
	j := &job{id: id[:16], user: user, what: what, started: now}
	js.mu.Lock()
	defer js.mu.Unlock()
	for k, old := range js.byID {
		old.mu.Lock()
		if old.done && now.Sub(old.ended) > 24*time.Hour {
			delete(js.byID, k)
		}
		old.mu.Unlock()
	}
	js.byID[j.id] = j
	return j
}

// get returns job id if user started it: a person sees only their own
// jobs.
func (js *jobs) get(id, user string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	if j := js.byID[id]; j != nil && j.user == user {
		return j
	}
	return nil
}

func (s *Server) jobPage(w http.ResponseWriter, r *http.Request, sess *session) {
	j := s.jobs.get(r.PathValue("id"), sess.user)
	if j == nil {
		s.fail(w, r, sess, http.StatusNotFound, "No such action", errors.New("no action of yours has this id"))
		return
	}
	v := j.view(s.now())
	s.render(w, http.StatusOK, "job", v.What, "", sess, v)
}

// stopJob interrupts a running action: what it sent is settled, nothing
// is lost, the rest stays where it was.
func (s *Server) stopJob(w http.ResponseWriter, r *http.Request, sess *session) {
	j := s.jobs.get(r.PathValue("id"), sess.user)
	if j == nil {
		s.fail(w, r, sess, http.StatusNotFound, "No such action", errors.New("no action of yours has this id"))
		return
	}
	j.mu.Lock()
	cancel := j.cancel
	j.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	s.log.Info("console action stopped", zap.String("user", sess.user), zap.String("addr", s.clientAddr(r)), zap.String("action", j.what))
	http.Redirect(w, r, "/jobs/"+j.id, http.StatusSeeOther)
}
