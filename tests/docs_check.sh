#!/usr/bin/env bash
# The docs describe the project as it is: no tracked file labels work by the session that did
# it ("st-op 12", "st-ops 3-5"), README.md stays short enough to read (at most 300 lines), and
# every relative link in README.md and docs/ names a file that exists.
# usage: docs_check.sh [REPO_ROOT] | docs_check.sh --self-test
set -uo pipefail
if [ "${1:-}" = --self-test ]; then
  # A tree with each fault must fail with each message; a clean one must pass.
  t=$(mktemp -d)
  trap 'rm -rf "$t"' EXIT
  git -C "$t" init -q && mkdir "$t/docs"
  printf 'see [a](docs/a.md) and [b](docs/b.md#x)\n' >"$t/README.md"
  printf 'plain text\n' >"$t/docs/a.md"
  printf '# x\n' >"$t/docs/b.md"
  git -C "$t" add -A
  bash "$0" "$t" >/dev/null || { echo "FAIL: a clean tree is refused"; bash "$0" "$t"; exit 1; }
  { for _ in $(seq 300); do echo x; done; } >>"$t/README.md"
  printf 'measured in St%s 41\n' op >"$t/docs/a.md"
  rm "$t/docs/b.md"
  git -C "$t" add -A
  out=$(bash "$0" "$t") && { echo "FAIL: a faulty tree passes"; exit 1; }
  for want in 'history labels' 'README.md has 301 lines' 'links to docs/b.md#x'; do
    grep -q "$want" <<<"$out" || { echo "FAIL: no '$want' in: $out"; exit 1; }
  done
  echo "docs check self-test: a clean tree passes; labels, length and broken links are caught"
  exit 0
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
fail=0

# The pattern is spelled so that this file does not match it.
pattern='st[o]ps? [0-9]+'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  hits=$(git grep -n -I -i -P "$pattern" -- . || true)
else  # a copy without .git: every file but the build folders
  hits=$(grep -rnIiP "$pattern" --exclude-dir='.git' --exclude-dir='build*' . || true)
fi
if [ -n "$hits" ]; then
  echo "FAIL: history labels in tracked files (say what is true now; the history is git log's):"
  echo "$hits" | head -20
  fail=1
fi

lines=$(wc -l <README.md)
if [ "$lines" -gt 300 ]; then
  echo "FAIL: README.md has $lines lines (at most 300: depth goes in docs/)"
  fail=1
fi

# Relative links [text](path#anchor) must resolve from the file that holds them.
for md in README.md docs/*.md; do
  [ -f "$md" ] || continue
  dir=$(dirname "$md")
  while IFS= read -r target; do
    path=${target%%#*}
    [ -n "$path" ] || continue
    case "$path" in http://* | https://* | mailto:*) continue ;; esac
    if [ ! -e "$dir/$path" ]; then
      echo "FAIL: $md links to $target, which does not exist"
      fail=1
    fi
  done < <(grep -oP '\]\(\K[^)\s]+(?=\))' "$md")
done

if [ "$fail" -eq 0 ]; then
  echo "docs: no history labels, README.md $lines lines, every relative link resolves"
fi
exit "$fail"
