#!/usr/bin/env bash
# What rebound needs from RabbitMQ, as rabbitmqctl commands: a user limited
# to rebound's own names, a policy that sends the application queues'
# rejected messages to rebound, and one that runs rebound's delay queues in
# lazy mode (which matters before RabbitMQ 3.12). Run against the broker
# (rabbitmqctl talks to the local node; set RABBITMQCTL="rabbitmqctl -n
# rabbit@host" for another), or read it as a recipe. Idempotent: each
# command may run again.
#
# The regular expressions below assume rebound's default names
# (REBOUND_INBOX_QUEUE, REBOUND_DEAD_LETTER_EXCHANGE, REBOUND_DELAY_EXCHANGE,
# REBOUND_DELAY_QUEUE_PREFIX, REBOUND_PARKING_QUEUE). Change them together
# with those variables. deploy/validate checks them against the names in
# deploy/kustomize/components/sidecar/rebound.env.
set -euo pipefail

# The command that runs rabbitmqctl, split on spaces.
read -r -a RABBITMQCTL <<<"${RABBITMQCTL:-rabbitmqctl}"
# command: the function's own name would otherwise call itself.
rabbitmqctl() { command "${RABBITMQCTL[@]}" "$@"; }

VHOST=${VHOST:-orders}
REBOUND_USER=${REBOUND_USER:-orders-rebound}
# Application queues whose rejected messages rebound retries: every
# service's queues on the vhost. rebound's REBOUND_ORIGIN_QUEUES is the same
# pattern (deploy/kustomize/components/sidecar/rebound.env; deploy/validate
# checks that they agree, and that every REBOUND_POLICY_<NAME>_QUEUES lies
# within it): rebound then sends messages back to these queues only.
# `rebound topology print` writes the same policy from rebound's own
# configuration.
APP_QUEUES=${APP_QUEUES:-'^(orders|payments)\.'}
# rebound's REBOUND_QUEUE_TYPE: classic or quorum.
QUEUE_TYPE=${QUEUE_TYPE:-classic}
# rebound's REBOUND_DELAY_MODE: queues, or hold (RabbitMQ 4.3+), which
# runs rebound with less: no write on the default exchange (see below).
DELAY_MODE=${DELAY_MODE:-queues}
# Where the script writes, in hold mode, the definitions rabbitmqctl
# imports: a directory rabbitmqctl reads at the same path.
DEFINITIONS_DIR=${DEFINITIONS_DIR:-${TMPDIR:-/tmp}}

# --- Permissions -----------------------------------------------------------
# RabbitMQ checks three regular expressions per user and vhost against the
# name of the exchange or queue an operation touches:
#   configure  declare and delete (exchange.declare, queue.declare, queue.delete)
#   write      publish to an exchange; be the destination of a binding (queue.bind)
#   read       consume from, get from or purge a queue; be the source of a binding
# Dead-lettering is done by the broker itself and needs no permission.

# configure: rebound declares its exchanges and its queues (queue.delete,
# for removing idle delay queues, needs the same). rebound.delay.<n> names
# both a per-delay TTL queue (delay in milliseconds) and its fanout
# exchange, declared on first use. rebound.delay.in-use holds the replicas'
# leases of the delay queues they use, and rebound.delay.lock is the
# exclusive queue held by whoever reads or deletes delay queues (`rebound
# delayed flush|cancel`, `rebound topology prune`, a replica's sweep).
# rebound.delay.replica.<n> are the exclusive queues that give each replica
# on the inbox its place, so that the replicas' shares of the retry rate
# budget fall in seconds of their own.
# rebound.delay alone is the shared headers exchange of earlier rebound
# versions: older replicas still use it during a rolling upgrade (drop it
# from the three patterns once none is left). rebound.delay.hold names the
# hold queue of REBOUND_DELAY_MODE=hold (RabbitMQ 4.3) and its fanout
# exchange, rebound.delay.hold.commands the stream of flush and cancel
# commands, rebound.delay.hold.probe.<hex> the queue and exchange that
# probe the broker for holding at start; in queues mode every replica still
# checks (passively) for a hold queue to drain, which RabbitMQ 4.2.6 and
# later refuse without configure on it. The application queues are not
# rebound's to declare.
CONFIGURE='^rebound\.(dlx|delay|inbox|parked|delay\.[0-9]+|delay\.in-use|delay\.lock|delay\.replica\.[0-9]+|delay\.watch|delay\.hold|delay\.hold\.commands|delay\.hold\.probe\.[0-9a-f]+)$'

