#!/usr/bin/env bash
# Tests make release (scripts/release.sh) in a clone of this repository's
# HEAD: each refusal changes nothing, and a release on a clean tree cuts the
# CHANGELOG, tags, and writes every artifact; building the tag again gives
# the same image digest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
export GIT_AUTHOR_NAME=release-test GIT_AUTHOR_EMAIL=release-test@localhost
export GIT_COMMITTER_NAME=release-test GIT_COMMITTER_EMAIL=release-test@localhost
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q . "$tmp/r"
cd "$tmp/r"
head=$(git rev-parse HEAD)
version=$(cat VERSION)
failed=0
fail() { echo "release_test: FAIL: $*" >&2; failed=1; }

# refused NAME WANT: make release exits non-zero naming WANT and leaves
# HEAD, the tags and CHANGELOG.md as they were.
refused() {
  local before out
  before=$(git rev-parse HEAD; git tag; sha256sum CHANGELOG.md)
  if out=$(make --no-print-directory release 2>&1); then
    fail "$1: make release succeeded"
  elif ! grep -q "$2" <<<"$out"; then
    fail "$1: make release said \"$out\", want \"$2\""
  fi
  [ "$before" = "$(git rev-parse HEAD; git tag; sha256sum CHANGELOG.md)" ] || fail "$1: the refusal changed the repository"
  echo "release_test: $1: refused"
}

echo scratch >scratch.txt
refused "dirty tree" "uncommitted changes"
rm scratch.txt

echo 0.3.0 >VERSION && git commit -qam "test: a released version"
refused "version already in the CHANGELOG" "0.3.0 is already released"
git reset -q --hard "$head"

echo not-a-version >VERSION && git commit -qam "test: a bad version"
refused "not a version" "not a semantic version"
git reset -q --hard "$head"

awk '/^## \[Unreleased\]/{print; on=1; next} /^## \[/{on=0} !on' CHANGELOG.md >c && mv c CHANGELOG.md
git commit -qam "test: nothing unreleased"
refused "empty [Unreleased]" "lists no change"
git reset -q --hard "$head"

RELEASE_DATE=2026-12-06 make --no-print-directory release >"$tmp/release.log" 2>&1 || { cat "$tmp/release.log"; fail "make release on a clean tree"; }
grep -q "^## \[$version\] - 2026-12-06$" CHANGELOG.md || fail "CHANGELOG.md has no \"## [$version] - 2026-12-06\""
grep -q "^## \[Unreleased\]$" CHANGELOG.md || fail "CHANGELOG.md lost its [Unreleased] heading"
grep -q "^\[$version\]: .*/compare/v.*\.\.\.v$version$" CHANGELOG.md || fail "CHANGELOG.md has no link for $version"
[ "$(git describe --exact-match --tags HEAD 2>/dev/null)" = "v$version" ] || fail "HEAD is not tagged v$version"
grep -q "newTag: \"$version\"" deploy/kustomize/overlays/standalone/kustomization.yaml || fail "the standalone layout does not pin $version"
grep -qx "version: $version" deploy/helm/rebound/Chart.yaml && grep -qx "appVersion: \"$version\"" deploy/helm/rebound/Chart.yaml ||
  fail "the chart's version and appVersion are not $version"
[ -z "$(git status --porcelain)" ] || fail "the release left uncommitted changes: $(git status --short)"
dist=dist/$version
for f in rebound-linux-amd64 rebound-linux-arm64 rebound-image.tar rebound.cdx.json SHA256SUMS image-digest image/index.json; do
  [ -s "$dist/$f" ] || fail "$dist/$f missing"
done
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not check"
refused "the version just released" "already released"

# The tag built again, into another folder: the same image.
make --no-print-directory dist VERSION="$version" >/dev/null 2>&1 && fail "make dist overwrote $dist"
(cd tools && go run ./release -repo .. -out "$tmp/again" -version "$version" -revision "$(git describe --always --dirty --abbrev=12 --exclude='*')" >/dev/null)
if [ "$(cat "$dist/image-digest")" = "$(cat "$tmp/again/image-digest")" ]; then
  echo "release_test: the tag built twice gives image $(cat "$dist/image-digest")"
else
  fail "the tag built twice gave $(cat "$dist/image-digest") and $(cat "$tmp/again/image-digest")"
fi
cmp -s "$dist/SHA256SUMS" "$tmp/again/SHA256SUMS" || fail "the tag built twice gave other checksums"
du -b "$dist"/rebound-linux-* "$dist/rebound-image.tar" | sed 's/^/release_test: size /'
exit $failed
