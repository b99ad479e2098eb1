// Package topology names what rebound declares on the broker: its
// exchanges and queues, their arguments, the destination of each copy, and
// the definitions and policies an operator loads. It does no I/O: what
// talks to the broker about them is internal/declarer (the fixed topology,
// whether a queue exists) and internal/delayqueue (the delay queues'
// lifecycle).
package topology

import (
	"fmt"
	"maps"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology names everything rebound declares on the broker. It is the one
// description the sidecar, `rebound topology` and `rebound parked` work
// from.
//
// Delay routing costs O(1) per copy, whatever the number of delay queues:
// each delay queue has a fanout exchange of its own (DelayExchange + "." +
// the delay in milliseconds, bound to that queue alone), and a copy is
// published there with its origin queue as routing key. When the TTL
// fires, the delay queue dead-letters the copy to the default exchange
// under that key: back into the origin queue. No exchange ever holds more
// than one binding, so routing never grows with the delay queues. A
// shared exchange does: a headers exchange evaluates every delay queue's
// binding for every copy, and a direct exchange routing the delay key
// with the origin in CC or BCC matches several routing keys, which
// RabbitMQ 3.10 does by scanning all of the exchange's bindings; full
// jitter spreads copies over hundreds of delay queues. No CC or BCC
// header is involved, so a consumer that republishes a retry with its
// headers sends it nowhere else.
type Topology struct {
	// Vhost is the virtual host the queues are in ("/" by default): what
	// tells two deployments' queues of the same name apart in metrics.
	Vhost              string
	InboxQueue         string
	DeadLetterExchange string // fanout, bound to InboxQueue
	DelayExchange      string // prefix of the delay queues' exchanges; see DelayExchangeFor
	DelayQueuePrefix   string
	ParkingQueue       string
	Quorum             bool // declare quorum queues instead of classic ones
	// DeliveryLimits says the broker limits deliveries of a quorum queue
	// by default (RabbitMQ 4.0 and later, 20), dropping a message past
	// the limit unless the queue dead-letters it; see ForServer.
	DeliveryLimits bool
	// Hold says copies wait in the hold queue (REBOUND_DELAY_MODE=hold),
	// not in delay queues; see HoldQueue.
	Hold bool
	// OriginQueues is the allowlist of the queues rebound may send
	// messages back to (REBOUND_ORIGIN_QUEUES, unanchored); nil allows
	// any. See Allows.
	OriginQueues *regexp.Regexp
}

// Allows reports whether rebound may send a message back to queue: the
// allowlist, when there is one, matches it. rebound's own queues are
// refused apart (Owns).
func (t Topology) Allows(queue string) bool {
	return t.OriginQueues == nil || t.OriginQueues.MatchString(queue)
}

// ForServer returns t for the broker that announced these connection
// properties: on RabbitMQ 4.0 and later, quorum queues have a delivery
// limit by default, and the parking queue is declared without one.
func (t Topology) ForServer(properties amqp.Table) Topology {
	v, _ := properties["version"].(string)
	t.DeliveryLimits = VersionAtLeast(v, 4, 0)
	return t
}

// VersionAtLeast reports whether version ("4.3.6") is major.minor or later.
func VersionAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	return err1 == nil && err2 == nil && (ma > major || (ma == major && mi >= minor))
}

// Exchange is one exchange rebound declares.
type Exchange struct {
	Name string
	Kind string
}

// Queue is one queue rebound declares, with its arguments.
type Queue struct {
	Name string
	Args amqp.Table
}

// Binding binds a queue to an exchange.
type Binding struct {
	Exchange string
	Queue    string
	Key      string
	Args     amqp.Table
}

// Exchanges returns the fixed exchanges rebound needs, all durable. Each
// delay queue's exchange is declared with it; see DelayExchangeFor. In
// hold mode rebound publishes nothing through the default exchange, and
// the parking queue has an exchange of its own (parkingExchange).
func (t Topology) Exchanges() []Exchange {
	exchanges := []Exchange{{Name: t.DeadLetterExchange, Kind: amqp.ExchangeFanout}}
	if t.Hold {
		exchanges = append(exchanges, t.HoldExchange(), t.parkingExchange())
	}
	return exchanges
}