# write: rebound publishes delayed copies to the delay queues' exchanges
# (rebound.delay.<n>), and immediate retries and parked messages to the
# default exchange, whose name for permissions is amq.default (routing key
# = the target queue). The delay queues dead-letter to the default
# exchange, and declaring them needs write on it too. Binding rebound.inbox
# to rebound.dlx and each delay queue to its exchange needs write on those
# queues. Note: write on amq.default lets rebound publish to any queue of
# the vhost by name; that is how it sends a message back to its origin
# queue, whatever that queue is called.
# In hold mode: the hold exchange, the parking exchange (rebound.parked) and
# the watch exchange (rebound.delay.watch), and binding the hold, parking and
# watch queues to them (and the probe's queue to its exchange).
WRITE='^(amq\.default|rebound\.delay|rebound\.inbox|rebound\.parked|rebound\.delay\.[0-9]+|rebound\.delay\.watch|rebound\.delay\.hold|rebound\.delay\.hold\.probe\.[0-9a-f]+)$'

# read: rebound consumes rebound.inbox; `rebound parked` lists, replays and
# purges rebound.parked; binding needs read on the source exchanges
# rebound.dlx and rebound.delay.<n>. The delay queues too: declaring a
# queue with a dead-letter exchange (theirs is the default exchange) needs
# read on the queue and write on that exchange, checked at declaration,
# and `rebound delayed flush|cancel` reads them. `rebound topology prune`
# reads the leases in rebound.delay.in-use. Nothing else: rebound never
# consumes an application queue.
# In hold mode the holders consume the hold queue and read the commands
# stream.
READ='^rebound\.(dlx|delay|inbox|parked|delay\.[0-9]+|delay\.in-use|delay\.watch|delay\.hold|delay\.hold\.commands|delay\.hold\.probe\.[0-9a-f]+)$'

# In hold mode (REBOUND_DELAY_MODE=hold) rebound writes nothing to the
# default exchange: copies reach their origin by the broker's
# dead-lettering from the hold queue, immediate retries go through the
# hold queue due now, parks through an exchange of the parking queue's
# own (rebound.parked, a fanout bound to that queue alone), the watch
# token through the watch queue's (rebound.delay.watch). So rebound's user
# gets no write on amq.default, and a message whose headers name a queue
# gives it nothing to write there with. Nor does it use delay queues,
# their lock or leases. What it cannot declare itself then: a queue that
# dead-letters to the default exchange (the hold queue; a quorum inbox),
# since RabbitMQ checks write on the dead-letter exchange at declaration.
# This script declares them (at the end); rebound checks they exist.
# Switching a deployment from queues to hold: keep the queues-mode
# permissions until the delay queues are empty (`rebound delayed`).
HOLD_CONFIGURE='^rebound\.(dlx|inbox|parked|delay\.in-use|delay\.replica\.[0-9]+|delay\.watch|delay\.hold|delay\.hold\.commands|delay\.hold\.probe\.[0-9a-f]+)$'
# write: publish to the hold exchange, the parking exchange, the watch
# exchange and the probe's; bind the inbox, the hold queue, the parking
# queue, the watch queue and the probe's queue to theirs.
HOLD_WRITE='^rebound\.(inbox|parked|delay\.watch|delay\.hold|delay\.hold\.probe\.[0-9a-f]+)$'
# read: consume the inbox, the watch queue, the hold queue (over AMQP 1.0)
# and its commands stream; be the source of those bindings; `rebound
# parked` reads the parking queue.
HOLD_READ='^rebound\.(dlx|inbox|parked|delay\.watch|delay\.hold|delay\.hold\.commands|delay\.hold\.probe\.[0-9a-f]+)$'
case "$DELAY_MODE" in
  queues) ;;
  hold) CONFIGURE=$HOLD_CONFIGURE WRITE=$HOLD_WRITE READ=$HOLD_READ ;;
  *) echo "DELAY_MODE=$DELAY_MODE: want queues or hold" >&2; exit 2 ;;
