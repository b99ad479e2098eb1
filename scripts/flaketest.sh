#!/usr/bin/env bash
# The flake hunt: runs every test that talks to a broker again and again on
# both brokers of the matrix, half of the runs on a loaded machine, and
# reports each failure. Run it before relying on a new broker test.
#
#   scripts/flaketest.sh [-n RUNS] [-b "3.10 4.3"] [-l LOGDIR]
#
# For each broker, RUNS runs (default 6) of `go test -race -count=1 ./...`
# and of deploy/validate. Odd runs are quiet. Even runs are loaded: one busy
# loop per CPU core, and a second copy of the same test run at the same time
# on the same broker (its result counts too), so that every test shares the
# broker and the CPU with others. A test that passes on a second try is
# still a failure here: nothing is retried. The tests that disturb the whole
# broker (the chaos tag) are left out: they cannot share a broker.
#
# Every run's output goes to LOGDIR (default a new directory under /tmp);
# the summary names each failing test with its run, broker and load. Exit
# status 1 when anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

runs=6
brokers="3.10 4.3"
logdir=""
while getopts "n:b:l:" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    b) brokers=$OPTARG ;;
    l) logdir=$OPTARG ;;
    *) echo "usage: $0 [-n RUNS] [-b \"3.10 4.3\"] [-l LOGDIR]" >&2; exit 2 ;;
  esac
done
[ -n "$logdir" ] || logdir=$(mktemp -d /tmp/rebound-flaketest.XXXXXX)
mkdir -p "$logdir"

export REBOUND_REQUIRE_BROKER=1
flags=(-race -count=1 -parallel 4 -timeout 60m) # as make test runs them
hogs=()

stop_hogs() {
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT

start_hogs() {
  local n
  n=$(nproc)
  for _ in $(seq "$n"); do
    (while :; do :; done) &
    hogs+=($!)
  done
}

# suite runs the broker-facing tests once on broker $1 and writes the
# output to $2; it returns go test's status.
suite() {
  local broker=$1 out=$2 status=0
  REBOUND_TEST_BROKER=$broker go test "${flags[@]}" ./... >"$out" 2>&1 || status=$?
  (cd deploy/validate && REBOUND_TEST_BROKER=$broker go test -count=1 ./...) >>"$out" 2>&1 || status=$?
  return $status
}

failures=0
summary="$logdir/summary.txt"
: >"$summary"
report() { # broker run load status logfile
  local failed
  if [ "$4" -eq 0 ]; then
    printf '%-5s run %-2s %-6s pass (%s)\n' "$1" "$2" "$3" "$5" | tee -a "$summary"
    return
  fi
  failures=$((failures + 1))
  failed=$({ grep -E '^\s*--- FAIL' "$5" || true; } | sed 's/^ *//' | tr '\n' ' ')
  printf '%-5s run %-2s %-6s FAIL %s(%s)\n' "$1" "$2" "$3" "${failed:-(no test named: see the log) }" "$5" | tee -a "$summary"
}

# The client tests run the guide's Node and Python snippets: install what
# they need into this checkout, as make test does.
./scripts/ensure-clients.sh

# Build once with the race detector so that the runs measure tests, not
# the compiler.
go test "${flags[@]}" -run '^$' ./... >/dev/null

for b in $brokers; do
  for i in $(seq "$runs"); do
    log="$logdir/$b-run$i.log"
    if [ $((i % 2)) -eq 1 ]; then
      status=0
      suite "$b" "$log" || status=$?
      report "$b" "$i" quiet "$status" "$log"
      continue
    fi
    start_hogs
    twin="$logdir/$b-run$i-twin.log"
    suite "$b" "$twin" &
    twinpid=$!
    status=0
    suite "$b" "$log" || status=$?
    twinstatus=0
    wait "$twinpid" || twinstatus=$?
    stop_hogs
    report "$b" "$i" loaded "$status" "$log"
    report "$b" "$i" twin "$twinstatus" "$twin"
  done
done

echo
echo "flaketest: $failures failing run(s); logs in $logdir"
[ "$failures" -eq 0 ]
