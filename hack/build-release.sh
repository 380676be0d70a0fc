#!/usr/bin/env bash
# Builds the `etcdfleet` binary of a recorded release (CHANGELOG.md) from the
# commit it was cut from, for the previous-release upgrade test.
#
#   hack/build-release.sh [previous | <version>]     (default: previous)
#
# "previous" is the newest CHANGELOG entry with a `commit:` line. The commit
# is checked out as a git worktree at target/releases/<commit> (its
# manifests, config/, are what the test installs), and built with cargo
# into a target directory kept outside the clone and shared by every
# release build (ETCDFLEET_CACHE, default ~/.cache/etcdfleet/releases), so
# the dependencies compile once. The binary is cached there keyed by the
# commit: a second run only prints its path. Output, on the last line:
#   <version> <commit> <binary> <worktree>
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${ETCDFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/etcdfleet}/releases
want=${1:-previous}
fail() { echo "release: FAILED: $*" >&2; exit 1; }

# "<version> <commit>" of each released entry, newest first.
releases() {
  awk '/^## v/ { v = $2 } /^- commit: / { if (v != "") print v, $3; v = "" }' "$root/CHANGELOG.md"
}
case "$want" in
previous) line=$(releases | head -1) ;;
*) line=$(releases | awk -v w="$want" '$1 == w' | head -1) ;;
esac
[ -n "$line" ] || fail "no released entry '$want' with a commit in CHANGELOG.md"
version=${line%% *}
commit=${line#* }
git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null ||
  fail "$version: commit $commit is not in this clone (fetch main's history)"

worktree="$root/target/releases/$commit"
if [ ! -f "$worktree/Cargo.toml" ]; then
  rm -rf "$worktree"
  git -C "$root" worktree prune
  git -C "$root" worktree add --detach --force "$worktree" "$commit" >/dev/null
fi

out="$cache/$commit"
if [ ! -x "$out/etcdfleet" ]; then
  echo "release: building etcdfleet $version from $commit (cold: several minutes)" >&2
  mkdir -p "$cache"
  (cd "$worktree" && CARGO_TARGET_DIR="$cache/target" \
    cargo build --locked -p etcdfleet-controllers --bin etcdfleet >&2) ||
    fail "cargo build of $version ($commit)"
  mkdir -p "$out"
  cp "$cache/target/debug/etcdfleet" "$out/etcdfleet.tmp"
  mv "$out/etcdfleet.tmp" "$out/etcdfleet"
fi
"$out/etcdfleet" --version >/dev/null || fail "$out/etcdfleet does not run"
echo "$version $commit $out/etcdfleet $worktree"