esac

if ! rabbitmqctl -q list_users | awk '{print $1}' | grep -qx -- "$REBOUND_USER"; then
  # Prompts for nothing: the password comes from REBOUND_PASSWORD. Put the
  # resulting amqp(s)://user:password@host/vhost URL in the rebound-amqp
  # Secret (key url).
  rabbitmqctl add_user "$REBOUND_USER" "${REBOUND_PASSWORD:?set REBOUND_PASSWORD}"
fi
# No tags: rebound needs no management UI or HTTP API access.
rabbitmqctl set_user_tags "$REBOUND_USER"
rabbitmqctl set_permissions -p "$VHOST" "$REBOUND_USER" "$CONFIGURE" "$WRITE" "$READ"

# --- Dead-lettering application queues to rebound --------------------------
# A policy adds dead-letter-exchange = rebound.dlx to every queue whose name
# matches APP_QUEUES, existing and future, without redeclaring them.
# Rejected (requeue=false) and expired messages then go to rebound.
#
# - Only one policy applies to a queue: the matching one with the highest
#   priority. If these queues already have a policy (max-length, queue
#   limits, ...), add "dead-letter-exchange" to that policy's definition
#   instead of adding this one, or this one replaces it (or loses to it).
# - A queue argument wins over a policy: a queue declared with its own
#   x-dead-letter-exchange keeps it. Set x-dead-letter-exchange=rebound.dlx
#   in the application's declaration instead, or remove the argument.
# - Leave dead-letter-routing-key unset: rebound finds the origin queue from
#   the x-death header, not from the routing key.
# - The pattern must never match rebound's own queues (rebound.*).
rabbitmqctl set_policy -p "$VHOST" --apply-to queues --priority 10 \
  rebound-dead-letter "$APP_QUEUES" '{"dead-letter-exchange":"rebound.dlx"}'

# --- Delay queues in lazy mode (classic queues, RabbitMQ before 3.12) ------
# A delay queue holds every message for its whole delay: 1 000 failures a
# second with a 1 h delay is 3.6 million messages in one queue. Before 3.12
# a classic queue keeps its messages in its process's memory unless it runs
# in lazy mode, and a large one stalls now and then, so the retries it holds
# come back late (see docs/BENCHMARKS.md, Delay accuracy: a 60 s delay under
# 1 000 msg/s). RabbitMQ 3.12 and later ignore the mode, since their classic
# queues keep only a few messages in memory anyway, and so do quorum delay
# queues (REBOUND_QUEUE_TYPE=quorum).
#
# - A policy, not a queue argument: a queue.declare whose arguments differ
#   from the existing queue's fails, so an argument could not be changed on
#   the delay queues a running deployment already has; a policy can.
# - Only one policy applies to a queue, as above, both ways: a policy of
#   higher priority that matches the delay queues keeps them from being
#   lazy, and this one replaces any of lower priority that matched them
#   before (classic mirroring with ha-mode, length limits, ...). If one
#   matches them, add "queue-mode":"lazy" to it instead of adding this one.
if [ "$QUEUE_TYPE" = classic ]; then
  rabbitmqctl set_policy -p "$VHOST" --apply-to queues --priority 10 \
    rebound-delay-queues-lazy '^rebound\.delay\.[0-9]+$' '{"queue-mode":"lazy"}'
fi

