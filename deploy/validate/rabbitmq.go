package validate

import (
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/rebound-mq/rebound/config"
)

// Permissions are the three regular expressions of rabbitmqctl
// set_permissions.
type Permissions struct {
	Configure, Write, Read string
}

var (
	permissionLine     = regexp.MustCompile(`(?m)^(CONFIGURE|WRITE|READ)='([^']*)'$`)
	holdPermissionLine = regexp.MustCompile(`(?m)^HOLD_(CONFIGURE|WRITE|READ)='([^']*)'$`)
)

// ReadPermissions extracts CONFIGURE='...', WRITE='...' and READ='...' from
// deploy/rabbitmq/setup.sh: the permissions of queues mode.
func ReadPermissions(script []byte) (Permissions, error) {
	return readPermissions(script, permissionLine)
}

// ReadHoldPermissions extracts HOLD_CONFIGURE='...', HOLD_WRITE='...' and
// HOLD_READ='...' from deploy/rabbitmq/setup.sh: the permissions of hold
// mode.
func ReadHoldPermissions(script []byte) (Permissions, error) {
	return readPermissions(script, holdPermissionLine)
}

func readPermissions(script []byte, line *regexp.Regexp) (Permissions, error) {
	var p Permissions
	found := map[string]bool{}
	for _, m := range line.FindAllSubmatch(script, -1) {
		key, re := string(m[1]), string(m[2])
		if found[key] {
			return p, fmt.Errorf("%s set twice", key)
		}
		found[key] = true
		switch key {
		case "CONFIGURE":
			p.Configure = re
		case "WRITE":
			p.Write = re
		case "READ":
			p.Read = re
		}
	}
	if len(found) != 3 {
		return p, fmt.Errorf("want CONFIGURE, WRITE and READ lines, found %d", len(found))
	}
	return p, nil
}

var appQueuesLine = regexp.MustCompile(`(?m)^APP_QUEUES=\$\{APP_QUEUES:-'([^']*)'\}$`)

// ReadAppQueues extracts the default of APP_QUEUES, the pattern of the
// application queues the dead-letter policy applies to, from
// deploy/rabbitmq/setup.sh.
func ReadAppQueues(script []byte) (string, error) {
	m := appQueuesLine.FindAllSubmatch(script, -1)
	if len(m) != 1 {
		return "", fmt.Errorf("want one APP_QUEUES=${APP_QUEUES:-'...'} line, found %d", len(m))
	}
	return string(m[0][1]), nil
}

// CheckOriginQueues checks REBOUND_ORIGIN_QUEUES against the pattern of
// the dead-letter policy: the same, so rebound sends messages back to the
// queues that dead-letter to it and to no other, and matching none of
// rebound's own queues.
func CheckOriginQueues(c config.Config, appQueues string) []string {
	var problems []string
	if c.OriginQueues != appQueues {
		problems = append(problems, fmt.Sprintf("REBOUND_ORIGIN_QUEUES=%q, but setup.sh's dead-letter policy applies to %q: set both to the same pattern", c.OriginQueues, appQueues))
	}
	topo := c.Topology()
	for _, own := range []string{c.InboxQueue, c.ParkingQueue, c.DelayQueuePrefix + "1000"} {
		if topo.Allows(own) {
			problems = append(problems, fmt.Sprintf("REBOUND_ORIGIN_QUEUES=%q matches rebound's own queue %s", c.OriginQueues, own))
		}
	}
	// A policy for queues the allowlist refuses never decides anything:
	// their messages are parked origin-not-allowed.
	for _, p := range c.Named {
		example, ok := exampleQueue(p.Queues)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%sQUEUES=%q: no queue name to check it with (start it with ^ and a literal prefix, as ^payments\\.)", config.PolicyVariable(p.Name), p.Queues))
		case !topo.Allows(example):
			problems = append(problems, fmt.Sprintf("%sQUEUES=%q serves %s, which REBOUND_ORIGIN_QUEUES=%q refuses: its messages would be parked origin-not-allowed", config.PolicyVariable(p.Name), p.Queues, example, c.OriginQueues))
		}
	}
	return problems
}

