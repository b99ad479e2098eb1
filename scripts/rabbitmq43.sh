#!/usr/bin/env bash
# RabbitMQ 4.3 beside the host's RabbitMQ 3.10, for the broker test matrix.
#
#   scripts/rabbitmq43.sh ensure      build the chroot if missing, start the node if it does not answer
#   scripts/rabbitmq43.sh start       start the node (the chroot must exist)
#   scripts/rabbitmq43.sh stop        stop the node
#   scripts/rabbitmq43.sh ctl ARGS    rabbitmqctl against the node, from inside the chroot
#   scripts/rabbitmq43.sh plugins ARGS  rabbitmq-plugins against the node
#   scripts/rabbitmq43.sh pid         the node's Erlang VM process id, as the host sees it
#   scripts/rabbitmq43.sh mirror      the Debian mirror the chroot would be built from
#
# Debian 12 ships RabbitMQ 3.10; Debian sid ships the current release. The
# chroot ($REBOUND_RABBITMQ43_ROOT, default /var/lib/rebound/rabbitmq-4.3) is
# built with mmdebstrap from the Debian mirror the host's apt sources name
# (and no other: without one it stops and says so),
# with sid's rabbitmq-server and the Erlang it needs. The node runs in it as
# rabbit43@localhost: AMQP on 127.0.0.1:5674, distribution on 25674, beside
# rabbit@localhost (3.10) on 5672, sharing the host's epmd. guest/guest
# works (connections come from loopback). Run as root. `ensure` is
# idempotent: a node that answers is left alone.
set -euo pipefail

ROOT=${REBOUND_RABBITMQ43_ROOT:-/var/lib/rebound/rabbitmq-4.3}
NODE=rabbit43@localhost
PORT=5674
DIST_PORT=25674
WAIT_SECONDS=120

log() { echo "rabbitmq43: $*" >&2; }
die() {
  log "$*"
  exit 1
}

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

# mirror prints the first Debian archive the machine's own apt sources
# name (one-line entries in $APT_ROOT/etc/apt/sources.list and
# sources.list.d/*.list, deb822 stanzas in sources.list.d/*.sources), and
# fails when they name none: the chroot is built only from a mirror this
# machine is set up to use. An archive is a "deb" URI whose path ends in
# /debian (not debian-security, not a third-party repository); a stanza
# with "Enabled: no" and commented lines do not count. APT_ROOT ("" by
# default) lets the tests point it at sample files.
mirror() {
  local etc="${APT_ROOT:-}/etc/apt" m
  m=$(
    {
      # deb822: one stanza per paragraph; print its URIs when it is
      # enabled and of type deb.
      for f in "$etc"/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '
          function flush() {
            if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled !~ /^(no|false)$/) {
              n = split(uris, u, /[ \t]+/)
              for (i = 1; i <= n; i++) if (u[i] != "") print u[i]
            }
            types = ""; uris = ""; enabled = ""
          }
          /^[ \t]*#/ { next }
          /^[ \t]*$/ { flush(); next }
          tolower($1) == "types:" { sub(/^[^:]*:[ \t]*/, ""); types = $0; next }
          tolower($1) == "uris:" { sub(/^[^:]*:[ \t]*/, ""); uris = $0; next }
          tolower($1) == "enabled:" { enabled = tolower($2); next }
          END { flush() }
        ' "$f"
      done
      # One-line style: deb [options] URI suite components.
      for f in "$etc/sources.list" "$etc"/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '
          $1 != "deb" { next }
          {
            i = 2
            if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            if (i <= NF) print $i
          }
        ' "$f"
      done
    } | grep -E '^[a-z+]+://[^ ]*/debian/?$' | head -1
  ) || true
  if [ -z "$m" ]; then
    log "no Debian archive in this machine's apt sources ($etc/sources.list, $etc/sources.list.d/*.list, *.sources):"
    log "add one (a \"deb\" line or a deb822 stanza whose URI ends in /debian) and run again"
    return 1
  fi
  echo "$m"
}

# mounted reports whether $1 is a mount point.
mounted() { grep -qs " $1 " /proc/self/mounts; }

