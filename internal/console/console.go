// Package console is `rebound console`: a web console for failures. It
// shows the parking queue's failure groups, a group's messages, one
// message in full and the copies waiting in the delay queues, and
// replays, redirects and purges a group and flushes or cancels waiting
// copies, each previewed with its count, confirmed, and followed while it
// runs. Every move goes through packages parking and delayed, as the
// command line's do.
//
// Nobody gets in where the broker would not let them: a person signs in
// with a RabbitMQ user and password, and every connection the console
// opens for them is opened as that user, so the broker's permissions
// decide what each can read or move. The console keeps no user store;
// the password lives in memory for the session's life only (idle
// timeout, sign-out) and is never written to a cookie, a log or a disk.
// Session cookies are random ids (HttpOnly, SameSite=Strict, Secure over
// TLS), every action carries the session's CSRF token, every value shown
// is escaped by html/template, sign-in is throttled per user and per
// client address, and every sign-in and action is logged: who, what, how
// many.
//
// Pages are rendered on the server; the only script-like behaviour is a
// page reloading itself while an action runs. A Server is safe for
// concurrent use; Close ends its actions and sessions.
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/netip"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/internal/route"
)

//go:embed templates/*.html static/console.css
var assets embed.FS

// Options configure a Server.
type Options struct {
	// Router holds the deployment's topology, policies and header names,
	// as the sidecar's configuration gives them.
	Router route.Router
	// Dial opens a connection as user with password; role names it on
	// the broker. It is the only way the console reaches the broker.
	Dial func(ctx context.Context, role, user, password string) (*amqp.Connection, error)
	// Delays are the delays whose queues the delayed page looks for
	// (delayed.Delays of the configuration).
	Delays []time.Duration
	// ConfirmTimeout bounds the wait for a moved copy's confirm.
	ConfirmTimeout time.Duration
	// Secure says the console is served over TLS: its cookie is Secure.
	Secure bool
	Logger *zap.Logger
	Now    func() time.Time // nil: time.Now

	// IdleTimeout ends a session unused this long; 0 means 15 minutes.
	IdleTimeout time.Duration
	// ShareReading is how long one person's reading of a queue serves
	// their next pages; 0 means 5 seconds.
	ShareReading time.Duration
	// TurnWait is how long a page waits for its turn to read a queue
	// before it says who is reading it; 0 means 15 seconds.
	TurnWait time.Duration
	// SignInLimit failed sign-ins within SignInWindow hold back further
	// tries of that user from that client address, 4 times as many those
	// of that address, 10 times as many those of that user from anywhere;
	// 0 means 5 and 15 minutes.
	SignInLimit  int
	SignInWindow time.Duration
	// TrustedProxies are the reverse proxies whose X-Forwarded-For the
	// console believes (see clientAddr); none by default, when the client
	// address is the connection's peer.
	TrustedProxies []netip.Prefix
}

// Server is the console.
type Server struct {
	opt      Options
	log      *zap.Logger
	pages    map[string]*template.Template
	sessions *sessions
	byUserAt *throttle // failed sign-ins by user name and client address
	byAddr   *throttle // failed sign-ins by client address
	byUser   *throttle // failed sign-ins by user name, from anywhere
	parked   *turn     // reads of the parking queue
	delays   *turn     // reads of the delay queues
	jobs     *jobs
	// signInKey signs the sign-in form's CSRF tokens (see signInToken).
	signInKey []byte

	mu       sync.Mutex
	readings map[string]*reading // the last reading of the parking queue, by user
	surveys  map[string]*survey  // the last reading of the delay queues, by user

	ctx    context.Context // ends the actions and the sweeper
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a Server and starts its sweeper, which ends idle sessions;
// Close stops it.
func New(opt Options) (*Server, error) {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = 15 * time.Minute
	}
	if opt.ShareReading <= 0 {
		opt.ShareReading = 5 * time.Second
	}
	if opt.TurnWait <= 0 {
		opt.TurnWait = 15 * time.Second
	}
	if opt.SignInLimit <= 0 {
		opt.SignInLimit = 5
	}
	if opt.SignInWindow <= 0 {
		opt.SignInWindow = 15 * time.Minute
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	signInKey := make([]byte, 32)
	if _, err := rand.Read(signInKey); err != nil {
		return nil, fmt.Errorf("read random bytes: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opt: opt, log: opt.Logger, pages: pages,
		sessions: &sessions{idle: opt.IdleTimeout, byID: map[string]*session{}},
		byUserAt: newThrottle(opt.SignInLimit, opt.SignInWindow),
		byAddr:   newThrottle(4*opt.SignInLimit, opt.SignInWindow),
		byUser:   newThrottle(10*opt.SignInLimit, opt.SignInWindow),
		parked:   newTurn(), delays: newTurn(),
		jobs:      &jobs{byID: map[string]*job{}},
		signInKey: signInKey,
		readings:  map[string]*reading{}, surveys: map[string]*survey{},
		ctx: ctx, cancel: cancel,
	}
	s.sessions.lastEnded = s.forget
	s.wg.Add(1)
	go s.sweep()
	return s, nil
}

// sweep ends idle sessions every minute (and a tenth of the idle
// timeout, if shorter) until Close.
func (s *Server) sweep() {
	defer s.wg.Done()
	t := time.NewTicker(min(time.Minute, max(s.opt.IdleTimeout/10, 10*time.Millisecond)))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			for _, ended := range s.sessions.sweep(s.opt.Now()) {
				s.log.Info("console session ended: idle", zap.String("user", ended.user), zap.String("addr", ended.addr))
			}
		}
	}
}