// exampleQueue returns a queue name that pattern matches, built from its
// literal prefix, if it has one.
func exampleQueue(pattern string) (string, bool) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return "", false
	}
	prefix, _ := re.LiteralPrefix()
	if prefix == "" {
		return "", false
	}
	for _, tail := range []string{"example", "x", "0", ""} {
		if re.MatchString(prefix + tail) {
			return prefix + tail, true
		}
	}
	return "", false
}

// Access is one operation rebound performs on the broker and the
// permission RabbitMQ checks for it.
type Access struct {
	Perm     string // configure, write or read
	Resource string // exchange or queue name; amq.default is the default exchange
	Why      string
}

// Needs lists what rebound does on the broker with configuration c, as the
// permission checks RabbitMQ makes (see the RabbitMQ access control guide):
// declaring and deleting needs configure; publishing needs write on the
// exchange; binding needs write on the queue and read on the exchange;
// consuming, getting and purging need read on the queue; declaring a
// queue with a dead-letter exchange needs read on the queue and write on
// that exchange.
func Needs(c config.Config) []Access {
	topo := c.Topology()
	delays := []time.Duration{time.Second, 1200 * time.Millisecond, time.Hour}
	a := append(needsInEitherMode(c), []Access{
		{"configure", c.InboxQueue, "declare the inbox"},
		{"configure", c.ParkingQueue, "declare the parking queue"},
		{"read", c.ParkingQueue, "rebound parked: list, replay, purge"},
		{"write", "amq.default", "publish immediate retries, parked messages, replays and leases to the default exchange"},
		{"read", topo.InUseQueue(), "rebound topology prune: read the leases"},
		{"configure", topo.LockQueue(), "take and release the lock of the delay queues"},
		{"configure", topo.PlaceQueue(49), "take a replica's place among the replicas (the retry rate budget's share)"},
		{"configure", topo.WatchQueue(), "declare the watch queue, whose token elects the replica that reads the broker's counts"},
		{"read", topo.WatchQueue(), "consume the watch queue"},
	}...)
	for _, d := range delays {
		queue, _ := topo.DelayQueue(d)
		q, x := queue.Name, topo.DelayExchangeFor(d).Name
		a = append(a,
			Access{"configure", x, "declare a delay queue's exchange"},
			Access{"write", x, "publish delayed copies"},
			Access{"read", x, "bind a delay queue to its exchange"},
			Access{"configure", q, "declare a delay queue"},
			Access{"write", q, "bind a delay queue to its exchange"},
			Access{"read", q, "declare a delay queue that dead-letters to the default exchange; rebound delayed: read it"},
		)
	}
	return a
}

// NeedsHold lists what rebound does on the broker with configuration c in
// hold mode, as Needs does for queues mode. It writes nothing to the
// default exchange, declares no delay queue, and does not declare the
// queues that dead-letter to the default exchange (the hold queue, a
// quorum inbox): it checks that they exist (a passive declaration, which
// RabbitMQ 4.3 lets configure through).
func NeedsHold(c config.Config) []Access {
	topo := c.Topology()
	hold, holdExchange := topo.HoldQueue().Name, topo.HoldExchange().Name
	probe := hold + ".probe.0a1b2c3d"
	return append(needsInEitherMode(c), []Access{
		{"configure", c.InboxQueue, "declare the inbox, or check that it exists"},
		{"configure", c.ParkingQueue, "declare the parking queue and its exchange"},
		{"write", c.ParkingQueue, "publish parked messages to the parking exchange, and bind the parking queue to it"},
		{"read", c.ParkingQueue, "bind the parking queue to its exchange; rebound parked: list"},
		{"configure", topo.WatchQueue(), "declare the watch queue and its exchange"},
		{"write", topo.WatchQueue(), "publish the watch token to the watch exchange, and bind the watch queue to it"},
		{"read", topo.WatchQueue(), "consume the watch queue; bind it to its exchange"},
		{"configure", hold, "check that the hold queue exists; declare the hold exchange"},
		{"write", holdExchange, "publish copies to the hold exchange; bind the hold queue to it"},
		{"read", hold, "hold copies (consume the hold queue over AMQP 1.0); bind it to its exchange"},
		{"configure", topo.HoldCommandsQueue().Name, "declare the stream of flush and cancel commands"},
		{"read", topo.HoldCommandsQueue().Name, "read the stream of flush and cancel commands"},
		{"configure", probe, "declare the start-up probe's queue and exchange"},
		{"write", probe, "publish the probe; bind the probe's queue"},
		{"read", probe, "consume the probe; bind the probe's queue"},
	}...)
}

