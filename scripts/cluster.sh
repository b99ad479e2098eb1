#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this host, for the cluster tests
# (e2e/cluster_test.go; `make test` runs them), on either broker of the
# test matrix.
#
#   scripts/cluster.sh [-b 3.10|4.3] start         start three nodes, cluster them, wait for 3 running
#   scripts/cluster.sh [-b 3.10|4.3] stop          stop them and delete their data
#   scripts/cluster.sh [-b 3.10|4.3] status        the nodes and the running members (exit 1 unless 3 run)
#   scripts/cluster.sh [-b 3.10|4.3] stop-node N   stop node N (1-3), keeping its data: a test's fault
#   scripts/cluster.sh [-b 3.10|4.3] start-node N  start node N again; it rejoins the cluster from its data
#   scripts/cluster.sh [-b 3.10|4.3] -s COMMAND    the same for one standalone node (N is 1)
#
# 3.10 (the default): rebound-c1..c3@localhost, Debian 12's RabbitMQ on the
# host, AMQP on 127.0.0.1:5701-5703, distribution on 25701-25703, data
# under /var/lib/rabbitmq/rebound-cluster.
# 4.3: rebound43-c1..c3@localhost, Debian sid's RabbitMQ in the chroot of
# scripts/rabbitmq43.sh (run `scripts/rabbitmq43.sh ensure` first), AMQP on
# 127.0.0.1:5711-5713, distribution on 25711-25713, data under the chroot's
# /var/lib/rabbitmq/rebound-cluster.
# -s: one node of its own instead, for the tests that disturb a whole node
# (memory alarm, broker restarts) so that they run beside the suite rather
# than after it: rebound-s1@localhost on 5721 (3.10), rebound43-s1@localhost
# on 5731 (4.3), data under .../rebound-solo.
#
# The nodes run beside the broker's main node (rabbit@localhost on 5672,
# rabbit43@localhost on 5674), which this script never touches, each with
# its own environment, config, data and log, and no plugins, so no
# management or Prometheus port clashes. They share the host's epmd and
# their broker's Erlang cookie. Run as root. `start` is idempotent: a
# healthy cluster is left alone, anything else (a previous run's remains)
# is stopped and wiped first. `stop` is safe to run again and again.
set -euo pipefail

BROKER=3.10 SOLO=
while true; do
  case "${1:-}" in
    -b)
      BROKER=${2:-}
      shift 2
      ;;
    -s)
      SOLO=1
      shift
      ;;
    *) break ;;
  esac
done
case "$BROKER" in
  3.10)
    ROOT=""                # the host
    NAME=rebound-c
    PORT_BASE=5700
    ;;
  4.3)
    ROOT=${REBOUND_RABBITMQ43_ROOT:-/var/lib/rebound/rabbitmq-4.3}
    NAME=rebound43-c
    PORT_BASE=5710
    ;;
  *)
    echo "cluster: -b $BROKER: want 3.10 or 4.3" >&2
    exit 2
    ;;
esac
BASE=/var/lib/rabbitmq/rebound-cluster # as the nodes see it
NODES=(1 2 3)
if [ -n "$SOLO" ]; then
  NAME=${NAME%-c}-s
  PORT_BASE=$((PORT_BASE + 20))
  BASE=/var/lib/rabbitmq/rebound-solo
  NODES=(1)
