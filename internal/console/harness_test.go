package console

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/delayed"
	"github.com/rebound-mq/rebound/internal/delayqueue"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// The harness of the package's tests: one test's rebound deployment on
// the broker under test, a console serving it through httptest, and
// people signing in to it with cookie jars of their own.

type env struct {
	*brokertest.Deployment
	t      testing.TB
	router route.Router
	srv    *Server
	http   *httptest.Server
	logs   *observer.ObservedLogs
}

// newEnv sets up a deployment and a console on it; tune adjusts the
// console's options.
func newEnv(t testing.TB, tune func(*Options)) *env {
	t.Helper()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	cfg := d.Config()
	router := cfg.Router()
	router.Topology = router.Topology.ForServer(d.Conn.Properties)
	if _, err := declarer.Declare(d.Conn, router.Topology); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	vhost := cfg.Vhost()
	u, err := url.Parse(d.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{
		Router: router,
		Dial: func(ctx context.Context, role, user, password string) (*amqp.Connection, error) {
			plain := *u
			plain.User = nil
			return amqp.DialConfig(plain.String(), amqp.Config{Vhost: vhost, Heartbeat: 10 * time.Second, Locale: "en_US",
				SASL: []amqp.Authentication{&amqp.PlainAuth{Username: user, Password: password}}})
		},
		Delays:       delayed.Delays(2, 10*time.Minute),
		Logger:       zap.New(core),
		ShareReading: time.Nanosecond, // every page reads the queue again
	}
	if tune != nil {
		tune(&opt)
	}
	srv, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
	})
	return &env{Deployment: d, t: t, router: router, srv: srv, http: hs, logs: logs}
}

// parked is a message to seed into the parking queue.
type parked struct {
	id, origin, errText string
	reason              policy.Reason
	age                 time.Duration
	body                string
	contentType         string
}

// seed parks the messages as the sidecar does (Codec.Park, with the
// group header written as route does).
func (e *env) seed(now time.Time, ps ...parked) {
	e.t.Helper()
	c := e.router.Codec
	msgs := make([]amqp.Publishing, 0, len(ps))
	for _, p := range ps {
		at := now.Add(-p.age)
		s := headers.State{
			State:  policy.State{Retries: 3, StartedAt: at.Add(-time.Hour), LastDelay: time.Second},
			Origin: p.origin, FirstDeathReason: "rejected", FirstDeathQueue: p.origin,
			Policy: e.router.Policies.Default().Label(),
		}
		h := amqp.Table{"tenant": "acme"}
		if p.errText != "" {
			h[c.Names.Error] = p.errText
		}
		s.Group = group.Of(p.origin, p.errText, string(p.reason)) // Park writes it, and drops a header it does not hold
		body := p.body
		if body == "" {
			body = "body of " + p.id
		}
		msgs = append(msgs, amqp.Publishing{
			MessageId: p.id, ContentType: p.contentType, DeliveryMode: amqp.Persistent,
			Headers: c.Park(h, s, p.reason, at), Body: []byte(body),
		})
	}
	brokertest.PublishConfirmed(e.t, e.Ch, e.router.Topology.ParkingQueue, msgs...)
}

// person is someone using the console at base in a browser: a cookie
// jar; forwardedFor, if set, is the X-Forwarded-For header a proxy in
// front of the console adds to their requests.
type person struct {
	t            testing.TB
	base         string
	client       *http.Client
	forwardedFor string
}

func newPerson(t testing.TB, base, forwardedFor string) *person {
	jar, _ := cookiejar.New(nil)
	return &person{t: t, base: base, forwardedFor: forwardedFor,
		client: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (e *env) person() *person { return newPerson(e.t, e.http.URL, "") }

// response is a page as a person got it.
type response struct {
	status   int
	location string
	body     string
}

func (p *person) do(method, path string, form url.Values) response {
	p.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, p.base+path, body)
	if err != nil {
		p.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if p.forwardedFor != "" {
		req.Header.Set("X-Forwarded-For", p.forwardedFor)
	}
	res, err := p.client.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		p.t.Fatal(err)
	}
	return response{status: res.StatusCode, location: res.Header.Get("Location"), body: string(b)}
}

func (p *person) get(path string) response { return p.do(http.MethodGet, path, nil) }

// post sends form with the CSRF token of the page at from.
func (p *person) post(path string, form url.Values, from string) response {
	p.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if from != "" {
		form.Set("csrf", csrfOf(p.t, p.get(from).body))
	}
	return p.do(http.MethodPost, path, form)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t testing.TB, page string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", page)
	}
	return m[1]
}

