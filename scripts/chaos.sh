#!/usr/bin/env bash
# Fault injection with message accounting, on both brokers of the test
# matrix (RabbitMQ 3.10 and 4.3): every no-loss scenario, the tests that
# disturb the whole broker (memory alarm, broker restarts), the losses the
# broker itself would cause (dead-letter reasons, delivery limits) and the
# cluster tests on three extra nodes per broker. It prints one table row per
# scenario and broker, then one per fault that ends: lost must be 0
# everywhere; duplicates are allowed. Time to recover is measured from the
# fault's end to rebound moving messages again (see docs/RELIABILITY.md); with
# several faults in a scenario the table shows the worst.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-rabbitmq.sh
./scripts/rabbitmq43.sh ensure
out=$(mktemp)
status=0
for b in 3.10 4.3; do
  echo "chaos: RabbitMQ $b" >&2
  REBOUND_TEST_BROKER=$b REBOUND_REQUIRE_BROKER=1 go test -count=1 -v -timeout 60m -tags chaos \
    -run 'TestNoLoss|TestRetryRateBudgetLosesNothing|TestInboxDeleted|TestEveryDeadLetterReasonIsRetried|TestInboxDeliveryLimit|TestParkingQueueSurvives|TestUpgradeFromHeadersExchange' \
    ./e2e/ >>"$out" 2>&1 || status=$?
  if ./scripts/cluster.sh -b "$b" start >&2; then
    REBOUND_TEST_BROKER=$b REBOUND_REQUIRE_BROKER=1 go test -count=1 -v -timeout 60m -tags chaos -run '^TestCluster' ./e2e/ >>"$out" 2>&1 || status=$?
  else
    status=1
  fi
  ./scripts/cluster.sh -b "$b" stop >&2 || true
done
# fields turns "KEY k=v k=v ..." lines into an awk array f.
fields='{ split("", f); for (i = 2; i <= NF; i++) { k = $i; sub(/=.*/, "", k); v = $i; sub(/^[^=]*=/, "", v); f[k] = v } }'
echo "| scenario | broker | queues | N | lost | duplicates | operator-deleted | time to recover | elapsed |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|"
grep -o 'ACCOUNT .*' "$out" | awk "$fields"'
  {
    rec = "—"
    if (f["faults"] == 1 && f["recover"] != "-") rec = f["recover"]
    if (f["faults"] > 1 && f["recover"] != "-") rec = f["recover"] " (worst of " f["faults"] ")"
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f["scenario"], f["broker"], f["queues"], f["N"], f["lost"], f["duplicates"], f["operator-lost"], rec, f["elapsed"]
  }' | sort -t'|' -k2,2 -k3,3 -s
echo
echo "| scenario | broker | queues | fault | outage | time to recover |"
echo "|---|---|---|---|---:|---:|"
grep -o 'RECOVER .*' "$out" | awk "$fields"'
  { printf "| %s | %s | %s | %s | %s | %s |\n", f["scenario"], f["broker"], f["queues"], f["fault"], f["outage"], f["recover"] }' | sort -t'|' -k2,2 -s
grep -E '^(--- FAIL|FAIL|ok)' "$out" || true
if [ "$status" -ne 0 ]; then
  echo "chaos: some scenario failed; full output in $out" >&2
  exit "$status"
fi
rm -f "$out"
