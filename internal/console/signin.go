package console

import (
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
}

func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	if sess := s.sessions.get(r, s.now()); sess != nil {
		http.Redirect(w, r, "/groups", http.StatusSeeOther)
		return
	}
	s.render(w, http.StatusOK, "signin", "Sign in", "", nil, signInForm{})
}

// maxCredential bounds a user name or password: RabbitMQ's own are far
// shorter, and the console dials with whatever it is given.
const maxCredential = 1024

// signIn checks a user and password by opening a connection as that user:
// the broker is the only judge. Failures are throttled per user and per
// client address, and logged with both, never with the password.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	user, password := r.PostFormValue("user"), r.PostFormValue("password")
	addr := clientAddr(r)
	now := s.now()
	log := s.log.With(zap.String("user", user), zap.String("addr", addr))
	if user == "" || password == "" || len(user) > maxCredential || len(password) > maxCredential {
		s.render(w, http.StatusBadRequest, "signin", "Sign in", "", nil, signInForm{User: user, Problem: "Enter a RabbitMQ user name and its password."})
		return
	}
	if wait := max(s.byUser.wait("user:"+user, now), s.byAddr.wait(addr, now)); wait > 0 {
		log.Warn("console sign-in refused: throttled", zap.Duration("wait", wait))
		w.Header().Set("Retry-After", retryAfter(wait))
		s.render(w, http.StatusTooManyRequests, "signin", "Sign in", "", nil,
			signInForm{User: user, Problem: "Too many failed sign-ins for this user or from this address: try again in " + wait.Round(time.Second).String() + "."})
		return
	}
	conn, err := s.opt.Dial(r.Context(), "console "+user, user, password)
	if err != nil {
		problem := "The broker did not accept this user and password."
		status := http.StatusUnauthorized
		if !errors.Is(err, amqp.ErrCredentials) && !errors.Is(err, amqp.ErrSASL) && !errors.Is(err, amqp.ErrVhost) {
			// Not a verdict on the password: the broker could not be
			// reached, or the user has no access to the virtual host.
			problem, status = "Could not sign in: "+err.Error(), http.StatusBadGateway
		}
		if errors.Is(err, amqp.ErrVhost) {
			problem, status = "This user may not use the deployment's virtual host.", http.StatusForbidden
		}
		s.byUser.failed("user:"+user, now)
		s.byAddr.failed(addr, now)
		log.Warn("console sign-in failed", zap.Error(err))
		s.render(w, status, "signin", "Sign in", "", nil, signInForm{User: user, Problem: problem})
		return
	}
	sess, err := s.sessions.start(user, password, addr, conn, now, s.opt.Dial)
	if err != nil {
		conn.Close()
		s.fail(w, r, nil, http.StatusInternalServerError, "Sign-in failed", err)
		return
	}
	s.byUser.succeeded("user:" + user)
	log.Info("console sign-in")
	setCookie(w, sess.id, s.opt.Secure)
	http.Redirect(w, r, "/groups", http.StatusSeeOther)
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request, sess *session) {
	s.sessions.remove(sess)
	s.forget(sess.user)
	s.log.Info("console sign-out", zap.String("user", sess.user), zap.String("addr", clientAddr(r)))
	setCookie(w, "", s.opt.Secure)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// retryAfter is a Retry-After header's value: whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
