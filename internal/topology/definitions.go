package topology

import (
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// definitions is a RabbitMQ definitions document, the JSON that
// `rabbitmqctl import_definitions` and the management API load. It holds
// only the parts rebound needs; RabbitMQ imports it into the virtual host
// named in each entry.
type definitions struct {
	Exchanges []exchangeDefinition `json:"exchanges"`
	Queues    []queueDefinition    `json:"queues"`
	Bindings  []bindingDefinition  `json:"bindings"`
	Policies  []policyDefinition   `json:"policies"`
}

// exchangeDefinition is one exchange in a definitions document.
type exchangeDefinition struct {
	Name       string     `json:"name"`
	VHost      string     `json:"vhost"`
	Type       string     `json:"type"`
	Durable    bool       `json:"durable"`
	AutoDelete bool       `json:"auto_delete"`
	Internal   bool       `json:"internal"`
	Arguments  amqp.Table `json:"arguments"`
}

// queueDefinition is one queue in a definitions document.
type queueDefinition struct {
	Name       string     `json:"name"`
	VHost      string     `json:"vhost"`
	Durable    bool       `json:"durable"`
	AutoDelete bool       `json:"auto_delete"`
	Arguments  amqp.Table `json:"arguments"`
}

// bindingDefinition is one binding of a queue to an exchange.
type bindingDefinition struct {
	Source          string     `json:"source"`
	VHost           string     `json:"vhost"`
	Destination     string     `json:"destination"`
	DestinationType string     `json:"destination_type"`
	RoutingKey      string     `json:"routing_key"`
	Arguments       amqp.Table `json:"arguments"`
}

// policyDefinition is one policy in a definitions document.
type policyDefinition struct {
	VHost      string     `json:"vhost"`
	Name       string     `json:"name"`
	Pattern    string     `json:"pattern"`
	ApplyTo    string     `json:"apply-to"`
	Definition amqp.Table `json:"definition"`
	Priority   int        `json:"priority"`
}

// Definitions describes the topology in vhost as a definitions document:
// the exchanges, fixed queues and bindings Declare declares (all durable,
// same arguments). Delay queues are declared by the sidecar on first use,
// since with jitter the set of delays is not known in advance.
//
// Policies is empty: see DeadLetterPolicy for the application queues,
// which are the operator's, and Policies for rebound's own.
func (t Topology) Definitions(vhost string) definitions {
	defs := definitions{
		Exchanges: []exchangeDefinition{},
		Queues:    []queueDefinition{},
		Bindings:  []bindingDefinition{},
		Policies:  []policyDefinition{},
	}
	for _, e := range t.Exchanges() {
		defs.Exchanges = append(defs.Exchanges, exchangeDefinition{
			Name: e.Name, VHost: vhost, Type: e.Kind, Durable: true, Arguments: amqp.Table{},
		})
	}
	queue := func(q Queue) {
		defs.Queues = append(defs.Queues, queueDefinition{Name: q.Name, VHost: vhost, Durable: true, Arguments: nonNil(q.Args)})
	}
	binding := func(b Binding) {
		defs.Bindings = append(defs.Bindings, bindingDefinition{
			Source: b.Exchange, VHost: vhost, Destination: b.Queue, DestinationType: "queue",
			RoutingKey: b.Key, Arguments: nonNil(b.Args),
		})
	}
	for _, q := range t.Queues() {
		queue(q)
	}
	for _, b := range t.Bindings() {
		binding(b)
	}
	return defs
}

// DeadLetterPolicy returns a policy that makes every queue of vhost whose
// name matches pattern dead-letter to the topology's dead-letter exchange:
// the one setting application queues need to use rebound, without
// redeclaring them with an x-dead-letter-exchange argument (an argument
// set on the queue takes precedence over the policy).
func (t Topology) DeadLetterPolicy(vhost, name, pattern string) policyDefinition {
	return policyDefinition{
		VHost: vhost, Name: name, Pattern: pattern, ApplyTo: "queues",
		Definition: amqp.Table{"dead-letter-exchange": t.DeadLetterExchange}, Priority: policyPriority,
	}
}

// policyPriority is the priority of rebound's policies, as
// deploy/rabbitmq/setup.sh sets them: only the matching policy with the
// highest priority applies to a queue, and loading these after running the
// script must not lower it.
const policyPriority = 10

// lazyDelayQueuePolicy returns a policy that runs the topology's delay
// queues in lazy mode. Before RabbitMQ 3.12 a classic queue keeps its
// messages in memory unless it is lazy, and a delay queue holds every
// message for its whole delay: a large one stalls now and then, and the
// retries in it come back late. 3.12 and later ignore the mode, as quorum
// queues do. It is a policy because declaring an existing queue again with
// other arguments fails: the delay queues a deployment already has could
// not be changed.
func (t Topology) lazyDelayQueuePolicy(vhost, name string) policyDefinition {
	return policyDefinition{
		VHost: vhost, Name: name, Pattern: "^" + regexp.QuoteMeta(t.DelayQueuePrefix) + "[0-9]+$", ApplyTo: "queues",
		Definition: amqp.Table{"queue-mode": "lazy"}, Priority: policyPriority,
	}
}

// Names of rebound's own policies, as deploy/rabbitmq/setup.sh sets them.
const (
	lazyDelayQueuePolicyName         = "rebound-delay-queues-lazy"
	inboxDeadLetterPolicyName        = "rebound-inbox-dead-letter"
	parkingNoDeliveryLimitPolicyName = "rebound-parked-no-delivery-limit"
)

// Policies returns the policies rebound's own queues need in vhost:
//
//   - with classic queues, lazyDelayQueuePolicy;
//   - with quorum queues, one that makes the inbox dead-letter to the
//     parking queue, and on RabbitMQ 4.0 and later one that lifts the
//     parking queue's delivery limit: what Queues declares as arguments,
//     for the queues an earlier rebound declared without them (arguments
//     cannot be added to an existing queue, policies can; an argument
//     wins over a policy, so they change nothing for queues declared with
//     them). RabbitMQ 3.x refuses a delivery limit of -1 in a policy.
func (t Topology) Policies(vhost string) []policyDefinition {
	if !t.Quorum {
		return []policyDefinition{t.lazyDelayQueuePolicy(vhost, lazyDelayQueuePolicyName)}
	}
	queues := t.Queues()
	policies := []policyDefinition{t.argumentPolicy(vhost, inboxDeadLetterPolicyName, queues[0])}
	if t.DeliveryLimits {
		policies = append(policies, t.argumentPolicy(vhost, parkingNoDeliveryLimitPolicyName, queues[1]))
	}
	return policies
}

// argumentPolicy is a policy for exactly queue q that sets what its
// declaration's added arguments set.
func (t Topology) argumentPolicy(vhost, name string, q Queue) policyDefinition {
	def := amqp.Table{}
	for _, arg := range addedArgs {
		if v, ok := q.Args[arg]; ok {
			def[strings.TrimPrefix(arg, "x-")] = v
		}
	}
	return policyDefinition{
		VHost: vhost, Name: name, Pattern: "^" + regexp.QuoteMeta(q.Name) + "$", ApplyTo: "queues",
		Definition: def, Priority: policyPriority,
	}
}

func nonNil(t amqp.Table) amqp.Table {
	if t == nil {
		return amqp.Table{}
	}
	return t
}
