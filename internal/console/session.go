package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// cookieName is the session cookie: a random id, nothing else.
const cookieName = "rebound_console"

// session is one person signed in: their broker user and password, held
// in memory only and dropped when the session ends (sign-out, idle
// timeout, the console stopping), and the connection the console reads
// on for them, opened as them.
type session struct {
	id   string
	csrf string // the token every action of this session carries
	user string
	addr string // the client address it signed in from, for the log

	mu       sync.Mutex
	password string
	seen     time.Time
	conn     *amqp.Connection // opened as user; nil or closed: dial again
	dial     func(ctx context.Context, role, user, password string) (*amqp.Connection, error)
}

// connection returns the session's connection, opened as its user,
// dialling again if the broker closed it.
func (s *session) connection(ctx context.Context) (*amqp.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	if s.password == "" {
		return nil, errSignedOut
	}
	conn, err := s.dial(ctx, "console "+s.user, s.user, s.password)
	if err != nil {
		return nil, err
	}
	s.conn = conn
	return conn, nil
}

// dialAgain opens one more connection as the session's user, which the
// caller closes: an action publishes on a connection of its own.
func (s *session) dialAgain(ctx context.Context, role string) (*amqp.Connection, error) {
	s.mu.Lock()
	password := s.password
	s.mu.Unlock()
	if password == "" {
		return nil, errSignedOut
	}
	return s.dial(ctx, "console "+s.user+" "+role, s.user, password)
}

// end forgets the password and closes the connection.
func (s *session) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.password = ""
	if s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
}

var errSignedOut = errors.New("signed out")

// sessions holds the sessions, by id. Safe for concurrent use.
type sessions struct {
	idle time.Duration
	// lastEnded, when set, is called with a user none of whose sessions
	// is left, after one ended: what the console read for that user
	// (parking-queue bodies among it) must not outlive them.
	lastEnded func(user string)

	mu   sync.Mutex
	byID map[string]*session
}

// randomID returns 32 random bytes, base64url: a session id or a CSRF
// token no one can guess.
func randomID() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random bytes: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// start keeps a new session for user, whose password the broker just
// accepted with conn.
func (ss *sessions) start(user, password, addr string, conn *amqp.Connection, now time.Time,
	dial func(ctx context.Context, role, user, password string) (*amqp.Connection, error)) (*session, error) {
	id, err := randomID()
	if err != nil {
		return nil, err
	}
	csrf, err := randomID()
	if err != nil {
		return nil, err
	}
	s := &session{id: id, csrf: csrf, user: user, addr: addr, password: password, seen: now, conn: conn, dial: dial}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.byID[id] = s
	return s, nil
}

// get returns the live session of r's cookie, marking it seen now, or
// nil.
func (ss *sessions) get(r *http.Request, now time.Time) *session {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	ss.mu.Lock()
	s := ss.byID[c.Value]
	ss.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	expired := now.Sub(s.seen) >= ss.idle
	if !expired {
		s.seen = now
	}
	s.mu.Unlock()
	if expired {
		ss.remove(s)
		return nil
	}
	return s
}

// hasUser reports whether a session of user is live.
func (ss *sessions) hasUser(user string) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.byID {
		if s.user == user {
			return true
		}
	}
	return false
}

// remove ends s and forgets it.
func (ss *sessions) remove(s *session) {
	ss.mu.Lock()
	delete(ss.byID, s.id)
	ss.mu.Unlock()
	s.end()
	ss.ended(s.user)
}

// ended calls lastEnded for user if no session of user is left.
func (ss *sessions) ended(user string) {
	if ss.lastEnded == nil || ss.hasUser(user) {
		return
	}
	ss.lastEnded(user)
}

// sweep ends every session idle for the idle timeout as of now, so that a
// password is not kept for a person who walked away.
func (ss *sessions) sweep(now time.Time) (ended []*session) {
	ss.mu.Lock()
	for id, s := range ss.byID {
		s.mu.Lock()
		idle := now.Sub(s.seen) >= ss.idle
		s.mu.Unlock()
		if idle {
			delete(ss.byID, id)
			ended = append(ended, s)
		}
	}
	ss.mu.Unlock()
	for _, s := range ended {
		s.end()
		ss.ended(s.user)
	}
	return ended
}

// endAll ends every session.
func (ss *sessions) endAll() {
	ss.mu.Lock()
	all := ss.byID
	ss.byID = map[string]*session{}
	ss.mu.Unlock()
	for _, s := range all {
		s.end()
	}
}

// validCSRF reports whether r's form carries s's CSRF token.
func (s *session) validCSRF(r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// setCookie sets the session cookie of id; an empty id clears it.
func setCookie(w http.ResponseWriter, id string, secure bool) {
	c := &http.Cookie{Name: cookieName, Value: id, Path: "/", HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode}
	if id == "" {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}
