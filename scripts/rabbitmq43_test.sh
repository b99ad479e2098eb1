#!/usr/bin/env bash
# Tests of scripts/rabbitmq43.sh's mirror: which Debian archive it takes
# from sample apt sources, and that it fails, saying why, when they name
# none. It reads only the sample files (APT_ROOT) and starts no broker.
set -uo pipefail
cd "$(dirname "$0")"

passed=0
failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# check NAME WANT: the sample apt tree in $work/NAME gives WANT ("" for a
# failure with a message).
check() {
  local name=$1 want=$2 got rc
  got=$(APT_ROOT="$work/$name" ./rabbitmq43.sh mirror 2>"$work/$name.err")
  rc=$?
  if [ -z "$want" ]; then
    if [ "$rc" -ne 0 ] && [ -z "$got" ] && grep -q "no Debian archive" "$work/$name.err"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      echo "FAIL $name: want a failure with a message, got rc=$rc out=$got err=$(cat "$work/$name.err")"
    fi
    return
  fi
  if [ "$rc" -eq 0 ] && [ "$got" = "$want" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name: want $want, got rc=$rc out=$got err=$(cat "$work/$name.err")"
  fi
}

# sample NAME FILE: stdin becomes $work/NAME/etc/apt/FILE.
sample() {
  mkdir -p "$work/$1/etc/apt/sources.list.d"
  cat >"$work/$1/etc/apt/$2"
}

sample deb822 sources.list.d/debian.sources <<'S'
Types: deb
# a comment naming another archive: http://old.example/debian
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
S
check deb822 http://mirror.example/debian

sample deb822-security-first sources.list.d/debian.sources <<'S'
Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security

Types: deb-src deb
URIs: https://other.example/pub/debian/
Suites: bookworm
S
check deb822-security-first https://other.example/pub/debian/

sample deb822-disabled sources.list.d/debian.sources <<'S'
Types: deb
URIs: http://off.example/debian
Suites: bookworm
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
S
check deb822-disabled ""

sample one-line sources.list <<'S'
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://line.example/debian bookworm main
S
check one-line http://line.example/debian

sample list-dir sources.list.d/extra.list <<'S'
deb https://packages.example/apt stable main
deb http://dir.example/debian/ bookworm main
S
check list-dir http://dir.example/debian/

# A disabled file's name does not end in .list or .sources.
sample third-party-only sources.list.d/vendor.sources <<'S'
Types: deb
URIs: https://vendor.example/node_20.x
Suites: nodistro
S
sample third-party-only sources.list.d/debian.sources.disabled <<'S'
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
S
check third-party-only ""

mkdir -p "$work/none/etc/apt"
check none ""

echo "rabbitmq43 mirror: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