# prepare gives the chroot what the node needs from the host: name
# resolution for localhost, /proc and /dev.
prepare() {
  cp /etc/hosts "$ROOT/etc/hosts"
  mounted "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mounted "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
}

build() {
  [ "$(id -u)" -eq 0 ] || die "run as root: building the chroot and starting the node need it"
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    log "installing mmdebstrap from Debian's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null 2>&1 || {
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
    }
  fi
  local src tmp began=$SECONDS
  src=$(mirror) || die "cannot build $ROOT without a Debian mirror"
  tmp="$ROOT.building"
  rm -rf "$tmp"
  mkdir -p "$(dirname "$ROOT")"
  log "building $ROOT from $src (sid, rabbitmq-server)"
  # sid's Release file on a snapshot-style mirror can be past its
  # Valid-Until: the signature is still checked, the date is not.
  # A fresh machine's first fetch from the mirror can fail (seen: apt-get
  # update inside mmdebstrap failing minutes after boot, then passing):
  # three tries, a little apart, before giving up.
  local try
  for try in 1 2 3; do
    rm -rf "$tmp"
    if mmdebstrap --quiet --variant=apt --include=rabbitmq-server,procps \
      --aptopt='Acquire::Check-Valid-Until "false"' \
      sid "$tmp" "$src" >&2; then
      break
    fi
    [ "$try" -lt 3 ] || die "mmdebstrap failed three times; is $src reachable?"
    log "mmdebstrap failed (try $try of 3); trying again in $((try * 10)) s"
    sleep $((try * 10))
  done
  mkdir -p "$tmp/etc/rabbitmq"
  cat >"$tmp/etc/rabbitmq/rabbitmq-env.conf" <<EOF
NODENAME=$NODE
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=$PORT
DIST_PORT=$DIST_PORT
ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
  cat >"$tmp/etc/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$PORT
EOF
  # No plugins by default: the management and Prometheus ports would
  # clash with the 3.10 node's. The bench enables the shovel itself.
  echo '[].' >"$tmp/etc/rabbitmq/enabled_plugins"
  mv "$tmp" "$ROOT"
  log "built in $((SECONDS - began))s: $(chroot "$ROOT" dpkg-query -W -f '${Version}' rabbitmq-server)"
}

ctl() { chroot "$ROOT" /usr/sbin/rabbitmqctl -n "$NODE" "$@"; }

start() {
  [ -x "$ROOT/usr/sbin/rabbitmq-server" ] || die "$ROOT has no rabbitmq-server; run: $0 ensure"
  prepare
  if ! answers; then
    log "starting $NODE on 127.0.0.1:$PORT"
    # The package's wrapper runs the node as the rabbitmq user. Output to
    # a file, not a pipe, so the caller never waits on the detached VM.
    chroot "$ROOT" /usr/sbin/rabbitmq-server -detached >"$ROOT/var/log/rabbitmq/start.out" 2>&1 || true
  fi
  local i
  for i in $(seq 1 "$WAIT_SECONDS"); do
    if answers && ctl -q await_startup >/dev/null 2>&1; then
      log "$NODE is up on 127.0.0.1:$PORT ($(ctl -q version 2>/dev/null || echo '?'))"
      return 0
    fi
    sleep 1
  done
  die "$NODE did not come up within ${WAIT_SECONDS}s; see $ROOT/var/log/rabbitmq/"
}

stop() {
  [ -d "$ROOT" ] || return 0
  prepare
  ctl -q stop >/dev/null 2>&1 || true
}

# pid prints the host pid of the node's Erlang VM: the chroot shares the
# host's pid namespace.
pid() { ctl -q eval 'os:getpid().' | tr -d '"'; }

case "${1:-}" in
  ensure)
    if answers; then
      exit 0
    fi
    [ -x "$ROOT/usr/sbin/rabbitmq-server" ] || build
    start
    ;;
  start) start ;;
  stop) stop ;;
  ctl)
    shift
    ctl "$@"
    ;;
  plugins)
    shift
    chroot "$ROOT" /usr/sbin/rabbitmq-plugins -n "$NODE" "$@"
    ;;
  pid) pid ;;
  mirror) mirror ;;
  *) die "usage: $0 ensure|start|stop|ctl ARGS|plugins ARGS|pid|mirror" ;;
esac