// needsInEitherMode lists what rebound does on the broker in both delay
// modes: receive dead-lettered messages (the dead-letter exchange, the
// inbox bound to it) and take its place among the replicas.
func needsInEitherMode(c config.Config) []Access {
	topo := c.Topology()
	return []Access{
		{"configure", c.DeadLetterExchange, "declare the dead-letter exchange"},
		{"write", c.InboxQueue, "bind the inbox to the dead-letter exchange"},
		{"read", c.DeadLetterExchange, "bind the inbox to the dead-letter exchange"},
		{"read", c.InboxQueue, "consume the inbox"},
		{"configure", topo.InUseQueue(), "declare the queue of the replicas' leases"},
		{"configure", topo.PlaceQueue(0), "take a replica's place among the replicas (the retry rate budget's share)"},
	}
}

// CheckHoldPermissions checks that p allows everything NeedsHold(c) lists,
// no write on the default exchange, and nothing on names rebound does not
// own.
func CheckHoldPermissions(p Permissions, c config.Config) []string {
	problems := checkPermissions(p, c, NeedsHold(c))
	if r, err := regexp.Compile(p.Write); err == nil && r.MatchString("amq.default") {
		problems = append(problems, fmt.Sprintf("write regex %q allows amq.default, which hold mode does without: it reaches every queue of the vhost", p.Write))
	}
	return problems
}

// CheckPermissions checks that p allows everything Needs(c) lists and
// nothing on names rebound does not own: application queues, other
// exchanges, lookalike names.
func CheckPermissions(p Permissions, c config.Config) []string {
	return checkPermissions(p, c, Needs(c))
}

func checkPermissions(p Permissions, c config.Config, needs []Access) []string {
	var problems []string
	res := map[string]*regexp.Regexp{}
	for perm, re := range map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read} {
		// RabbitMQ uses Erlang's re (PCRE); these patterns use only the
		// syntax PCRE and Go's RE2 share.
		r, err := regexp.Compile(re)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s regex %q: %v", perm, re, err))
			continue
		}
		res[perm] = r
	}
	if len(problems) > 0 {
		return problems
	}
	for _, a := range needs {
		if !res[a.Perm].MatchString(a.Resource) {
			problems = append(problems, fmt.Sprintf("%s %q is not allowed, but rebound needs it to %s", a.Perm, a.Resource, a.Why))
		}
	}
	foreign := []string{
		"orders", "orders.created", "amq.topic", "amq.direct",
		c.InboxQueue + "x", "x" + c.InboxQueue, c.DelayQueuePrefix + "abc", c.DelayQueuePrefix,
		c.DeadLetterExchange + ".extra", c.ParkingQueue + "2", c.DelayQueuePrefix + "lock.x", c.DelayQueuePrefix + "in-use2", c.DelayQueuePrefix + "watch2",
		c.DelayQueuePrefix + "replica.", c.DelayQueuePrefix + "replica.x",
	}
	for perm, r := range res {
		for _, name := range foreign {
			if r.MatchString(name) {
				problems = append(problems, fmt.Sprintf("%s regex %q also allows %q, which is not rebound's", perm, r, name))
			}
		}
	}
	slices.Sort(problems) // map order above is random
	return problems
}