var hiddenField = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// confirmFormOf is what a browser posts when the preview's confirm button
// is pressed: every hidden field of the page.
func confirmFormOf(t testing.TB, page string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page, -1) {
		form.Add(m[1], html.UnescapeString(m[2]))
	}
	if form.Get("csrf") == "" {
		t.Fatalf("no confirm form in the page:\n%s", page)
	}
	return form
}

// signInAs posts the sign-in form, as a browser does: the form's page
// first, for its CSRF token and cookie.
func (p *person) signInAs(user, password string) response {
	p.t.Helper()
	return p.post("/signin", url.Values{"user": {user}, "password": {password}}, "/signin")
}

// signIn signs in as user and requires it to work.
func (p *person) signIn(user, password string) {
	p.t.Helper()
	res := p.signInAs(user, password)
	if res.status != http.StatusSeeOther || res.location != "/groups" {
		p.t.Fatalf("sign in as %s: status %d location %q\n%s", user, res.status, res.location, res.body)
	}
}

// want fails the test unless res has status and contains every piece.
func want(t *testing.T, what string, res response, status int, pieces ...string) {
	t.Helper()
	if res.status != status {
		t.Errorf("%s: status %d, want %d\n%s", what, res.status, status, res.body)
		return
	}
	for _, piece := range pieces {
		if !strings.Contains(res.body, piece) {
			t.Errorf("%s: page lacks %q\n%s", what, piece, res.body)
		}
	}
}

// await waits for a job page to say it is done and returns it.
func (p *person) await(jobPath string) response {
	p.t.Helper()
	var res response
	if !brokertest.Await(30*time.Second, func() bool {
		res = p.get(jobPath)
		return !strings.Contains(res.body, "Running:") && !strings.Contains(res.body, `http-equiv="refresh"`)
	}) {
		p.t.Fatalf("%s still running:\n%s", jobPath, res.body)
	}
	return res
}

// user creates a broker user for the test in the deployment's virtual
// host with the permissions given.
func (e *env) user(configure, write, read string) (name, password string) {
	e.t.Helper()
	password = "pw-" + brokertest.RandomSuffix()
	name, _ = e.Broker.User(e.t, e.URL(), password, configure, write, read)
	return name, password
}

func (e *env) logged(msg string) int {
	return e.logs.FilterMessage(msg).Len()
}

// seedDelayed puts copies into two delay queues as the sidecar does: four
// for the application queue, due in 5 and 9 minutes, and one for another
// queue.
func (e *env) seedDelayed() {
	e.t.Helper()
	topo, codec := e.router.Topology, e.router.Codec
	now := time.Now()
	other := e.Prefix + "billing"
	e.Declare(other, nil)
	delays, err := delayqueue.New(e.Conn, topo, nil, time.Now)
	if err != nil {
		e.t.Fatal(err)
	}
	defer delays.Close()
	for i, w := range []struct {
		origin string
		delay  time.Duration
	}{{e.App, 5 * time.Minute}, {e.App, 5 * time.Minute}, {e.App, 9 * time.Minute}, {e.App, 9 * time.Minute}, {other, 9 * time.Minute}} {
		if _, err := delays.Ensure(w.delay); err != nil {
			e.t.Fatal(err)
		}
		s := headers.State{State: policy.State{Retries: 2, StartedAt: now.Add(-time.Hour), LastDelay: w.delay}, Origin: w.origin,
			Policy: e.router.Policies.Default().Label()}
		dest := topo.Delayed(w.delay)
		dc, err := e.Ch.PublishWithDeferredConfirmWithContext(context.Background(), dest.Exchange, dest.RoutingKey, true, false, amqp.Publishing{
			MessageId: fmt.Sprint("d", i), DeliveryMode: amqp.Persistent, Body: []byte("waiting"),
			Headers: codec.Retry(amqp.Table{}, s, w.delay, now.Add(w.delay)),
		})
		if err != nil {
			e.t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			e.t.Fatalf("seeded copy not confirmed: %v", err)
		}
	}
}
