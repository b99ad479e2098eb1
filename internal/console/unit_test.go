package console

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/parking"
	"github.com/rebound-mq/rebound/internal/route"
)

func TestThrottle(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		failures []time.Duration // after t0
		success  bool            // a success after them
		at       time.Duration
		want     time.Duration
	}{
		{"no failure", nil, false, 0, 0},
		{"fewer than the limit", []time.Duration{0, time.Second}, false, 2 * time.Second, 0},
		{"at the limit: wait for the oldest to age out", []time.Duration{0, time.Minute, 2 * time.Minute}, false, 3 * time.Minute, 12 * time.Minute},
		{"past the window", []time.Duration{0, time.Minute, 2 * time.Minute}, false, 15 * time.Minute, 0},
		{"one aged out, one more failed", []time.Duration{0, time.Minute, 2 * time.Minute, 15 * time.Minute}, false, 15*time.Minute + time.Second, 59 * time.Second},
		{"a success forgets", []time.Duration{0, time.Minute, 2 * time.Minute}, true, 3 * time.Minute, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newThrottle(3, 15*time.Minute)
			for _, f := range tt.failures {
				fail(t, th, "k", t0.Add(f))
			}
			if tt.success {
				th.pending[digest("k")]++ // begun before the failures filled the limit
				th.end("k", t0.Add(tt.at), signedIn)
			}
			if got := th.begin("k", t0.Add(tt.at)); got != tt.want {
				t.Errorf("wait %s, want %s", got, tt.want)
			} else if got == 0 {
				th.end("k", t0.Add(tt.at), inconclusive)
			}
			if got := th.begin("other", t0.Add(tt.at)); got != 0 {
				t.Errorf("another key waits %s", got)
			} else {
				th.end("other", t0.Add(tt.at), inconclusive)
			}
			if len(th.pending) != 0 {
				t.Errorf("%d keys pending after every attempt ended", len(th.pending))
			}
		})
	}
}

// fail records a failed attempt of key at now, which the throttle must
// let begin.
func fail(t *testing.T, th *throttle, key string, now time.Time) {
	t.Helper()
	if wait := th.begin(key, now); wait != 0 {
		t.Fatalf("%s refused before a failure (wait %s)", key, wait)
	}
	th.end(key, now, wrongCredentials)
}

func TestThrottleHoldsAtMostMaxKeys(t *testing.T) {
	th := newThrottle(3, time.Hour)
	th.maxKeys = 10
	t0 := time.Now()
	for i := range 100 {
		fail(t, th, strings.Repeat("k", 1000+i), t0.Add(time.Duration(i)*time.Second))
	}
	if n := len(th.failures); n > 10 {
		t.Errorf("%d keys kept, want at most 10", n)
	}
	if len(th.pending) != 0 {
		t.Errorf("%d keys pending after every attempt ended", len(th.pending))
	}
}

// TestSuccessForgetsTheUserNotTheAddress: signing in with one valid
// account forgets that user's failures, not the address's guesses at
// others.
func TestSuccessForgetsTheUserNotTheAddress(t *testing.T) {
	byUser, byAddr := newThrottle(3, time.Hour), newThrottle(3, time.Hour)
	now := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	for i := range 2 {
		a := attempt{{t: byUser, key: fmt.Sprint("victim", i), forgetOnSuccess: true}, {t: byAddr, key: "203.0.113.7"}}
		if a.begin(now) != 0 {
			t.Fatal("a first guess refused")
		}
		a.end(now, wrongCredentials)
	}
	own := attempt{{t: byUser, key: "mine", forgetOnSuccess: true}, {t: byAddr, key: "203.0.113.7"}}
	if own.begin(now) != 0 {
		t.Fatal("the own sign-in refused")
	}
	own.end(now, signedIn)
	if n := len(byAddr.failures[digest("203.0.113.7")]); n != 2 {
		t.Errorf("after a success from the address, %d of its 2 failures kept", n)
	}
}

// TestThrottleCountsAttemptsUnderWay: attempts begun and not ended count
// against the limit, so attempts fired at once cannot all pass; an
// inconclusive one (the broker unreachable) counts for nothing once ended.
func TestThrottleCountsAttemptsUnderWay(t *testing.T) {
	th := newThrottle(3, 15*time.Minute)
	now := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	for i := range 3 {
		if wait := th.begin("k", now); wait != 0 {
			t.Fatalf("attempt %d of 3 at once waits %s", i+1, wait)
		}
	}
	if wait := th.begin("k", now); wait != pendingWait {
		t.Errorf("a 4th attempt while 3 are under way waits %s, want %s", wait, pendingWait)
	}
	for range 3 {
		th.end("k", now, inconclusive)
	}
	if wait := th.begin("k", now); wait != 0 {
		t.Errorf("after 3 inconclusive attempts ended, a 4th waits %s, want 0", wait)
	}
	th.end("k", now, wrongCredentials)
	if n := len(th.failures[digest("k")]); n != 1 {
		t.Errorf("%d failures kept, want 1 (the inconclusive attempts are none)", n)
	}
}

