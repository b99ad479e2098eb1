package console

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/policy"
)

// seedThree parks five messages of three groups: three timeouts of app
// (numbers differ, one group), one schema error of app, and one of app
// parked for max-retries with no error.
func (e *env) seedThree(now time.Time) (timeouts, schema, bare string) {
	e.seed(now,
		parked{id: "t1", origin: e.App, reason: policy.MaxRetries, errText: "timeout after 3012 ms on 10.1.2.3", age: time.Hour},
		parked{id: "t2", origin: e.App, reason: "max-duration", errText: "timeout after 2990 ms on 10.1.2.4", age: 2 * time.Hour},
		parked{id: "t3", origin: e.App, reason: policy.MaxRetries, errText: "timeout after 12 ms on 10.1.2.5", age: time.Minute},
		parked{id: "s1", origin: e.App, reason: policy.NonRetryable, errText: `schema: field "total" missing`,
			body: `{"order":1,"note":"<script>alert('x')</script>"}`, contentType: "application/json"},
		parked{id: "b1", origin: e.App, reason: policy.MaxRetries},
	)
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 5, 10*time.Second)
	return group.Of(e.App, "timeout after 1 ms on 10.0.0.1", ""), group.Of(e.App, `schema: field "total" missing`, ""),
		group.Of(e.App, "", string(policy.MaxRetries))
}

// TestPages: a person signed in sees the groups, a group's messages, one
// message in full (its body escaped) and the delayed copies.
func TestPages(t *testing.T) {
	e := newEnv(t, nil)
	timeouts, schema, bare := e.seedThree(time.Now())
	p := e.person()
	p.signIn("guest", "guest")

	groups := p.get("/groups")
	want(t, "groups page", groups, http.StatusOK, "5 messages in", "3 groups", timeouts, schema, bare,
		"timeout after 3012 ms on 10.1.2.3", `<svg class="spark"`)
	if strings.Index(groups.body, timeouts) > strings.Index(groups.body, schema) {
		t.Errorf("the largest group is not first:\n%s", groups.body)
	}

	group := p.get("/groups/" + timeouts)
	want(t, "group page", group, http.StatusOK, `<dd id="count">3</dd>`, ">t1<", ">t2<", ">t3<", "Preview replay", "Preview purge")
	if strings.Contains(group.body, ">s1<") {
		t.Errorf("the timeouts' page lists the schema error's message:\n%s", group.body)
	}

	link := regexp1(t, group.body, `href="(/groups/`+timeouts+`/messages/[0-9a-f]+)"`)
	msg := p.get(link)
	want(t, "message page", msg, http.StatusOK, "x-retry-parked-reason", "body of t", "Dead-letter history", "parked reason")

	schemaPage := p.get("/groups/" + schema)
	msg = p.get(regexp1(t, schemaPage.body, `href="(/groups/`+schema+`/messages/[0-9a-f]+)"`))
	want(t, "a JSON body", msg, http.StatusOK, "shown as json", "&lt;script&gt;", `&#34;order&#34;: 1`)
	if strings.Contains(msg.body, "<script>") {
		t.Errorf("a body's markup reached the page unescaped:\n%s", msg.body)
	}

	want(t, "delayed page", p.get("/delayed"), http.StatusOK, "No copy is waiting", "0 copies in 0 delay queues")
	want(t, "no such group", p.get("/groups/000000000000"), http.StatusNotFound, "no parked message of this group")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 5, 10*time.Second) // reading left every message parked
}

func regexp1(t *testing.T, s, pattern string) string {
	t.Helper()
	m := mustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("nothing matches %s in:\n%s", pattern, s)
	}
	return m[1]
}

