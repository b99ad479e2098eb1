#!/usr/bin/env bash
# Makes sure promtool (Prometheus' rule checker and rule unit tester) is on
# PATH, for `make test`: takes it from Debian's prometheus package if it is
# missing. Only promtool is unpacked, into /usr/local/bin (or ~/bin when not
# root): installing the package would also install, and on most systems
# start, a Prometheus server, which nothing here needs. Safe to run again
# and again.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
dest=/usr/local/bin
if [ "$(id -u)" -ne 0 ]; then
  dest=$HOME/bin
  mkdir -p "$dest"
fi
if [ -x "$dest/promtool" ]; then
  echo "ensure-promtool: $dest/promtool exists but $dest is not on PATH" >&2
  exit 1
fi
echo "ensure-promtool: unpacking promtool from Debian's prometheus package into $dest" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export DEBIAN_FRONTEND=noninteractive
(cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || {
  [ "$(id -u)" -eq 0 ] && apt-get update -qq
  (cd "$tmp" && apt-get download prometheus >/dev/null)
}
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
install -m 0755 "$tmp/x/usr/bin/promtool" "$dest/promtool"
"$dest/promtool" --version >&2
