#!/usr/bin/env bash
# One broker's share of `make test`, step after step: the race-enabled
# suite; the tests that disturb the whole broker (memory alarm, broker
# restarts), one after the other since they stop or alarm it; the cluster
# tests on three extra nodes of this broker (scripts/cluster.sh, stopped and
# deleted afterwards, pass or fail); the Kubernetes manifest checks against
# this broker (deploy/validate). `make test` runs this for 3.10 and 4.3 at
# the same time: the two brokers and their clusters are separate nodes, and
# much of the suites waits on delays, node starts and elections.
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
[ ${#flags[@]} -gt 0 ] || flags=(-race -count=1 -timeout 30m)
export REBOUND_TEST_BROKER=$broker
account=${REBOUND_TEST_ACCOUNT:-/dev/null}
: > "$account"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/testreport" scripts/testreport.go || exit 1

# run NAME go test args...: one go test run, its account appended.
run() {
  local name=$1
  shift
  "$@" 2>&1 | "$tmp/testreport" "${report[@]}" -account "$tmp/$name" -label "[$broker $name] "
  local status=$(( PIPESTATUS[0] | PIPESTATUS[1] ))
  cat "$tmp/$name" >> "$account"
  return $status
}

echo "=== RabbitMQ $broker: go test ./..."
report=()
run suite go test -json "${flags[@]}" ./... || exit 1

echo "=== RabbitMQ $broker: tests that disturb the whole broker"
# -v: the tests' own lines (where messages went, every failure's message)
# as they come, not rebound's logs.
report=(-v)
run chaos go test -json "${flags[@]}" -tags chaos -run "$chaos" -v ./e2e/ || exit 1

echo "=== RabbitMQ $broker: cluster tests"
(
  trap './scripts/cluster.sh -b "$broker" stop' EXIT
  ./scripts/cluster.sh -b "$broker" start &&
    run cluster go test -json "${flags[@]}" -tags chaos -run "$clustered" -v ./e2e/
) || exit 1

echo "=== RabbitMQ $broker: deploy/validate"
report=()
(cd deploy/validate && go vet ./...) || exit 1
run validate go -C deploy/validate test -json -count=1 ./...