// Queues returns the fixed queues rebound needs, all durable. Delay queues
// are declared on first use; see DelayQueue.
//
// Quorum queues that rebound consumes must never drop a message (RabbitMQ
// 4.x drops one past the delivery limit of a queue that does not
// dead-letter). The inbox dead-letters to the parking queue, at least
// once: a message rebound could not settle in 20 deliveries (rebound
// killed each time with it unacked) is parked by the broker, its x-death
// reason delivery_limit. The parking queue has no delivery limit on a
// broker that would impose one: `rebound parked` killed while it holds
// messages must not count against them. The third is the in-use queue of
// the replicas' leases (see InUseQueue).
func (t Topology) Queues() []Queue {
	inbox, parking := t.queueArgs(), t.queueArgs()
	if t.Quorum {
		inbox["x-dead-letter-exchange"] = ""
		inbox["x-dead-letter-routing-key"] = t.ParkingQueue
		inbox["x-dead-letter-strategy"] = "at-least-once"
		inbox[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
		if t.DeliveryLimits {
			parking["x-delivery-limit"] = int64(-1)
		}
	}
	queues := []Queue{
		{Name: t.InboxQueue, Args: inbox},
		{Name: t.ParkingQueue, Args: parking},
		{Name: t.InUseQueue(), Args: amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}},
	}
	if t.Hold {
		queues = append(queues, t.HoldQueue(), t.HoldCommandsQueue())
	}
	return queues
}

// Bindings returns the fixed bindings: the dead-letter exchange to the
// inbox, and in hold mode the hold exchange to the hold queue and the
// parking exchange to the parking queue.
func (t Topology) Bindings() []Binding {
	bindings := []Binding{{Exchange: t.DeadLetterExchange, Queue: t.InboxQueue}}
	if t.Hold {
		bindings = append(bindings,
			Binding{Exchange: t.HoldExchange().Name, Queue: t.HoldQueue().Name},
			Binding{Exchange: t.parkingExchange().Name, Queue: t.ParkingQueue})
	}
	return bindings
}

// parkingExchange is the fanout exchange bound to the parking queue
// alone, named as the queue is: parks go through it in hold mode
// (Parked), so that rebound's user needs no write on the default
// exchange, which reaches every queue of the vhost. Queues mode parks
// through the default exchange, as earlier rebounds did, so that its
// permissions stay as they were.
func (t Topology) parkingExchange() Exchange {
	return Exchange{Name: t.ParkingQueue, Kind: amqp.ExchangeFanout}
}

func (t Topology) queueArgs() amqp.Table {
	if t.Quorum {
		return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	}
	return amqp.Table{}
}

func (t Topology) delayQueueName(ms int64) string {
	return t.DelayQueuePrefix + strconv.FormatInt(ms, 10)
}

// DelayOfExchange is the delay, in milliseconds, whose exchange is name:
// false when name is not a delay queue's exchange.
func (t Topology) DelayOfExchange(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, t.DelayExchange+".")
	if !ok {
		return 0, false
	}
	ms, err := strconv.ParseInt(digits, 10, 64)
	return ms, err == nil && ms > 0
}

// DelayExchangeFor returns the exchange of the delay queue for d: a
// fanout exchange named DelayExchange + "." + the delay in milliseconds.
func (t Topology) DelayExchangeFor(d time.Duration) Exchange {
	return Exchange{Name: t.DelayExchange + "." + strconv.FormatInt(d.Milliseconds(), 10), Kind: amqp.ExchangeFanout}
}

