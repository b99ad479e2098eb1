#!/usr/bin/env bash
# make release: releases the version in VERSION. It cuts the CHANGELOG's
# [Unreleased] section into "## [VERSION] - today", points the kustomize
# layouts' image tags and the Helm chart's version at it, commits that as "Release VERSION", tags it
# vVERSION and builds the artifacts of that commit into dist/VERSION
# (make dist). It refuses, changing nothing, when the tree has uncommitted
# changes, when VERSION is not a semantic version, when the CHANGELOG or a
# tag already has it, or when [Unreleased] lists nothing.
#
# RELEASE_DATE (YYYY-MM-DD) overrides today's date, for tests.
set -euo pipefail
cd "$(dirname "$0")/.."

refuse() { echo "release: $*" >&2; exit 1; }

version=$(cat VERSION)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  refuse "VERSION \"$version\" is not a semantic version (such as 0.4.0)"
if [ -n "$(git status --porcelain)" ]; then
  git status --short >&2
  refuse "the tree has uncommitted changes (above): commit or stash them, a release is built from a commit"
fi
grep -q "^## \[$version\]" CHANGELOG.md &&
  refuse "$version is already released in CHANGELOG.md: set VERSION to the version to release"
git rev-parse -q --verify "refs/tags/v$version" >/dev/null &&
  refuse "tag v$version exists already"
# What [Unreleased] holds: the lines between its heading and the next version's.
unreleased=$(awk '/^## \[Unreleased\]/{on=1; next} /^## \[/{on=0} on' CHANGELOG.md)
grep -q '^- ' <<<"$unreleased" || refuse "[Unreleased] in CHANGELOG.md lists no change: nothing to release"
previous=$(grep -m1 -oP '^## \[\K[0-9][^]]*(?=\] - )' CHANGELOG.md) ||
  refuse "CHANGELOG.md has no earlier version to compare with"
date=${RELEASE_DATE:-$(date -u +%F)}

repo=https://github.com/rebound-mq/rebound
awk -v v="$version" -v d="$date" -v p="$previous" -v repo="$repo" '
  /^## \[Unreleased\]/ { print; print ""; print "## [" v "] - " d; next }
  /^\[Unreleased\]: / {
    print "[Unreleased]: " repo "/compare/v" v "...HEAD"
    print "[" v "]: " repo "/compare/v" p "...v" v
    next
  }
  { print }' CHANGELOG.md >CHANGELOG.md.new
mv CHANGELOG.md.new CHANGELOG.md
# The layouts pin the released image by its tag.
for k in $(git ls-files 'deploy/kustomize/*kustomization.yaml'); do
  sed -i -E "s/^(\s*newTag: )\"$previous\"/\1\"$version\"/" "$k"
done
# The chart's version is rebound's, and its image tag defaults to appVersion.
sed -i -E "s/^version: .*/version: $version/; s/^appVersion: .*/appVersion: \"$version\"/" deploy/helm/rebound/Chart.yaml

git commit -q -am "Release $version"
git tag -a "v$version" -m "rebound $version"
echo "release: committed and tagged v$version; building its artifacts"
make --no-print-directory dist