func TestSummarize(t *testing.T) {
	now := time.Date(2026, 11, 27, 3, 30, 0, 0, time.UTC)
	msg := func(group, origin, reason, err string, ago time.Duration) parking.Message {
		return parking.Message{Group: group, Origin: origin, Reason: reason, Error: err, Reported: err, ParkedAt: now.Add(-ago),
			Delivery: amqp.Delivery{MessageId: group + origin}}
	}
	acc := newSummary(now)
	for _, m := range []parking.Message{
		msg("aaa", "orders", "max-retries", "timeout 1", 10*time.Minute),
		msg("bbb", "billing", "non-retryable", "schema", 30*time.Hour),
		msg("aaa", "orders", "max-duration", "timeout 2", 90*time.Minute),
		msg("aaa", "orders", "max-retries", "timeout 3", 90*time.Minute),
	} {
		acc.add(m)
	}
	rows, kept := acc.groups()
	if len(rows) != 2 || rows[0].ID != "aaa" || rows[0].Count != 3 || rows[1].ID != "bbb" {
		t.Fatalf("rows %+v", rows)
	}
	a := rows[0]
	if a.Origin != "orders" || a.Reason != "max-retries" || a.OtherReasons != 1 || a.Error != "timeout 1" {
		t.Errorf("row aaa %+v", a)
	}
	if !a.First.Equal(now.Add(-90*time.Minute)) || !a.Last.Equal(now.Add(-10*time.Minute)) {
		t.Errorf("first %s last %s", a.First, a.Last)
	}
	if a.Hours[sparkHours-1] != 1 || a.Hours[sparkHours-2] != 2 {
		t.Errorf("hours %v: want 1 in the last hour, 2 in the one before", a.Hours)
	}
	if sum(rows[1].Hours) != 0 {
		t.Errorf("a message parked 30 h ago counts in the last 24 h: %v", rows[1].Hours)
	}
	if len(kept["aaa"]) != 3 {
		t.Errorf("%d messages kept for aaa", len(kept["aaa"]))
	}
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

func TestSparkline(t *testing.T) {
	got := string(sparkline([]int{0, 2, 4}))
	for _, piece := range []string{`<svg class="spark"`, `<rect x="4" y="10" width="3" height="10"><title>2</title>`, `<rect x="8" y="0" width="3" height="20"><title>4</title>`} {
		if !strings.Contains(got, piece) {
			t.Errorf("sparkline lacks %s:\n%s", piece, got)
		}
	}
	if strings.Contains(got, `x="0"`) {
		t.Errorf("an empty hour has a bar:\n%s", got)
	}
	if got := string(sparkline(make([]int, 24))); strings.Contains(got, "<rect") {
		t.Errorf("no parks, bars drawn: %s", got)
	}
}

func TestPreview(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("hello, compressed"))
	_ = zw.Close()
	long := strings.Repeat("é", previewLimit) // two bytes each: cut inside a rune
	tests := []struct {
		name, body, contentType, encoding string
		kind, text                        string
		truncated                         bool
	}{
		{"json indented", `{"a":[1,2]}`, "application/json; charset=utf-8", "", "json", "{\n  \"a\": [\n    1,\n    2\n  ]\n}", false},
		{"json that is not", `{"a":`, "application/json", "", "text", `{"a":`, false},
		{"vendor json", `{"a":1}`, "application/vnd.acme+json", "", "json", "{\n  \"a\": 1\n}", false},
		{"text", "plain words", "", "", "text", "plain words", false},
		{"binary", "\x00\x01\x02", "application/octet-stream", "", "binary", "00000000  00 01 02", false},
		{"gzip", gz.String(), "text/plain", "gzip", "text", "hello, compressed", false},
		{"long text cut on a rune", long, "text/plain", "", "text", strings.Repeat("é", previewLimit/2), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := preview([]byte(tt.body), tt.contentType, tt.encoding)
			if p.Kind != tt.kind || !strings.HasPrefix(p.Text, tt.text) || p.Truncated != tt.truncated || p.Bytes != len(tt.body) {
				t.Errorf("preview = %+v", p)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Second: "1", 1500 * time.Millisecond: "2", 14*time.Minute + time.Millisecond: "841"} {
		if got := retryAfter(d); got != want {
			t.Errorf("retryAfter(%s) = %s, want %s", d, got, want)
		}
	}
}

// TestReadingsEndWithTheLastSession: what the console read for a user
// (parking-queue bodies among it) goes when that user's last session ends,
// idle or signed out, and not while another of their sessions lives.
func TestReadingsEndWithTheLastSession(t *testing.T) {
	srv, err := New(Options{Logger: zap.NewNop(), IdleTimeout: time.Hour, Dial: func(context.Context, string, string, string) (*amqp.Connection, error) {
		return nil, amqp.ErrCredentials
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	t0 := time.Now()
	read := func() {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		srv.readings["ops"], srv.surveys["ops"] = &reading{user: "ops", at: t0}, &survey{}
		srv.readings["dev"] = &reading{user: "dev", at: t0}
	}
	kept := func() (ops, dev bool) {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.readings["ops"] != nil && srv.surveys["ops"] != nil, srv.readings["dev"] != nil
	}
	start := func(user string, at time.Time) *session {
		s, err := srv.sessions.start(user, "pw", "192.0.2.1", nil, at, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	start("ops", t0)
	start("ops", t0.Add(30*time.Minute))
	start("dev", t0.Add(90*time.Minute))
	read()
	srv.sessions.sweep(t0.Add(time.Hour))
	if ops, dev := kept(); !ops || !dev {
		t.Errorf("one of ops's two sessions ended idle: readings kept ops %v dev %v, want both", ops, dev)
	}
	srv.sessions.sweep(t0.Add(90 * time.Minute))
	if ops, dev := kept(); ops || !dev {
		t.Errorf("ops's last session ended idle: readings kept ops %v dev %v, want dev's only", ops, dev)
	}
	// Expired when next seen, before any sweep.
	req := httptest.NewRequest(http.MethodGet, "/groups", nil)
	for _, s := range srv.sessions.byID {
		req.AddCookie(&http.Cookie{Name: cookieName, Value: s.id})
	}
	if srv.sessions.get(req, t0.Add(3*time.Hour)) != nil {
		t.Fatal("an idle session was served")
	}
	if _, dev := kept(); dev {
		t.Error("dev's session expired when next seen: its reading kept")
	}
	// A reading that ends after its user's last session did (read while
	// the session was live, stored after it expired) is not kept.
	srv.keep("dev", func() { srv.readings["dev"] = &reading{user: "dev", at: t0} })
	if _, dev := kept(); dev {
		t.Error("a reading finished after dev's last session ended was kept")
	}
	start("dev", t0.Add(3*time.Hour))
	srv.keep("dev", func() { srv.readings["dev"] = &reading{user: "dev", at: t0} })
	if _, dev := kept(); !dev {
		t.Error("a reading of a live session was not kept")
	}
}

// TestCanaryWaitsAsLongAsThePolicyTakes: a console canary is watched as
// long as the CLI's by default (the sample policy takes 23m36s to park;
// a minute could never see a canary fail), and a longer watch than an
// hour may be asked for.
func TestCanaryWaitsAsLongAsThePolicyTakes(t *testing.T) {
	cfg, err := config.Load([]string{"REBOUND_MIN_DELAY=2s", "REBOUND_MAX_DELAY=5m", "REBOUND_MAX_RETRIES=12", "REBOUND_IMMEDIATE_RETRIES=1"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Logger: zap.NewNop(), Router: route.Router{Policies: cfg.PolicySet()},
		Dial: func(context.Context, string, string, string) (*amqp.Connection, error) {
			return nil, amqp.ErrCredentials
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	want, _ := config.CanaryWait(cfg.PolicySet(), nil)
	if want <= 23*time.Minute {
		t.Fatalf("config.CanaryWait = %s, want the sample policy's 23m36s and a minute", want)
	}
	ask := func(query string) (groupAsk, error) {
		r := httptest.NewRequest(http.MethodGet, "/groups/g/replay?"+query, nil)
		r.SetPathValue("action", "replay")
		r.SetPathValue("id", "g")
		return srv.parseGroupAsk(r)
	}
	if a, err := ask("canary=2"); err != nil || a.CanaryWait != want {
		t.Errorf("canary without a wait: %s, %v; want %s", a.CanaryWait, err, want)
	}
	if a, err := ask("canary=2&canary_wait=3h"); err != nil || a.CanaryWait != 3*time.Hour {
		t.Errorf("canary_wait=3h: %s, %v", a.CanaryWait, err)
	}
	if _, err := ask("canary=2&canary_wait=48h"); err == nil || !strings.Contains(err.Error(), "at most 1d") && !strings.Contains(err.Error(), "at most 24h") {
		t.Errorf("canary_wait=48h: %v, want refused naming the limit", err)
	}
}