# --- Quorum queues: nothing rebound consumes may drop a message ------------
# Since RabbitMQ 4.0 a quorum queue limits deliveries (20 by default): a
# message delivered that often without being settled (a consumer killed,
# again and again, while holding it) is dead-lettered, or dropped when the
# queue does not dead-letter. rebound declares its quorum inbox dead-lettering
# to its parking queue, at least once (the message is parked, its x-death
# reason delivery_limit, and `rebound parked list` shows it as
# delivery-limit), and its parking queue without a limit on 4.x. A queue's
# arguments cannot change once it exists: these policies give the same to
# queues an earlier rebound declared. On queues declared with the arguments
# they change nothing (an argument wins over a policy). The same caveat as
# above applies: only one policy applies to a queue.
if [ "$QUEUE_TYPE" = quorum ]; then
  rabbitmqctl set_policy -p "$VHOST" --apply-to queues --priority 10 \
    rebound-inbox-dead-letter '^rebound\.inbox$' \
    '{"dead-letter-exchange":"","dead-letter-routing-key":"rebound.parked","dead-letter-strategy":"at-least-once","overflow":"reject-publish"}'
  # RabbitMQ 3.x has no default limit, and refuses -1 in a policy.
  version=$(rabbitmqctl -q status --formatter json | grep -o '"rabbitmq_version":"[^"]*"' | cut -d'"' -f4)
  if [ "${version%%.*}" -ge 4 ] 2>/dev/null; then
    rabbitmqctl set_policy -p "$VHOST" --apply-to queues --priority 10 \
      rebound-parked-no-delivery-limit '^rebound\.parked$' '{"delivery-limit":-1}'
  fi
fi

# --- Hold mode: the queues rebound may not declare itself ------------------
# The hold queue, and with quorum queues the inbox, dead-letter to the
# default exchange; rebound's hold-mode user has no write there, which
# RabbitMQ wants for declaring them. They are declared here, with the
# arguments rebound gives them (`rebound topology print` lists the same),
# from a definitions file. rebound declares the rest itself.
if [ "$DELAY_MODE" = hold ]; then
  inbox=''
  if [ "$QUEUE_TYPE" = quorum ]; then
    inbox=',{"name":"rebound.inbox","vhost":"'"$VHOST"'","durable":true,"auto_delete":false,"arguments":{"x-queue-type":"quorum","x-dead-letter-exchange":"","x-dead-letter-routing-key":"rebound.parked","x-dead-letter-strategy":"at-least-once","x-overflow":"reject-publish"}}'
  fi
  definitions=$(mktemp "$DEFINITIONS_DIR/rebound-definitions.XXXXXX")
  trap 'rm -f "$definitions"' EXIT
  cat >"$definitions" <<EOF
{"queues":[{"name":"rebound.delay.hold","vhost":"$VHOST","durable":true,"auto_delete":false,"arguments":{"x-queue-type":"quorum","x-delayed-retry-type":"returned","x-delayed-retry-min":100,"x-delayed-retry-max":5000,"x-delivery-limit":-1,"x-dead-letter-exchange":"","x-dead-letter-strategy":"at-least-once","x-overflow":"reject-publish"}}$inbox]}
EOF
  chmod 644 "$definitions" # the node may read it as its own user
  rabbitmqctl import_definitions "$definitions"
  # Every copy goes home through the hold queue's one dead-letter worker,
  # which keeps this many in flight: RabbitMQ's default, 32, holds copies
  # back past a few hundred retries a second (docs/delay-modes.md).
  # Advice only: a value it cannot read is said, and the setup goes on.
  window=$(rabbitmqctl -q eval 'application:get_env(rabbit, dead_letter_worker_consumer_prefetch, 32).' 2>/dev/null) || window=
  advice="set it to 512 on every node in advanced.config (docs/delay-modes.md), or copies reach their origins late above a few hundred retries a second"
  case $window in
    '' | *[!0-9]*) echo "setup.sh: hold mode: could not read the broker's dead_letter_worker_consumer_prefetch (${window:-no answer}); $advice" >&2 ;;
    *) if [ "$window" -lt 512 ]; then
         echo "setup.sh: hold mode: the broker's dead_letter_worker_consumer_prefetch is $window; $advice" >&2
       fi ;;
  esac
fi
