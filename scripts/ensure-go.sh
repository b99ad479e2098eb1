#!/usr/bin/env bash
# Checks that a Go toolchain of 1.24 or newer is on PATH (or at /usr/local/go).
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"
if ! command -v go >/dev/null 2>&1; then
  echo "ensure-go: no Go toolchain found; install Go 1.24 or newer (https://go.dev/dl) to /usr/local/go" >&2
  exit 1
fi
v=$(go env GOVERSION | sed 's/^go//')
major=${v%%.*}; rest=${v#*.}; minor=${rest%%.*}
if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 24 ]; }; then
  echo "ensure-go: Go $v is too old; rebound needs 1.24 or newer" >&2
  exit 1
fi
