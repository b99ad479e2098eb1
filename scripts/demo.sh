#!/usr/bin/env bash
# The demo: rebound in the background, and an application that fails every
# message, so you can watch messages come back after 1s, 2s, 4s, 8s and end
# parked. Stops rebound when the demo application exits.
set -euo pipefail
cd "$(dirname "$0")/.."
export REBOUND_MIN_DELAY=${REBOUND_MIN_DELAY:-1s} REBOUND_MAX_RETRIES=${REBOUND_MAX_RETRIES:-4} \
  REBOUND_JITTER=${REBOUND_JITTER:-none} REBOUND_LOG_FORMAT=${REBOUND_LOG_FORMAT:-console}
echo "--- the policy in use (rebound schedule):"
./bin/rebound schedule
./bin/rebound run 2> >(sed 's/^/[rebound] /' >&2) &
rebound=$!
trap 'kill -TERM $rebound 2>/dev/null; wait $rebound 2>/dev/null || true' EXIT
ready() { exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3 && head -1 <&3 | grep -q ' 200 '; }
for _ in $(seq 1 100); do
  ready 2>/dev/null && break
  sleep 0.2
done
echo "--- the application (examples/failing-consumer):"
go run ./examples/failing-consumer
echo "--- queues now (rabbitmqctl list_queues):"
rabbitmqctl -q list_queues name messages | grep -E '^(name|demo\.|rebound\.)' || true
