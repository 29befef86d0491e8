#!/usr/bin/env bash
# PyTorch 2.x compatibility: torch 2.6 from Debian 13 in a debootstrap root (spec
# pytorch-checkpoint.md §6), built and cached by tools/pyenv.sh, used through its `python`
# wrapper as the walkthrough's users do. Loads our checkpoints with weights_only=True and
# reloads them into python/train_tiny_qwen3.py's model; runs test_interop.py under torch 2.x
# and the walkthrough's steps 3-5 as typed (walkthrough_steps.sh).
# usage: torch2_compat.sh path/to/tiny-qwen3 CACHE_DIR     (exit 77 = skipped)
set -euo pipefail
bin=$(realpath "$1")
root=$(realpath -m "$2")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$(dirname "$root")"
rc=0
bash "$repo/tools/pyenv.sh" "$root" >"$root.pyenv.out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
  # 77: no root to build with, no Debian mirror, no mount namespaces: nothing of ours was tested
  [ "$rc" -eq 77 ] && echo "SKIP: the torch 2.x environment cannot be set up here:"
  cat "$root.pyenv.out"
  exit "$rc"
fi
work=$(mktemp -d "$(dirname "$root")/torch2-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" train --output bf16.pt >/dev/null
"$bin" train --dtype float32 --output f32.pt >/dev/null
# a text run's checkpoint: the optimizer's and loader's state beside the model
for i in $(seq 1 40); do echo "the cat $i sat on the mat and the dog $((i * 7)) ran to the park"; done >text.txt
"$bin" tokenizer-train --vocab-size 300 --input text.txt --out tok.json >/dev/null
"$bin" prepare --tokenizer tok.json --input text.txt --val-fraction 0.2 --out shards >/dev/null
"$bin" train --data shards --steps 3 --output text.pt >/dev/null
pyenv=$(dirname "$root")/pyenv
PYTHONPATH="$repo/python" "$pyenv/bin/python3" "$here/torch2_check.py" bf16.pt f32.pt text.pt
# imports and exports again, now with torch 2.x and the real `safetensors` package
"$pyenv/bin/python3" "$here/test_interop.py" "$bin"
bash "$here/walkthrough_steps.sh" "$pyenv" "$repo"