// Close interrupts the running actions (each settles what it sent, as the
// commands do when interrupted), waits for them and ends every session.
func (s *Server) Close() {
	s.cancel()
	s.wg.Wait()
	s.sessions.endAll()
}

// Handler serves the console.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /static/console.css", s.css)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /signin", s.signInPage)
	mux.HandleFunc("POST /signin", s.signIn)
	mux.HandleFunc("POST /signout", s.signedIn(s.signOut))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/groups", http.StatusSeeOther) })
	mux.HandleFunc("GET /groups", s.signedIn(s.groupsPage))
	mux.HandleFunc("GET /groups/{id}", s.signedIn(s.groupPage))
	mux.HandleFunc("GET /groups/{id}/messages/{key}", s.signedIn(s.messagePage))
	mux.HandleFunc("GET /groups/{id}/{action}", s.signedIn(asked(s, s.parseGroupAsk, s.groupPreview)))
	mux.HandleFunc("POST /groups/{id}/{action}", s.signedIn(asked(s, s.parseGroupAsk, s.groupAction)))
	mux.HandleFunc("GET /delayed", s.signedIn(s.delayedPage))
	mux.HandleFunc("GET /delayed/{action}", s.signedIn(asked(s, parseDelayedAsk, s.delayedPreview)))
	mux.HandleFunc("POST /delayed/{action}", s.signedIn(asked(s, parseDelayedAsk, s.delayedAction)))
	mux.HandleFunc("GET /jobs/{id}", s.signedIn(s.jobPage))
	mux.HandleFunc("POST /jobs/{id}/stop", s.signedIn(s.stopJob))
	return secureHeaders(mux)
}

// secureHeaders sets the headers every page carries: no script at all,
// no framing, nothing cached, no referrer.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func (s *Server) css(w http.ResponseWriter, r *http.Request) {
	b, _ := assets.ReadFile("static/console.css")
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=3600")
	_, _ = w.Write(b)
}

// signedIn serves h to a person signed in, and refuses anyone else: a
// page sends them to sign in, an action is forbidden. Every action must
// carry the session's CSRF token.
func (s *Server) signedIn(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess := s.sessions.get(r, s.opt.Now())
		if sess == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/signin", http.StatusSeeOther)
				return
			}
			s.fail(w, r, nil, http.StatusForbidden, "Not signed in", errors.New("sign in first: this action needs a session"))
			return
		}
		if r.Method != http.MethodGet && !sess.validCSRF(r) {
			s.log.Warn("console action refused: bad CSRF token", zap.String("user", sess.user), zap.String("addr", s.clientAddr(r)), zap.String("path", r.URL.Path))
			s.fail(w, r, sess, http.StatusForbidden, "Refused", errors.New("this form is stale or did not come from the console (CSRF token missing or wrong): open the page again"))
			return
		}
		h(w, r, sess)
	}
}

// now is the console's clock.
func (s *Server) now() time.Time { return s.opt.Now() }

// page is what every template gets.
type page struct {
	Title string
	User  string // "" when not signed in
	CSRF  string
	Nav   string // the section the page belongs to: groups, delayed
	Data  any
	// Refresh, above 0, reloads the page after that many seconds: a
	// running action's progress.
	Refresh int
}

// render writes template name with data for sess (nil when not signed
// in).
func (s *Server) render(w http.ResponseWriter, status int, name, title, nav string, sess *session, data any) {
	p := page{Title: title, Nav: nav, Data: data}
	if sess != nil {
		p.User, p.CSRF = sess.user, sess.csrf
	}
	if j, ok := data.(jobView); ok && !j.Done {
		p.Refresh = 1
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.pages[name].ExecuteTemplate(w, "layout", p); err != nil {
		s.log.Error("render console page", zap.String("page", name), zap.Error(err))
	}
}

// failure is the error page's data.
type failure struct {
	Message string
	Busy    bool // a queue is being read: the page reloads
}

// fail renders an error page with status; err's text is shown (escaped).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, sess *session, status int, title string, err error) {
	f := failure{Message: err.Error()}
	var busy busyError
	if errors.As(err, &busy) {
		f.Busy = true
	}
	s.render(w, status, "error", title, "", sess, f)
}

// brokerStatus maps an error of a broker operation to an HTTP status: the
// broker refusing the person is 403, a queue that does not exist 404, a
// busy queue 503, anything else 502.
func brokerStatus(err error) int {
	var aerr *amqp.Error
	var busy busyError
	switch {
	case errors.As(err, &busy):
		return http.StatusServiceUnavailable
	case errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused:
		return http.StatusForbidden
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		return http.StatusNotFound
	}
	return http.StatusBadGateway
}

// brokerError describes an error of a broker operation for the person
// who ran it.
func brokerError(what string, err error) error {
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused {
		return refusedError{msg: fmt.Sprintf("%s: the broker refused your user (%s)", what, aerr.Reason), err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// refusedError is the broker refusing a person, said plainly.
type refusedError struct {
	msg string
	err error
}

func (e refusedError) Error() string { return e.msg }
func (e refusedError) Unwrap() error { return e.err }
