package consumer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rebound-mq/rebound/config"
	"github.com/rebound-mq/rebound/internal/brokertest"
	"github.com/rebound-mq/rebound/internal/dialer"
	"github.com/rebound-mq/rebound/internal/topology"
	"github.com/rebound-mq/rebound/policy"
)

// The harness of the package's broker tests: one test's rebound
// deployment on the broker under test, a Sidecar run in-process on it, and
// the test's own view of queues, metrics and logs.

// env is one test's rebound deployment. Every queue and exchange it
// declares, or the sidecar declares for it, starts with prefix and is
// deleted at cleanup.
type env struct {
	*brokertest.Deployment
	t      *testing.T
	b      *brokertest.Broker
	prefix string
	vars   map[string]string
	topo   topology.Topology
	app    string // an application queue dead-lettering to rebound

	reg  *prometheus.Registry
	m    *Metrics
	logs *observer.ObservedLogs
}

// newEnv requires the broker under test and declares the deployment's
// dead-letter exchange and application queue, as an application team
// does. queueType is what rebound declares: classic or quorum.
func newEnv(t *testing.T, queueType string) *env {
	t.Helper()
	b := brokertest.Require(t)
	d := brokertest.NewDeployment(t, b, map[string]string{
		"REBOUND_QUEUE_TYPE":       queueType,
		"REBOUND_BACKOFF":          "constant",
		"REBOUND_MIN_DELAY":        "50ms",
		"REBOUND_JITTER":           "none",
		"REBOUND_MAX_RETRIES":      "2",
		"REBOUND_PREFETCH":         "32",
		"REBOUND_CONFIRM_TIMEOUT":  "10s",
		"REBOUND_SHUTDOWN_GRACE":   "5s",
		"REBOUND_DELAY_QUEUE_IDLE": "0",
	}, nil)
	return &env{Deployment: d, t: t, b: b, prefix: d.Prefix, vars: d.Vars, topo: d.Topology(queueType == "quorum"), app: d.App, reg: prometheus.NewRegistry()}
}

// options returns the Options `rebound run` would build from the env's
// variables, with vars (name, value, ...) overriding them, metrics on the
// env's registry (registered once per env) and every log line observed.
// Reconnecting waits 50ms.
func (e *env) options(vars ...string) Options {
	e.t.Helper()
	for i := 0; i+1 < len(vars); i += 2 {
		e.vars[vars[i]] = vars[i+1]
	}
	cfg, err := config.Load(e.Environ())
	if err != nil {
		e.t.Fatal(err)
	}
	e.topo = cfg.Topology()
	core, logs := observer.New(zap.DebugLevel)
	e.logs = logs
	opt := OptionsFrom(cfg, dialer.New(cfg.BrokerURLs(), nil, dialer.Client{Name: "rebound test"}), zap.New(core), nil)
	if e.m == nil {
		e.m = NewMetrics(e.reg, opt.Router)
	}
	opt.Metrics = e.m
	opt.Reconnect = policy.Policy{Backoff: policy.Constant, MinDelay: 50 * time.Millisecond, MaxDelay: 50 * time.Millisecond,
		Jitter: policy.NoJitter, Deadline: policy.Lenient}
	return opt
}

// run runs a Sidecar with opt until the test ends, or until stop, which
// returns what Run returned. The sidecar's logs are shown if the test
// fails.
func (e *env) run(opt Options) (s *Sidecar, stop func() error) {
	e.t.Helper()
	s = New(opt)
	_, stop = brokertest.RunInBackground("Run", s.Run, 30*time.Second)
	logs := e.logs
	e.t.Cleanup(func() {
		if err := stop(); err != nil {
			e.t.Errorf("Run: %v", err)
		}
		if e.t.Failed() && logs != nil {
			for _, l := range logs.All() {
				e.t.Logf("sidecar log: %s %s %v", l.Level, l.Message, l.ContextMap())
			}
		}
	})
	return s, stop
}

// start is run, once the sidecar is ready. Getting ready declares the
// topology, which on a loaded 2-core machine took RabbitMQ 3.10 over 15s
// for quorum queues (a fresh clone's CI), hence the longer wait.
func (e *env) start(opt Options) (s *Sidecar, stop func() error) {
	e.t.Helper()
	s, stop = e.run(opt)
	e.within(time.Minute, "the sidecar is ready", s.Ready)
	return s, stop
}

// eventually waits up to 15s for cond.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	e.within(15*time.Second, what, cond)
}

// within waits up to limit for cond.
func (e *env) within(limit time.Duration, what string, cond func() bool) {
	e.t.Helper()
	if !brokertest.Await(limit, cond) {
		e.t.Fatalf("not after %s: %s", limit, what)
	}
}

// get waits up to 15s for a message in queue and takes it, unacked.
func (e *env) get(queue string) amqp.Delivery { return e.Get(queue, 15*time.Second) }

// take is get, acking the message.
func (e *env) take(queue string) amqp.Delivery {
	e.t.Helper()
	d := e.get(queue)
	if err := d.Ack(false); err != nil {
		e.t.Fatal(err)
	}
	return d
}

// reject takes the next message of queue and rejects it without requeue,
// as a failing consumer does: the broker dead-letters it to rebound.
func (e *env) reject(queue string) amqp.Delivery { return e.Reject(queue, 15*time.Second) }

// drain takes every message queue holds now, by message id.
func (e *env) drain(queue string) map[string]amqp.Delivery {
	e.t.Helper()
	out := map[string]amqp.Delivery{}
	for _, d := range e.Drain(queue) {
		out[d.MessageId] = d
	}
	return out
}

// metric returns the value of the series name{labels} on the env's
// registry: a counter's or gauge's value, a histogram's sample count. It
// fails the test when there is no such series. labels are name, value
// pairs.
func (e *env) metric(name string, labels ...string) float64 {
	e.t.Helper()
	return metricValue(e.t, e.reg, name, labels...)
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	values := matching(t, reg, name, labels...)
	if len(values) == 0 {
		t.Fatalf("no series %s%v", name, labels)
	}
	// The sum over the series that match: labels left out (the origin,
	// on by default) are summed over, as a PromQL sum would.
	var sum float64
	for _, v := range values {
		sum += v
	}
	return sum
}

// matching returns the values of the series of name on reg whose labels
// include labels (name, value pairs): a counter's or gauge's value, a
// histogram's sample count.
func matching(t *testing.T, reg *prometheus.Registry, name string, labels ...string) []float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				out = append(out, m.GetCounter().GetValue())
			case m.GetGauge() != nil:
				out = append(out, m.GetGauge().GetValue())
			case m.GetHistogram() != nil:
				out = append(out, float64(m.GetHistogram().GetSampleCount()))
			}
		}
	}
	return out
}

// logged returns the log entries with message msg.
func (e *env) logged(msg string) []observer.LoggedEntry {
	return e.logs.FilterMessage(msg).All()
}

// loggedFor returns the log entries with message msg about message id.
func (e *env) loggedFor(msg, id string) []observer.LoggedEntry {
	return e.logs.FilterMessage(msg).FilterField(zap.String("message_id", id)).All()
}
