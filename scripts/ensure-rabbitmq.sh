#!/usr/bin/env bash
# Makes sure a RabbitMQ answers on 127.0.0.1:5672 (guest/guest): starts the
# local one if it is installed but stopped, installs it from Debian's
# packages first if it is missing. Safe to run again and again.
set -euo pipefail

answers() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

if answers; then
  exit 0
fi
if ! command -v rabbitmq-server >/dev/null 2>&1; then
  echo "ensure-rabbitmq: installing rabbitmq-server from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # The package's own start (systemd) does not work in a container; start it below.
  apt-get install -y -qq rabbitmq-server >/dev/null
fi
if ! answers; then
  echo "ensure-rabbitmq: starting rabbitmq-server" >&2
  rabbitmq-server -detached || true
fi
for _ in $(seq 1 120); do
  if answers && rabbitmqctl -q await_startup >/dev/null 2>&1; then
    echo "ensure-rabbitmq: RabbitMQ is up on 127.0.0.1:5672" >&2
    exit 0
  fi
  sleep 1
done
echo "ensure-rabbitmq: RabbitMQ did not come up in 120 s; see /var/log/rabbitmq/" >&2
exit 1
