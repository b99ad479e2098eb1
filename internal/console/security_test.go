package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// brokerless is a console whose broker refuses every password, counting
// the sign-ins that reached it: the refusals before the broker is asked
// need no broker.
type brokerless struct {
	t      *testing.T
	http   *httptest.Server
	dialed atomic.Int32
	logs   *observer.ObservedLogs
}

func newBrokerless(t *testing.T, tune func(*Options)) *brokerless {
	t.Helper()
	b := &brokerless{t: t}
	core, logs := observer.New(zap.InfoLevel)
	b.logs = logs
	opt := Options{Logger: zap.New(core), Dial: func(context.Context, string, string, string) (*amqp.Connection, error) {
		b.dialed.Add(1)
		return nil, amqp.ErrCredentials
	}}
	if tune != nil {
		tune(&opt)
	}
	srv, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	b.http = httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		b.http.Close()
		srv.Close()
	})
	return b
}

// browser is a person using b's console from behind a proxy that says
// they come from forwardedFor ("": no proxy).
func (b *brokerless) browser(forwardedFor string) *person {
	return newPerson(b.t, b.http.URL, forwardedFor)
}

// TestSignInCSRF: the sign-in form carries a CSRF token tied to a cookie
// of its own (login CSRF); a sign-in without it, with a wrong one, or
// with one but not its cookie is refused before the broker is asked, and
// logged; the form's own token reaches the broker.
func TestSignInCSRF(t *testing.T) {
	b := newBrokerless(t, nil)
	creds := url.Values{"user": {"guest"}, "password": {"guest"}}
	with := func(v url.Values, csrf string) url.Values {
		out := url.Values{"csrf": {csrf}}
		for k, vs := range v {
			out[k] = vs
		}
		return out
	}

	forger := b.browser("") // another site's form: no cookie, no token
	want(t, "a sign-in without a token", forger.do(http.MethodPost, "/signin", creds), http.StatusForbidden, "CSRF")

	p := b.browser("")
	token := csrfOf(t, p.do(http.MethodGet, "/signin", nil).body)
	want(t, "a sign-in with a wrong token", p.do(http.MethodPost, "/signin", with(creds, token+"x")), http.StatusForbidden, "CSRF")
	want(t, "a sign-in with another browser's token", forger.do(http.MethodPost, "/signin", with(creds, token)), http.StatusForbidden, "CSRF")
	if n := b.dialed.Load(); n != 0 {
		t.Errorf("%d refused sign-ins reached the broker", n)
	}
	if got := b.logs.FilterMessage("console sign-in refused: bad CSRF token").Len(); got != 3 {
		t.Errorf("%d sign-ins refused for their CSRF token logged, want 3", got)
	}

	want(t, "a sign-in with the form's token", p.do(http.MethodPost, "/signin", with(creds, token)), http.StatusUnauthorized, "did not accept")
	if n := b.dialed.Load(); n != 1 {
		t.Errorf("%d sign-ins reached the broker, want 1", n)
	}
	// The refused form comes back with a token that works.
	refused := forger.do(http.MethodPost, "/signin", creds)
	want(t, "the sign-in after the refusal", forger.do(http.MethodPost, "/signin", with(creds, csrfOf(t, refused.body))), http.StatusUnauthorized, "did not accept")
}

// TestThrottleBehindAProxy: behind a trusted proxy, the sign-ins of one
// client (by X-Forwarded-For) are throttled without holding back another
// client of the same proxy; without trusting it, every client is the
// proxy, and the header, which anyone can write, is ignored.
func TestThrottleBehindAProxy(t *testing.T) {
	const limit = 4 // by address: 4 times SignInLimit
	t.Run("trusted", func(t *testing.T) {
		b := newBrokerless(t, func(o *Options) {
			o.SignInLimit = 1
			o.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
		})
		guesser := b.browser("203.0.113.7")
		for i := range limit {
			want(t, "a wrong password", guesser.signInAs("user"+string(rune('a'+i)), "guess"), http.StatusUnauthorized, "did not accept")
		}
		want(t, "the guesser once more", guesser.signInAs("other", "guess"), http.StatusTooManyRequests, "Too many")
		// A client cannot pick its address: what it writes left of the
		// proxy's entry is not believed.
		want(t, "the guesser claiming another address", b.browser("198.51.100.1, 203.0.113.7").signInAs("other", "guess"), http.StatusTooManyRequests, "Too many")
		want(t, "another client of the proxy", b.browser("203.0.113.8").signInAs("someone", "guess"), http.StatusUnauthorized, "did not accept")
		if n := b.logs.FilterField(zap.String("addr", "203.0.113.7")).Len(); n == 0 {
			t.Error("the log does not name the client's address")
		}
	})
	t.Run("not trusted", func(t *testing.T) {
		b := newBrokerless(t, func(o *Options) { o.SignInLimit = 1 })
		for i := range limit {
			want(t, "a wrong password", b.browser("203.0.113.7").signInAs("user"+string(rune('a'+i)), "guess"), http.StatusUnauthorized, "did not accept")
		}
		want(t, "another forwarded-for, same peer", b.browser("203.0.113.8").signInAs("someone", "guess"), http.StatusTooManyRequests, "Too many")
	})
}