// TestRefusals: no session, a bad CSRF token, a wrong password, a
// throttled sign-in and a user the broker does not let read the parking
// queue are all refused, and logged.
func TestRefusals(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.SignInLimit = 3 })
	timeouts, _, _ := e.seedThree(time.Now())

	stranger := e.person()
	res := stranger.get("/groups")
	if res.status != http.StatusSeeOther || res.location != "/signin" {
		t.Errorf("no session, a page: status %d location %q, want 303 to /signin", res.status, res.location)
	}
	want(t, "no session, an action", stranger.post("/groups/"+timeouts+"/purge", nil, ""), http.StatusForbidden, "sign in first")

	p := e.person()
	p.signIn("guest", "guest")
	want(t, "an action without its CSRF token", p.do(http.MethodPost, "/groups/"+timeouts+"/purge", url.Values{}), http.StatusForbidden, "CSRF")
	want(t, "an action with a wrong CSRF token", p.do(http.MethodPost, "/groups/"+timeouts+"/purge", url.Values{"csrf": {"forged"}}), http.StatusForbidden, "CSRF")
	want(t, "sign-out without its CSRF token", p.do(http.MethodPost, "/signout", url.Values{}), http.StatusForbidden, "CSRF")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 5, 10*time.Second)
	if got := e.logged("console action refused: bad CSRF token"); got != 3 {
		t.Errorf("%d refusals for a bad CSRF token logged, want 3", got)
	}

	guesser := e.person()
	for i := range 3 {
		res := guesser.signInAs("guest", fmt.Sprint("guess", i))
		want(t, "a wrong password", res, http.StatusUnauthorized, "did not accept")
	}
	res = guesser.signInAs("guest", "guest")
	want(t, "a sign-in after 3 failures", res, http.StatusTooManyRequests, "Too many failed sign-ins")
	if got := e.logged("console sign-in refused: throttled"); got != 1 {
		t.Errorf("%d throttled sign-ins logged, want 1", got)
	}
	for _, entry := range e.logs.All() {
		for _, f := range entry.Context {
			if strings.Contains(f.String, "guess") || strings.Contains(f.String, "pw-") {
				t.Errorf("a password reached the log: %s %v", entry.Message, entry.Context)
			}
		}
	}

	// Read on the application queue only: not on the parking queue.
	name, password := e.user(".*", ".*", "^"+e.App+"$")
	outsider := e.person()
	outsider.signIn(name, password)
	res = outsider.get("/groups")
	want(t, "a user without read on the parking queue", res, http.StatusForbidden, "refused your user")
	if strings.Contains(res.body, timeouts) || strings.Contains(res.body, "timeout after") {
		t.Errorf("a user without read on the parking queue sees its messages:\n%s", res.body)
	}
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 5, 10*time.Second)
}

// TestReplayGroup: a group's replay is previewed with its count,
// confirmed, followed to its end, and its messages leave the parking
// queue for their origin; the other groups stay parked. Then a purge.
func TestReplayGroup(t *testing.T) {
	e := newEnv(t, nil)
	timeouts, schema, _ := e.seedThree(time.Now())
	p := e.person()
	p.signIn("guest", "guest")
	preview := p.get("/groups/" + timeouts + "/replay?rate=100")
	want(t, "replay preview", preview, http.StatusOK, `<b id="preview-count">3</b>`, "At most 100 messages a second", "Confirm: replay group")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 5, 10*time.Second) // a preview moves nothing
	if n := e.QueueLen(e.App); n != 0 {
		t.Fatalf("the preview sent %d messages to %s", n, e.App)
	}
	res := p.do(http.MethodPost, "/groups/"+timeouts+"/replay", confirmFormOf(t, preview.body))
	if res.status != http.StatusSeeOther || !strings.HasPrefix(res.location, "/jobs/") {
		t.Fatalf("confirm: status %d location %q\n%s", res.status, res.location, res.body)
	}
	want(t, "the replay's end", p.await(res.location), http.StatusOK, "Done.", "replayed 3 messages; 0 stay parked")
	e.WaitQueueLen(e.App, 3, 10*time.Second)
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 2, 10*time.Second)
	groups := p.get("/groups")
	want(t, "groups after the replay", groups, http.StatusOK, "2 messages in", schema)
	if strings.Contains(groups.body, timeouts) {
		t.Errorf("the replayed group is still listed:\n%s", groups.body)
	}
	if got := e.logs.FilterMessage("console action done").All(); len(got) != 1 || got[0].ContextMap()["replayed"] != int64(3) || got[0].ContextMap()["user"] != "guest" {
		t.Errorf("the action's log: %v", got)
	}

	preview = p.get("/groups/" + schema + "/purge")
	want(t, "purge preview", preview, http.StatusOK, `<b id="preview-count">1</b>`, "deleted for good")
	res = p.do(http.MethodPost, "/groups/"+schema+"/purge", confirmFormOf(t, preview.body))
	want(t, "the purge's end", p.await(res.location), http.StatusOK, "purged 1 messages")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 1, 10*time.Second)
}