fi
HOSTBASE=$ROOT$BASE # as this script sees it
COUNT=${#NODES[@]}
SBIN=/usr/lib/rabbitmq/bin # Debian's rabbitmq-server package; /usr/sbin holds wrappers
WAIT_SECONDS=120

node() { echo "$NAME$1@localhost"; }
names() {
  local i out=()
  for i in "${NODES[@]}"; do out+=("$(node "$i")"); done
  echo "${out[*]}"
}
amqp_port() { echo $((PORT_BASE + $1)); }
dir() { echo "$BASE/c$1"; }

log() { echo "cluster ($BROKER): $*" >&2; }
die() {
  log "$*"
  exit 1
}

# as_rabbitmq runs a command as the rabbitmq user (in the chroot for 4.3),
# in a clean environment so nothing from the caller's (a RABBITMQ_*
# variable) leaks into a node.
as_rabbitmq() {
  local env=(env -i HOME=/var/lib/rabbitmq PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8)
  [ "$(id -u)" -eq 0 ] || die "run as root (the nodes run as rabbitmq, with its Erlang cookie)"
  if [ -n "$ROOT" ]; then
    chroot "$ROOT" runuser -u rabbitmq -- "${env[@]}" "$@"
  else
    runuser -u rabbitmq -- "${env[@]}" "$@"
  fi
}

ctl() { as_rabbitmq "$SBIN/rabbitmqctl" "$@"; }

# quiet runs a command and shows its output only if it fails (join_cluster
# logs errors about the node it is leaving even when all goes well).
quiet() {
  local out
  out=$("$@" 2>&1) || {
    echo "$out" >&2
    die "failed: ${*: -3}"
  }
}

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pinged() { ctl -n "$(node "$1")" -q ping >/dev/null 2>&1; }

# running_count prints how many cluster members node $1 sees running.
running_count() {
  local json
  json=$(ctl -n "$(node "$1")" -q cluster_status --formatter json 2>/dev/null) || {
    echo 0
    return
  }
  { grep -o '"running_nodes":\[[^]]*\]' <<<"$json" || true; } | { grep -o "\"$NAME[0-9]@localhost\"" || true; } | sort -u | wc -l
}

healthy() {
  local i
  for i in "${NODES[@]}"; do
    pinged "$i" || return 1
  done
  [ "$(running_count 1)" -eq "$COUNT" ]
}

# configure writes node $1's environment file (read through
# RABBITMQ_CONF_ENV_FILE instead of /etc/rabbitmq/rabbitmq-env.conf), its
# config file (instead of /etc/rabbitmq/rabbitmq.conf, which binds the main
# node's port) and an empty plugin list.
configure() {
  local d h
  d=$(dir "$1")
  h=$ROOT$d
  mkdir -p "$h/mnesia" "$h/log"
  cat >"$h/rabbitmq-env.conf" <<EOF
NODENAME=$(node "$1")
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$(amqp_port "$1")
DIST_PORT=$((20000 + $(amqp_port "$1")))
CONFIG_FILE=$d/rabbitmq.conf
ADVANCED_CONFIG_FILE=$d/advanced.config
ENABLED_PLUGINS_FILE=$d/enabled_plugins
MNESIA_BASE=$d/mnesia
LOG_BASE=$d/log
PID_FILE=$d/rabbitmq.pid
ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
  cat >"$h/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$(amqp_port "$1")
EOF
  echo '[].' >"$h/enabled_plugins"
}

# launch starts node $1 from its files, detached, and waits until it runs.
launch() {
  local d
  d=$(dir "$1")
  # A killed node leaves its pid file; `wait` would read the dead pid.
  rm -f "$ROOT$d/rabbitmq.pid"
  as_rabbitmq RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf" "$SBIN/rabbitmq-server" -detached
  ctl -n "$(node "$1")" -q wait "$d/rabbitmq.pid" --timeout "$WAIT_SECONDS" >/dev/null ||
    die "$(node "$1") did not start within ${WAIT_SECONDS}s; see $ROOT$d/log"
}

# node_pids prints the processes of node $1: the Erlang VMs started with
# its environment file (the node name is not on their command line, and
# the chroot's rabbitmq user has another uid than the host's) under this
# broker's root. The path is the same for both brokers' nodes as they see
# it, so without the root `-b 4.3 start` (which wipes what a previous run
# left) would kill the 3.10 cluster running beside it, as it did in CI.
node_pids() {
  local pid want root
  want="RABBITMQ_CONF_ENV_FILE=$(dir "$1")/rabbitmq-env.conf"
  root=$(readlink -f "${ROOT:-/}")
  for pid in $(pgrep -x beam.smp || true); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ] || continue
    # An exiting process has no environment left to read.
    if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "$want"; then
      echo "$pid"
    fi
  done
}