func TestClientAddr(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	tests := []struct {
		name, peer string
		xff        []string
		trusted    bool
		want       string
	}{
		{"no proxy trusted: the peer", "10.1.1.1:5000", []string{"203.0.113.9"}, false, "10.1.1.1"},
		{"an untrusted peer's header is ignored", "192.0.2.1:5000", []string{"203.0.113.9"}, true, "192.0.2.1"},
		{"one proxy", "10.1.1.1:5000", []string{"203.0.113.9"}, true, "203.0.113.9"},
		{"a client's own entry left of the proxy's", "10.1.1.1:5000", []string{"198.51.100.1, 203.0.113.9"}, true, "203.0.113.9"},
		{"two proxies", "10.1.1.1:5000", []string{"203.0.113.9, 10.2.2.2"}, true, "203.0.113.9"},
		{"two headers", "10.1.1.1:5000", []string{"198.51.100.1", "203.0.113.9, 10.2.2.2"}, true, "203.0.113.9"},
		{"no header", "10.1.1.1:5000", nil, true, "10.1.1.1"},
		{"only proxies", "10.1.1.1:5000", []string{"10.3.3.3"}, true, "10.3.3.3"},
		{"garbage: the last trusted hop", "10.1.1.1:5000", []string{"203.0.113.9, bogus"}, true, "10.1.1.1"},
		{"IPv6 proxy", "[fd00::1]:5000", []string{"2001:db8::7"}, true, "2001:db8::7"},
		{"an IPv4-mapped peer", "[::ffff:10.1.1.1]:5000", []string{"203.0.113.9"}, true, "203.0.113.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{}
			if tt.trusted {
				s.opt.TrustedProxies = proxies
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tt.peer
			for _, h := range tt.xff {
				r.Header.Add("X-Forwarded-For", h)
			}
			if got := s.clientAddr(r); got != tt.want {
				t.Errorf("client %q, want %q", got, tt.want)
			}
		})
	}
}

func TestThrottleKey(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.9":             "203.0.113.9",
		"2001:db8:1:2:3:4:5:6":    "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":    "2001:db8:1:2::/64",
		"not an address (a test)": "not an address (a test)",
	} {
		if got := throttleKey(in); got != want {
			t.Errorf("throttleKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestSignInThrottleHoldsAtOnce: wrong passwords fired at once from one
// address reach the broker no more often than the limit lets them one
// after the other; a guesser at one address does not lock the user out
// of another; a broker that cannot be reached counts against no one.
func TestSignInThrottleHoldsAtOnce(t *testing.T) {
	const limit, fired = 5, 40
	gate := make(chan struct{})
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(openGate) // a failure before the gate opens must not leave handlers waiting on it
	var outage atomic.Bool
	var arrived atomic.Int32 // guesses the broker holds
	b := newBrokerless(t, func(o *Options) {
		o.SignInLimit = limit
		o.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
		o.Dial = func(ctx context.Context, _, _, _ string) (*amqp.Connection, error) {
			arrived.Add(1)
			<-gate
			if outage.Load() {
				return nil, errors.New("dial tcp 127.0.0.1:5672: connect: connection refused")
			}
			return nil, amqp.ErrCredentials
		}
	})
	dialed := func() int { return len(b.logs.FilterMessage("console sign-in failed").All()) }

	// Every guess gets its form first, then all go at once; the broker
	// answers none until every request has either reached it or been
	// refused.
	forms := make([]url.Values, fired)
	guessers := make([]*person, fired)
	for i := range guessers {
		guessers[i] = b.browser("203.0.113.7")
		forms[i] = url.Values{"user": {"admin"}, "password": {fmt.Sprint("guess", i)},
			"csrf": {csrfOf(t, guessers[i].get("/signin").body)}}
	}
	statuses := make(chan int, fired)
	for i, g := range guessers {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, g.base+"/signin", strings.NewReader(forms[i].Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("X-Forwarded-For", g.forwardedFor)
			res, err := g.client.Do(req)
			if err != nil {
				statuses <- 0
				return
			}
			res.Body.Close()
			statuses <- res.StatusCode
		}()
	}
	refused := 0
	for deadline := time.After(time.Minute); refused+int(arrived.Load()) < fired; {
		select {
		case s := <-statuses:
			if s != http.StatusTooManyRequests {
				t.Fatalf("a guess answered %d before the broker did", s)
			}
			refused++
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("after a minute %d guesses refused and %d at the broker, of %d", refused, arrived.Load(), fired)
		}
	}
	openGate()
	for range fired - refused {
		if s := <-statuses; s != http.StatusUnauthorized {
			t.Errorf("a guess that reached the broker answered %d, want 401", s)
		}
	}
	if n := dialed(); n != limit {
		t.Errorf("%d of %d guesses fired at once reached the broker, want %d (the limit)", n, fired, limit)
	}

	want(t, "admin from the guesser's address", b.browser("203.0.113.7").signInAs("admin", "right"), http.StatusTooManyRequests, "Too many")
	want(t, "admin from another address", b.browser("198.51.100.9").signInAs("admin", "right"), http.StatusUnauthorized, "did not accept")

	outage.Store(true)
	for i := range 2 * limit {
		want(t, fmt.Sprint("sign-in ", i+1, " while the broker is down"), b.browser("198.51.100.10").signInAs("ops", "right"), http.StatusBadGateway, "Could not sign in")
	}
	outage.Store(false)
	want(t, "the same user once the broker is back", b.browser("198.51.100.10").signInAs("ops", "right"), http.StatusUnauthorized, "did not accept")
}