// TestGroupActionsTouchOnlyWhatTheirPreviewShowed: messages parked into a
// group between its preview and the confirmation stay parked, for a purge
// and for a replay; a confirmation without its preview's count is refused.
func TestGroupActionsTouchOnlyWhatTheirPreviewShowed(t *testing.T) {
	e := newEnv(t, nil)
	timeouts, _, _ := e.seedThree(time.Now())
	p := e.person()
	p.signIn("guest", "guest")
	late := func(ids ...string) {
		var ms []parked
		for _, id := range ids {
			ms = append(ms, parked{id: id, origin: e.App, reason: policy.MaxRetries, errText: "timeout after 40 ms on 10.1.2.9"})
		}
		e.seed(time.Now(), ms...)
	}

	preview := p.get("/groups/" + timeouts + "/purge")
	want(t, "purge preview", preview, http.StatusOK, `<b id="preview-count">3</b>`)
	late("late1", "late2")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 7, 10*time.Second)
	res := p.do(http.MethodPost, "/groups/"+timeouts+"/purge", confirmFormOf(t, preview.body))
	want(t, "the purge's end", p.await(res.location), http.StatusOK, "purged 3 messages")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 4, 10*time.Second)
	want(t, "the group after the purge", p.get("/groups/"+timeouts), http.StatusOK, `<dd id="count">2</dd>`, ">late1<", ">late2<")

	preview = p.get("/groups/" + timeouts + "/replay")
	want(t, "replay preview", preview, http.StatusOK, `<b id="preview-count">2</b>`)
	late("late3")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 5, 10*time.Second)
	res = p.do(http.MethodPost, "/groups/"+timeouts+"/replay", confirmFormOf(t, preview.body))
	want(t, "the replay's end", p.await(res.location), http.StatusOK, "replayed 2 messages; 0 stay parked")
	e.WaitQueueLen(e.App, 2, 10*time.Second)
	want(t, "the group after the replay", p.get("/groups/"+timeouts), http.StatusOK, `<dd id="count">1</dd>`, ">late3<")

	form := confirmFormOf(t, p.get("/groups/"+timeouts+"/purge").body)
	form.Del("seen")
	want(t, "a purge without its preview's count", p.do(http.MethodPost, "/groups/"+timeouts+"/purge", form), http.StatusBadRequest, "confirm from the preview page")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 3, 10*time.Second)
}

