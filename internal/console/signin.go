package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
)

// signInForm is the sign-in page's data.
type signInForm struct {
	User    string
	Problem string
	CSRF    string // the form's token (signInToken)
}

func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	if sess := s.sessions.get(r, s.now()); sess != nil {
		http.Redirect(w, r, "/groups", http.StatusSeeOther)
		return
	}
	s.renderSignIn(w, r, http.StatusOK, signInForm{})
}

// The sign-in form carries a CSRF token too (login CSRF): without one,
// another site could post its own user and password to the console and
// sign a person's browser in as that user, whose pages and actions the
// person would then take for their own. Before there is a session, the
// token is tied to a random nonce in a cookie of its own (HttpOnly,
// SameSite=Strict, like the session's, so another site's form does not
// carry it): the token is an HMAC of the nonce under a key the console
// draws at start, so a token is good only with its cookie, and only on
// this console.

// signInCookie holds the sign-in form's nonce.
const signInCookie = "rebound_signin"

// renderSignIn renders the sign-in page with status, giving the browser a
// nonce cookie if it has none and the form the token that goes with it.
func (s *Server) renderSignIn(w http.ResponseWriter, r *http.Request, status int, form signInForm) {
	nonce := ""
	if c, err := r.Cookie(signInCookie); err == nil && len(c.Value) >= 40 && len(c.Value) <= 64 {
		nonce = c.Value
	} else {
		var err error
		if nonce, err = randomID(); err != nil {
			s.fail(w, r, nil, http.StatusInternalServerError, "Sign in", err)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: signInCookie, Value: nonce, Path: "/signin", HttpOnly: true, Secure: s.opt.Secure, SameSite: http.SameSiteStrictMode})
	}
	form.CSRF = s.signInToken(nonce)
	s.render(w, status, "signin", "Sign in", "", nil, form)
}

// signInToken is the sign-in form's CSRF token for nonce.
func (s *Server) signInToken(nonce string) string {
	mac := hmac.New(sha256.New, s.signInKey)
	mac.Write([]byte("rebound console sign-in\x00" + nonce))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// validSignInCSRF reports whether r carries a sign-in cookie and the form
// token that goes with it.
func (s *Server) validSignInCSRF(r *http.Request) bool {
	c, err := r.Cookie(signInCookie)
	got := r.PostFormValue("csrf")
	return err == nil && c.Value != "" && got != "" && hmac.Equal([]byte(got), []byte(s.signInToken(c.Value)))
}

// maxCredential bounds a user name or password: RabbitMQ's own are far
// shorter, and the console dials with whatever it is given.
const maxCredential = 1024

// signIn checks a user and password by opening a connection as that user:
// the broker is the only judge. Failures are throttled per user from one
// client address (SignInLimit), per address (4×) and per user from
// anywhere (10×: so that one address cannot lock a named user out, while
// guesses spread over many addresses stay bounded), and logged with user
// and address, never with the password. A broker that cannot be reached is
// no verdict and counts against no one.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	user, password := r.PostFormValue("user"), r.PostFormValue("password")
	addr := s.clientAddr(r)
	now := s.now()
	log := s.log.With(zap.String("user", user), zap.String("addr", addr))
	if !s.validSignInCSRF(r) {
		log.Warn("console sign-in refused: bad CSRF token")
		s.renderSignIn(w, r, http.StatusForbidden, signInForm{User: user,
			Problem: "This form is stale or did not come from the console (CSRF token missing or wrong): sign in again."})
		return
	}
	if user == "" || password == "" || len(user) > maxCredential || len(password) > maxCredential {
		s.renderSignIn(w, r, http.StatusBadRequest, signInForm{User: user, Problem: "Enter a RabbitMQ user name and its password."})
		return
	}
	// A success forgets the user's failures, never the address's: one
	// valid account must not reset the count of guesses at others.
	places := attempt{{t: s.byUserAt, key: "user:" + user + "\x00" + throttleKey(addr), forgetOnSuccess: true},
		{t: s.byAddr, key: throttleKey(addr)}, {t: s.byUser, key: "user:" + user, forgetOnSuccess: true}}
	if wait := places.begin(now); wait > 0 {
		log.Warn("console sign-in refused: throttled", zap.Duration("wait", wait))
		w.Header().Set("Retry-After", retryAfter(wait))
		s.renderSignIn(w, r, http.StatusTooManyRequests,
			signInForm{User: user, Problem: "Too many failed sign-ins for this user or from this address: try again in " + max(wait, time.Second).Round(time.Second).String() + "."})
		return
	}
	// Ended however the dial ends, a panic included: a pending attempt
	// left behind would hold its keys back for good.
	verdict := inconclusive
	defer func() { places.end(s.now(), verdict) }()
	conn, err := s.opt.Dial(r.Context(), "console "+user, user, password)
	if err != nil {
		var problem string
		var status int
		problem, status, verdict = "The broker did not accept this user and password.", http.StatusUnauthorized, wrongCredentials
		switch {
		case errors.Is(err, amqp.ErrVhost):
			problem, status = "This user may not use the deployment's virtual host.", http.StatusForbidden
		case !errors.Is(err, amqp.ErrCredentials) && !errors.Is(err, amqp.ErrSASL):
			// Not a verdict on the password: the broker could not be
			// reached. Counted, an outage would lock every user out.
			problem, status, verdict = "Could not sign in: "+err.Error(), http.StatusBadGateway, inconclusive
		}
		log.Warn("console sign-in failed", zap.Error(err))
		s.renderSignIn(w, r, status, signInForm{User: user, Problem: problem})
		return
	}
	verdict = signedIn
	sess, err := s.sessions.start(user, password, addr, conn, now, s.opt.Dial)
	if err != nil {
		conn.Close()
		s.fail(w, r, nil, http.StatusInternalServerError, "Sign-in failed", err)
		return
	}
	log.Info("console sign-in")
	http.SetCookie(w, &http.Cookie{Name: signInCookie, Path: "/signin", MaxAge: -1, HttpOnly: true, Secure: s.opt.Secure, SameSite: http.SameSiteStrictMode})
	setCookie(w, sess.id, s.opt.Secure)
	http.Redirect(w, r, "/groups", http.StatusSeeOther)
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request, sess *session) {
	s.sessions.remove(sess)
	s.forget(sess.user)
	s.log.Info("console sign-out", zap.String("user", sess.user), zap.String("addr", s.clientAddr(r)))
	setCookie(w, "", s.opt.Secure)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// retryAfter is a Retry-After header's value: whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