// DelayQueue returns the queue that holds messages for delay d and its
// binding to its exchange (DelayExchangeFor). Messages expire after d and
// are dead-lettered to the default exchange under the routing key they
// were published with: the origin queue's name. There is deliberately no
// x-expires: a queue that expires is deleted with the messages it still
// holds.
func (t Topology) DelayQueue(d time.Duration) (Queue, Binding) {
	ms := d.Milliseconds()
	args := t.queueArgs()
	args[amqp.QueueMessageTTLArg] = ms
	args["x-dead-letter-exchange"] = ""
	if t.Quorum {
		// The hop back to the origin queue is confirmed inside the broker,
		// and a full delay queue refuses the publish (rebound sees a nack)
		// instead of dropping the oldest message.
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	q := Queue{Name: t.delayQueueName(ms), Args: args}
	b := Binding{Exchange: t.DelayExchangeFor(d).Name, Queue: q.Name}
	return q, b
}

// Owns reports whether queue is one of rebound's own: the inbox, the
// parking queue, a delay queue, the in-use queue, the lock or a replica's
// place (PlaceQueue). None of
// them is ever an origin: a message sent "back" to one would loop through
// rebound or slip into the parking queue unmarked.
func (t Topology) Owns(queue string) bool {
	return queue == t.InboxQueue || queue == t.ParkingQueue || t.IsDelayQueue(queue) ||
		queue == t.HoldQueue().Name || strings.HasPrefix(queue, t.HoldQueue().Name+".") ||
		queue == t.InUseQueue() || queue == t.LockQueue() || t.isPlaceQueue(queue) || queue == t.WatchQueue()
}

// isPlaceQueue reports whether queue is a replica's place (PlaceQueue).
func (t Topology) isPlaceQueue(queue string) bool {
	return numbered(queue, t.DelayQueuePrefix+"replica.")
}

// IsDelayQueue reports whether queue is one of the topology's delay queues.
func (t Topology) IsDelayQueue(queue string) bool {
	return numbered(queue, t.DelayQueuePrefix)
}

// numbered reports whether name is prefix followed by decimal digits only.
func numbered(name, prefix string) bool {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok || digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// InUseQueue is the queue of the replicas' leases of the delay queues
// (internal/delayqueue): a classic queue, since leases are few and
// short-lived, whatever REBOUND_QUEUE_TYPE says.
func (t Topology) InUseQueue() string { return t.DelayQueuePrefix + "in-use" }

// LockQueue is the exclusive queue whoever reads or deletes delay queues
// holds meanwhile (internal/delayqueue).
func (t Topology) LockQueue() string { return t.DelayQueuePrefix + "lock" }

// PlaceQueue is the exclusive queue that holds place i among the replicas
// on the inbox: each replica holds the lowest place free, for as long as
// its consuming connection lives, so that the replicas' places are 0 to
// n−1 and their shares of the retry rate budget fall in seconds of their
// own (calendar.Share).
func (t Topology) PlaceQueue(i int) string { return t.DelayQueuePrefix + "replica." + strconv.Itoa(i) }

// Describe lists what t declares, one line each, for people.
func (t Topology) Describe() []string {
	var lines []string
	for _, e := range t.Exchanges() {
		lines = append(lines, fmt.Sprintf("exchange %s (%s, durable)", e.Name, e.Kind))
	}
	for _, q := range t.Queues() {
		lines = append(lines, fmt.Sprintf("queue %s (durable%s)", q.Name, formatArgs(q.Args)))
	}
	for _, b := range t.Bindings() {
		lines = append(lines, fmt.Sprintf("binding %s -> %s", b.Exchange, b.Queue))
	}
	return lines
}

// addedArgs are the queue arguments this version of rebound declares that
// earlier ones did not: a fixed queue that lacks only these is an earlier
// rebound's, and is kept (see WithoutAdded).
var addedArgs = []string{"x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", amqp.QueueOverflowArg, "x-delivery-limit"}

// WithoutAdded returns q, one of t's fixed queues, as an earlier rebound
// declared it, without the arguments this version added, the names of
// those it lacks then, and the policy of rebound's own that applies them
// (deploy/rabbitmq/setup.sh sets it).
func (t Topology) WithoutAdded(q Queue) (legacy Queue, missing []string, policy string) {
	policy = inboxDeadLetterPolicyName
	if q.Name == t.ParkingQueue {
		policy = parkingNoDeliveryLimitPolicyName
	}
	legacy = Queue{Name: q.Name, Args: maps.Clone(q.Args)}
	for _, name := range addedArgs {
		if _, ok := legacy.Args[name]; ok {
			missing = append(missing, name)
			delete(legacy.Args, name)
		}
	}
	return legacy, missing, policy
}

func formatArgs(args amqp.Table) string {
	if len(args) == 0 {
		return ""
	}
	parts := make([]string, 0, len(args))
	for k, v := range args {
		parts = append(parts, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(parts)
	return ", " + strings.Join(parts, ", ")
}
