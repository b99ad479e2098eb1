#!/usr/bin/env bash
# One broker's share of `make test`, four runs side by side: the
# race-enabled suite on the broker's main node; the Kubernetes manifest
# checks (deploy/validate, which set up a vhost of their own on the main
# node); the tests that disturb a whole node (memory alarm, broker
# restarts; one after the other since they stop or alarm it) on a
# standalone node of this broker; the cluster tests on three more nodes.
# The extra nodes (scripts/cluster.sh, -s for the standalone one) are
# stopped and deleted afterwards, pass or fail. Run after the suite, the
# disturbing tests made 4.3's chain 793 + 322 s of a 1388 s CI run (docs/testing.md). `make test`
# runs this for 3.10 and 4.3 at the same time: the two brokers and their clusters are
# separate nodes, and much of the suites waits on delays, node starts and
# elections. The last line gives each step's time and the chain's.
#
#   scripts/test-broker.sh BROKER CHAOS_TESTS_REGEXP CLUSTER_TESTS_REGEXP [go test flags...]
#
# scripts/testreport.go prints each run as `go test` would and then an
# account of what failed; with REBOUND_TEST_ACCOUNT set, the accounts go to
# that file as well (`make test` prints it last).
set -uo pipefail
cd "$(dirname "$0")/.."
broker=$1 chaos=$2 clustered=$3
shift 3
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-race -count=1 -parallel 4 -timeout 60m)
export REBOUND_TEST_BROKER=$broker
account=${REBOUND_TEST_ACCOUNT:-/dev/null}
: > "$account"
tmp=$(mktemp -d)
start=$SECONDS
trap 'echo "=== RabbitMQ $broker: $(paste -sd, "$tmp/times" 2>/dev/null || echo nothing run); the chain $((SECONDS - start))s"; rm -rf "$tmp"' EXIT
go build -o "$tmp/testreport" scripts/testreport.go || exit 1

# run NAME [-v] go test args...: one go test run, its account appended and
# its time recorded for the last line (the critical path of `make test` is
# the slower broker's chain). -v: the tests' own lines (where messages went,
# every failure's message) as they come, not rebound's logs.
run() {
  local name=$1 began=$SECONDS report=()
  shift
  if [ "$1" = -v ]; then
    report=(-v)
    shift
  fi
  "$@" 2>&1 | "$tmp/testreport" "${report[@]}" -slowest 10 -account "$tmp/$name" -label "[$broker $name] "
  local status=$(( PIPESTATUS[0] | PIPESTATUS[1] ))
  cat "$tmp/$name" >> "$account"
  echo " $name $((SECONDS - began))s" >> "$tmp/times"
  return $status
}

echo "=== RabbitMQ $broker: go test ./..., beside deploy/validate, the chaos tests on a node of their own and the cluster tests"
(cd deploy/validate && go vet ./...) || exit 1
run validate go -C deploy/validate test -json -count=1 ./... &
validate_pid=$!
# Each set of extra nodes is started for its run and stopped and deleted
# after it, pass or fail.
(
  trap './scripts/cluster.sh -b "$broker" -s stop 2>&1 | sed -u "s/^/[$broker chaos] /"' EXIT
  ./scripts/cluster.sh -b "$broker" -s start 2>&1 | sed -u "s/^/[$broker chaos] /" &&
    REBOUND_TEST_NODE=solo run chaos -v go test -json "${flags[@]}" -tags chaos -run "$chaos" -v ./e2e/
) &
chaos_pid=$!
(
  trap './scripts/cluster.sh -b "$broker" stop 2>&1 | sed -u "s/^/[$broker cluster] /"' EXIT
  ./scripts/cluster.sh -b "$broker" start 2>&1 | sed -u "s/^/[$broker cluster] /" &&
    run cluster -v go test -json "${flags[@]}" -tags chaos -run "$clustered" -v ./e2e/
) &
clustered_pid=$!
run suite go test -json "${flags[@]}" ./...
status=$?
for pid in $validate_pid $chaos_pid $clustered_pid; do
  wait $pid || status=1
done
exit $status
