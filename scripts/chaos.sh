#!/usr/bin/env bash
# Fault injection with message accounting: runs every no-loss scenario
# against the local RabbitMQ (including broker restarts) and prints one
# table row per scenario, then one row per fault that ends. Lost must be 0
# everywhere; duplicates are allowed. Time to recover is measured from the
# fault's end to rebound moving messages again (see RELIABILITY.md); with
# several faults in a scenario the table shows the worst.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-rabbitmq.sh
out=$(mktemp)
status=0
REBOUND_TEST_BROKER_RESTART=1 REBOUND_REQUIRE_BROKER=1 \
  go test -count=1 -v -timeout 30m -run 'TestNoLoss|TestInboxDeleted' . >"$out" 2>&1 || status=$?
# fields turns "KEY k=v k=v ..." lines into an awk array f.
fields='{ split("", f); for (i = 2; i <= NF; i++) { k = $i; sub(/=.*/, "", k); v = $i; sub(/^[^=]*=/, "", v); f[k] = v } }'
echo "| scenario | N | lost | duplicates | operator-deleted | time to recover | elapsed |"
echo "|---|---:|---:|---:|---:|---:|---:|"
grep -o 'ACCOUNT .*' "$out" | awk "$fields"'
  {
    rec = "—"
    if (f["faults"] == 1) rec = f["recover"]
    if (f["faults"] > 1) rec = f["recover"] " (worst of " f["faults"] ")"
    printf "| %s | %s | %s | %s | %s | %s | %s |\n", f["scenario"], f["N"], f["lost"], f["duplicates"], f["operator-lost"], rec, f["elapsed"]
  }'
echo
echo "| scenario | fault | outage | time to recover |"
echo "|---|---|---:|---:|"
grep -o 'RECOVER .*' "$out" | awk "$fields"'
  { printf "| %s | %s | %s | %s |\n", f["scenario"], f["fault"], f["outage"], f["recover"] }'
grep -E '^(--- FAIL|FAIL|ok)' "$out" || true
if [ "$status" -ne 0 ]; then
  echo "chaos: some scenario failed; full output in $out" >&2
  exit "$status"
fi
rm -f "$out"
