package parking

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/rebound-mq/rebound/headers"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/declarer"
	"github.com/rebound-mq/rebound/internal/group"
	"github.com/rebound-mq/rebound/internal/route"
	"github.com/rebound-mq/rebound/policy"
)

// The harness of the package's broker tests: one test's parking queue,
// declared as rebound declares it, seeded with messages as rebound parks
// them.

// env is one test's rebound topology on the broker under test and the
// Queue the operations run on. Every queue and exchange it declares
// starts with prefix and is deleted at cleanup.
type env struct {
	*brokertest.Deployment
	t *testing.T
	q Queue
}

func newEnv(t *testing.T, quorum bool) *env {
	t.Helper()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, nil, nil)
	topo := d.Topology(quorum)
	router := route.Router{Topology: topo, Policies: policy.NewSet(testPolicy), Codec: headers.NewCodec(headers.DefaultNames())}
	e := &env{Deployment: d, t: t, q: Queue{Conn: b.Dial(t, b.URL), Router: router}}
	if _, err := declarer.Declare(e.q.Conn, topo); err != nil {
		t.Fatal(err)
	}
	return e
}

// testPolicy is the deployment's one policy, the one seeded messages say
// parked them.
var testPolicy = policy.Policy{Backoff: policy.Constant, MinDelay: time.Second, MaxDelay: time.Second, Jitter: policy.NoJitter, MaxRetries: 3, Deadline: "clamp"}

// queue declares a durable queue named prefix + suffix with args.
func (e *env) queue(suffix string, args amqp.Table) string {
	e.t.Helper()
	name := e.Prefix + suffix
	e.Declare(name, args)
	return name
}

// parked is a message to seed into the parking queue.
type parked struct {
	id      string
	origin  string // "" for unknown
	reason  policy.Reason
	age     time.Duration // parked this long before now
	retries int
	errText string // the consumer's error header; "" for none
	// errAt is the retry count errText was reported at when it is not the
	// failure that parked the message (stale): then the group is the
	// origin's and reason's. 0 with stale false: reported with it.
	errAt  int
	stale  bool
	legacy bool // parked by a rebound before groups: no group header, no stamp
}

// seed parks the messages as the sidecar does: headers written by
// Codec.Park, published to the parking queue and confirmed.
func (e *env) seed(now time.Time, ps ...parked) {
	e.t.Helper()
	c := e.q.Router.Codec
	msgs := make([]amqp.Publishing, 0, len(ps))
	for _, p := range ps {
		at := now.Add(-p.age)
		s := headers.State{
			State:  policy.State{Retries: p.retries, StartedAt: at.Add(-time.Hour), LastDelay: time.Second},
			Origin: p.origin, FirstDeathReason: "rejected", FirstDeathQueue: p.origin,
			Policy: e.q.Router.Policies.Default().Label(),
		}
		h := amqp.Table{"tenant": "acme"}
		if p.errText != "" {
			h[c.Names.Error] = p.errText
			s.Error, s.ErrorCurrent = p.errText, !p.stale && !p.legacy
			if p.stale {
				h[c.Names.ErrorRetry] = int64(p.errAt)
				s.ErrorRetry, s.ErrorStamped = p.errAt, true
			}
		}
		if !p.legacy {
			reported := p.errText
			if p.stale {
				reported = ""
			}
			s.Group = group.Of(p.origin, reported, string(p.reason))
		}
		msgs = append(msgs, amqp.Publishing{
			MessageId: p.id, ContentType: "text/plain", DeliveryMode: amqp.Persistent,
			Headers: c.Park(h, s, p.reason, at), Body: []byte("body of " + p.id),
		})
	}
	brokertest.PublishConfirmed(e.t, e.Ch, e.q.Name(), msgs...)
}

// park parks n messages of the application queue at at, for max-retries
// after 10 retries: ids prefix0, prefix1, ...
func (e *env) park(prefix string, n int, at time.Time) {
	e.t.Helper()
	ps := make([]parked, n)
	for i := range ps {
		ps[i] = parked{id: fmt.Sprint(prefix, i), origin: e.App, reason: policy.MaxRetries, retries: 10}
	}
	e.seed(at, ps...)
}

// settled waits up to 10s until the broker reports n messages in the
// parking queue. The operations read as many messages as the first read
// says the queue holds, and a quorum queue hands the messages an operation
// returned back a moment after it returns (see
// TestOperationRightAfterAnotherReadsEveryMessage): a test waits for the
// count before its next operation.
func (e *env) settled(n int) {
	e.t.Helper()
	e.WaitQueueLen(e.q.Name(), n, 10*time.Second)
}

// parkedIDs lists the ids in the parking queue, which must hold n
// messages, sorted, leaving it as it is.
func (e *env) parkedIDs(now time.Time, n int) []string {
	e.t.Helper()
	e.settled(n)
	l, err := e.q.List(context.Background(), Filter{}, now)
	if err != nil {
		e.t.Fatal(err)
	}
	return ids(l.Messages)
}

// wantParked checks that the parking queue holds exactly the messages
// ids, given sorted, and leaves it as it is; when says at what point.
func (e *env) wantParked(now time.Time, when string, ids ...string) {
	e.t.Helper()
	if got := e.parkedIDs(now, len(ids)); !slices.Equal(got, ids) {
		e.t.Errorf("%s: %v parked, want %v", when, got, ids)
	}
}

func ids(ms []Message) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.ID())
	}
	slices.Sort(out)
	return out
}

// kept returns why each message a replay left parked was kept, by id.
func kept(res ReplayResult) map[string]string {
	out := map[string]string{}
	for _, k := range res.Kept {
		out[k.Message.ID()] = k.Why
	}
	return out
}

// replay is ReplayWith with no pacing and no record.
func (q Queue) replay(ctx context.Context, f Filter, now time.Time, dryRun bool) (res ReplayResult, err error) {
	return q.ReplayWith(ctx, f, now, ReplayOptions{DryRun: dryRun})
}

// groupMessages lists the messages of one failure group, at most limit (0:
// all), leaving them parked: what a page that opens a group shows.
func (q Queue) groupMessages(ctx context.Context, id string, limit int, now time.Time) (listing, error) {
	return q.List(ctx, Filter{Group: id, Limit: limit}, now)
}
