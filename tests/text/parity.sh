#!/usr/bin/env bash
# Tokenizer parity: tiny-qwen3's `encode` and `decode` against Hugging Face tokenizers 0.22.2
# (tests/text/hf.js, the Rust library through its Node binding) on every file of INPUT_DIR.
# usage: tests/text/parity.sh TQ_BINARY TOKENIZER.json INPUT_DIR [--jsonl FILE.jsonl]
# Each file is one document (FILE.py-replace files, written by make_inputs.py next to invalid
# UTF-8 inputs, are not inputs: they are checked to equal Node's decoding of their file). For
# each: our ids (`encode --tokenizer T --input FILE`) equal HF's, and our `decode` of them
# equals HF's decode of the same ids, byte for byte. With --jsonl, `encode --jsonl` of FILE
# equals HF's encoding of each line's "text". One line per failing file (the first differing
# token, with the ids and tokens around it), then a summary; exit 1 on any difference, 77
# (skip) when node or the npm packages (tools/npm_deps.sh) are missing, 2 on a bad invocation.
# TQ_NODE_MODULES: where the packages are (default build/node/node_modules).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
usage() {
  echo "usage: tests/text/parity.sh TQ_BINARY TOKENIZER.json INPUT_DIR [--jsonl FILE.jsonl]" >&2
  exit 2
}
[ $# -ge 3 ] || usage
bin=$1 tok=$2 dir=$3
shift 3
jsonl=""
while [ $# -gt 0 ]; do
  case $1 in
    --jsonl) [ $# -ge 2 ] || usage; jsonl=$2; shift 2 ;;
    *) usage ;;
  esac
done
modules=${TQ_NODE_MODULES:-$root/build/node/node_modules}
if ! command -v node >/dev/null 2>&1; then
  echo "skip: node not found (the tokenizer parity test compares with Hugging Face's through Node.js)"
  exit 77
fi
if [ ! -d "$modules/@anush008/tokenizers" ]; then
  echo "skip: Hugging Face tokenizers not installed in $modules (bash tools/npm_deps.sh build/node)"
  exit 77
fi
[ -x "$bin" ] || { echo "error: $bin is not an executable" >&2; exit 2; }
[ -f "$tok" ] || { echo "error: no tokenizer file $tok" >&2; exit 2; }
[ -d "$dir" ] || { echo "error: no input folder $dir" >&2; exit 2; }
[ -z "$jsonl" ] || [ -f "$jsonl" ] || { echo "error: no JSONL file $jsonl" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
empty_failed=0
mapfile -d '' files < <(find "$dir" -maxdepth 1 -type f ! -name '*.py-replace' -print0 | LC_ALL=C sort -z)
[ ${#files[@]} -gt 0 ] || { echo "error: no files in $dir" >&2; exit 2; }
: >"$work/manifest"
i=0
for f in "${files[@]}"; do
  case $f in *$'\t'* | *$'\n'*) echo "error: a tab or newline in the file name $f" >&2; exit 2 ;; esac
  i=$((i + 1))
  ids=$work/$i.ids dec=$work/$i.dec err=$work/$i.err
  if [ ! -s "$f" ]; then  # an empty input is refused (HF gives no ids): one error line, exit 2
    status=0
    "$bin" encode --tokenizer "$tok" --input "$f" >"$ids" 2>"$err" || status=$?
    if [ "$status" != 2 ] || [ -s "$ids" ] || [ "$(grep -c '^error: ' "$err")" != 1 ]; then
      echo "FAIL $(basename "$f"): an empty input gave exit $status, $(wc -c <"$ids") bytes of output"
      empty_failed=1
    fi
    continue
  fi
  status=0
  "$bin" encode --tokenizer "$tok" --input "$f" >"$ids" 2>"$err" || status=$?
  if [ "$status" = 0 ]; then
    "$bin" decode --tokenizer "$tok" --input "$ids" >"$dec" 2>>"$err" || status=$?
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$f" "$ids" "$dec" "$status" "$err" >>"$work/manifest"
done
extra=()
if [ -n "$jsonl" ]; then
  status=0
  "$bin" encode --tokenizer "$tok" --input "$jsonl" --jsonl >"$work/jsonl.ids" 2>"$work/jsonl.err" || status=$?
  extra=(--jsonl "$jsonl" "$work/jsonl.ids" "$status" "$work/jsonl.err")
fi
rc=0
TQ_NODE_MODULES=$modules node "$root/tests/text/hf.js" parity "$tok" "$work/manifest" "${extra[@]}" || rc=$?
[ "$empty_failed" = 0 ] || [ "$rc" != 0 ] || rc=1
exit "$rc"