# halt stops node $1, and kills it if it will not stop (or does not answer,
# as when a previous run was interrupted). Its data stays.
halt() {
  local pids
  if pinged "$1"; then
    ctl -n "$(node "$1")" -q stop >/dev/null 2>&1 || true
  fi
  pids=$(node_pids "$1")
  if [ -n "$pids" ]; then
    # shellcheck disable=SC2086 # one word per pid
    kill $pids 2>/dev/null || true
    for _ in $(seq 1 20); do
      pids=$(node_pids "$1")
      [ -z "$pids" ] && break
      sleep 0.5
    done
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -9 $pids 2>/dev/null || true
    fi
  fi
  rm -f "$ROOT$(dir "$1")/rabbitmq.pid"
}

cmd_stop() {
  local i
  for i in "${NODES[@]}"; do
    halt "$i" &
  done
  wait
  case "$HOSTBASE" in
    /*/*) rm -rf "$HOSTBASE" ;;
    *) die "refusing to delete $HOSTBASE" ;;
  esac
  log "stopped; $HOSTBASE deleted"
}

cmd_start() {
  local i began=$SECONDS
  [ -x "$ROOT$SBIN/rabbitmq-server" ] || die "$ROOT$SBIN/rabbitmq-server not found; start the broker first (scripts/ensure-rabbitmq.sh, scripts/rabbitmq43.sh ensure)"
  if healthy; then
    log "already running: $(names) on 127.0.0.1:$(amqp_port 1)-$(amqp_port "$COUNT")"
    return
  fi
  if [ -e "$HOSTBASE" ]; then
    log "wiping what a previous run left in $HOSTBASE"
  fi
  cmd_stop
  for i in "${NODES[@]}"; do
    if answers "$(amqp_port "$i")"; then
      die "127.0.0.1:$(amqp_port "$i") is taken by something else"
    fi
  done
  mkdir -p "$HOSTBASE"
  for i in "${NODES[@]}"; do
    configure "$i"
  done
  if [ -n "$ROOT" ]; then
    chroot "$ROOT" chown -R rabbitmq:rabbitmq "$BASE"
  else
    chown -R rabbitmq:rabbitmq "$BASE"
  fi
  for i in "${NODES[@]}"; do
    launch "$i" &
  done
  for i in "${NODES[@]}"; do
    wait -n || die "a node did not start"
  done
  for i in "${NODES[@]:1}"; do
    quiet ctl -n "$(node "$i")" -q stop_app
    quiet ctl -n "$(node "$i")" -q join_cluster "$(node 1)"
    quiet ctl -n "$(node "$i")" -q start_app
  done
  for _ in $(seq 1 "$WAIT_SECONDS"); do
    if [ "$(running_count 1)" -eq "$COUNT" ]; then
      log "$COUNT running ($(names)) on 127.0.0.1:$(amqp_port 1)-$(amqp_port "$COUNT") after $((SECONDS - began))s"
      return
    fi
    sleep 1
  done
  die "the cluster did not show $COUNT running nodes within ${WAIT_SECONDS}s"
}

cmd_status() {
  local i
  for i in "${NODES[@]}"; do
    if pinged "$i"; then
      echo "$(node "$i") up, amqp://127.0.0.1:$(amqp_port "$i")/"
    else
      echo "$(node "$i") down"
    fi
  done
  for i in "${NODES[@]}"; do
    if pinged "$i"; then
      local running
      running=$(running_count "$i")
      echo "running members seen by $(node "$i"): $running"
      [ "$running" -eq "$COUNT" ] && return 0
      return 1
    fi
  done
  return 1
}

node_arg() {
  local i
  for i in "${NODES[@]}"; do
    [ "${1:-}" = "$i" ] && return
  done
  die "usage: $0 [-b 3.10|4.3] [-s] stop-node|start-node ${NODES[*]}"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  ctl)
    # ctl N ARGS: rabbitmqctl against node N, for tests.
    node_arg "${2:-}"
    n=$2
    shift 2
    ctl -n "$(node "$n")" "$@"
    ;;
  stop-node)
    node_arg "${2:-}"
    halt "$2"
    log "$(node "$2") stopped"
    ;;
  start-node)
    node_arg "${2:-}"
    pinged "$2" || launch "$2"
    log "$(node "$2") running"
    ;;
  *) die "usage: $0 [-b 3.10|4.3] [-s] start|stop|status|ctl N ARGS|stop-node N|start-node N" ;;
esac