// TestTwoPeopleSeeEveryMessage: two people, as two broker users, load the
// groups page at once, again and again; reading holds the messages, and
// each page must still count every one of them.
func TestTwoPeopleSeeEveryMessage(t *testing.T) {
	e := newEnv(t, nil)
	e.seedThree(time.Now())
	name, password := e.user(".*", ".*", ".*")
	alice, bob := e.person(), e.person()
	alice.signIn("guest", "guest")
	bob.signIn(name, password)
	var wg sync.WaitGroup
	for _, p := range []*person{alice, bob, alice, bob} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				res := p.get("/groups")
				if res.status != http.StatusOK || !strings.Contains(res.body, "5 messages in") || !strings.Contains(res.body, "3 groups") {
					t.Errorf("a page read while another person reads: status %d\n%s", res.status, res.body)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestSignOutForgetsThePassword: after sign-out the session's cookie
// opens nothing and its password is gone from memory.
func TestSignOutForgetsThePassword(t *testing.T) {
	e := newEnv(t, nil)
	p := e.person()
	p.signIn("guest", "guest")
	res := p.post("/signout", nil, "/groups")
	if res.status != http.StatusSeeOther || res.location != "/signin" {
		t.Fatalf("sign-out: status %d location %q", res.status, res.location)
	}
	if res := p.get("/groups"); res.status != http.StatusSeeOther {
		t.Errorf("after sign-out a page answers %d", res.status)
	}
	e.srv.sessions.mu.Lock()
	n := len(e.srv.sessions.byID)
	e.srv.sessions.mu.Unlock()
	if n != 0 {
		t.Errorf("%d sessions kept after sign-out", n)
	}
}

func mustCompile(pattern string) *regexp.Regexp { return regexp.MustCompile(pattern) }

// TestDelayed: the delayed page counts the waiting copies by origin and
// due time; flushing one origin's copies is previewed, confirmed and
// sends them back now, the other origin's staying; cancelling parks the
// rest with reason cancelled.
func TestDelayed(t *testing.T) {
	e := newEnv(t, nil)
	e.seedDelayed()
	p := e.person()
	p.signIn("guest", "guest")
	page := p.get("/delayed")
	want(t, "delayed page", page, http.StatusOK, "5 copies in 2 delay queues", e.App, e.Prefix+"billing")
	row := regexp1(t, page.body, `(?s)<tr>\s*<td>`+regexp.QuoteMeta(e.App)+`</td>(.*?)</tr>`)
	if !strings.Contains(row, `<td class="n">4</td>`) {
		t.Errorf("the application queue's row does not count 4 copies: %s", row)
	}

	origin := "^" + regexp.QuoteMeta(e.App) + "$"
	preview := p.get("/delayed/flush?origin=" + url.QueryEscape(origin))
	want(t, "flush preview", preview, http.StatusOK, `<b id="preview-count">4</b>`)
	res := p.do(http.MethodPost, "/delayed/flush", url.Values{"csrf": {csrfOf(t, preview.body)}, "origin": {origin}})
	want(t, "the flush's end", p.await(res.location), http.StatusOK, "Done.", "4 of 4 matching copies moved")
	e.WaitQueueLen(e.App, 4, 10*time.Second)

	billing := "^" + regexp.QuoteMeta(e.Prefix+"billing") + "$"
	preview = p.get("/delayed/cancel?origin=" + url.QueryEscape(billing))
	want(t, "cancel preview", preview, http.StatusOK, `<b id="preview-count">1</b>`)
	res = p.do(http.MethodPost, "/delayed/cancel", url.Values{"csrf": {csrfOf(t, preview.body)}, "origin": {billing}})
	want(t, "the cancel's end", p.await(res.location), http.StatusOK, "Done.", "1 of 1 matching copies moved")
	e.WaitQueueLen(e.router.Topology.ParkingQueue, 1, 10*time.Second)
	want(t, "groups after the cancel", p.get("/groups"), http.StatusOK, "cancelled")
}

// TestPermissionsEachPageNeeds: the least permissions docs/console.md
// lists for each page and action are enough, and a page outside them is
// refused.
func TestPermissionsEachPageNeeds(t *testing.T) {
	e := newEnv(t, nil)
	timeouts, _, _ := e.seedThree(time.Now())
	e.seedDelayed()
	q := func(suffix string) string { return "^" + regexp.QuoteMeta(e.Prefix+suffix) + "$" }
	parkedQ := q("parked")
	delays := "^" + regexp.QuoteMeta(e.Prefix+"delay.") + "[0-9]+$"
	delaysOrLock := "^" + regexp.QuoteMeta(e.Prefix+"delay.") + "([0-9]+|lock)$"
	// The four users at once: one rabbitmqctl call, not two each.
	users := e.Broker.Users(t, e.URL(),
		brokertest.UserSpec{Permissions: brokertest.Permissions{Configure: "^$", Write: "^$", Read: parkedQ}},
		brokertest.UserSpec{Permissions: brokertest.Permissions{Configure: "^$", Write: "^amq\\.default$", Read: parkedQ}},
		brokertest.UserSpec{Permissions: brokertest.Permissions{Configure: q("delay.lock"), Write: "^$", Read: delays}},
		brokertest.UserSpec{Permissions: brokertest.Permissions{Configure: delaysOrLock, Write: "^amq\\.default$|" + delays, Read: delays}})
	viewer := e.person()
	viewer.signIn(users[0].Name, users[0].Password)
	want(t, "read on the parking queue: groups", viewer.get("/groups"), http.StatusOK, timeouts)
	want(t, "read on the parking queue: a group", viewer.get("/groups/"+timeouts), http.StatusOK, ">t1<")
	want(t, "read on the parking queue: the delayed page", viewer.get("/delayed"), http.StatusForbidden, "refused")

	replayer := e.person()
	replayer.signIn(users[1].Name, users[1].Password)
	preview := replayer.get("/groups/" + timeouts + "/replay")
	want(t, "replay preview", preview, http.StatusOK, `<b id="preview-count">3</b>`)
	res := replayer.do(http.MethodPost, "/groups/"+timeouts+"/replay", confirmFormOf(t, preview.body))
	want(t, "replay with write on amq.default", replayer.await(res.location), http.StatusOK, "replayed 3 messages; 0 stay parked")
	e.WaitQueueLen(e.App, 3, 10*time.Second)

	waiting := e.person()
	waiting.signIn(users[2].Name, users[2].Password)
	want(t, "the delayed page", waiting.get("/delayed"), http.StatusOK, "5 copies in 2 delay queues")

	flusher := e.person()
	flusher.signIn(users[3].Name, users[3].Password)
	origin := "^" + regexp.QuoteMeta(e.App) + "$"
	preview = flusher.get("/delayed/flush?origin=" + url.QueryEscape(origin))
	res = flusher.do(http.MethodPost, "/delayed/flush", url.Values{"csrf": {csrfOf(t, preview.body)}, "origin": {origin}})
	want(t, "flush", flusher.await(res.location), http.StatusOK, "Done.", "4 of 4 matching copies moved; 1 other copies put back")
	e.WaitQueueLen(e.App, 7, 10*time.Second)
}

// TestSessionCookie: the cookie is a random id, HttpOnly, SameSite=Strict
// and, served over TLS, Secure; it carries nothing of the user or the
// password. The sign-in form's own cookie is alike, and cleared at
// sign-in.
func TestSessionCookie(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Secure = true })
	// No cookie jar: it would not send a Secure cookie over plain HTTP.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	page, err := client.Get(e.http.URL + "/signin")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(page.Body)
	page.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	nonce := cookieNamed(t, page.Cookies(), signInCookie)
	if !nonce.HttpOnly || !nonce.Secure || nonce.SameSite != http.SameSiteStrictMode || len(nonce.Value) < 40 {
		t.Errorf("sign-in cookie %s", nonce)
	}
	form := url.Values{"user": {"guest"}, "password": {"guest"}, "csrf": {csrfOf(t, string(body))}}
	req, err := http.NewRequest(http.MethodPost, e.http.URL+"/signin", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: nonce.Name, Value: nonce.Value})
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-in: status %d", res.StatusCode)
	}
	if cleared := cookieNamed(t, res.Cookies(), signInCookie); cleared.MaxAge >= 0 {
		t.Errorf("the sign-in cookie is not cleared at sign-in: %s", cleared)
	}
	c := cookieNamed(t, res.Cookies(), cookieName)
	if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteStrictMode || len(c.Value) < 40 || strings.Contains(c.Value, "guest") {
		t.Errorf("cookie %s", c)
	}
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"} {
		if res.Header.Get(h) == "" {
			t.Errorf("no %s header", h)
		}
	}
}

func cookieNamed(t *testing.T, cookies []*http.Cookie, name string) *http.Cookie {
	t.Helper()
	for _, c := range cookies {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no cookie %s in %v", name, cookies)
	return nil
}
