#!/usr/bin/env bash
# Fault injection with message accounting: runs every no-loss scenario
# against the local RabbitMQ (including broker restarts) and prints one
# table row per scenario. Lost must be 0 everywhere; duplicates are allowed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-rabbitmq.sh
out=$(mktemp)
status=0
REBOUND_TEST_BROKER_RESTART=1 REBOUND_REQUIRE_BROKER=1 \
  go test -count=1 -v -timeout 30m -run 'TestNoLoss|TestInboxDeleted' . >"$out" 2>&1 || status=$?
echo "| scenario | N | lost | duplicates | operator-deleted | elapsed |"
echo "|---|---:|---:|---:|---:|---:|"
grep -o 'ACCOUNT .*' "$out" | sed -E 's/ACCOUNT scenario=([^ ]+) N=([0-9]+) parked=[0-9]+ distinct=[0-9]+ lost=([0-9]+) duplicates=([0-9]+) operator-lost=([0-9]+) elapsed=([^ ]+)/| \1 | \2 | \3 | \4 | \5 | \6 |/'
grep -E '^(--- FAIL|FAIL|ok)' "$out" || true
if [ "$status" -ne 0 ]; then
  echo "chaos: some scenario failed; full output in $out" >&2
  exit "$status"
fi
rm -f "$out"
