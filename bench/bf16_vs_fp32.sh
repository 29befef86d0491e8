#!/usr/bin/env bash
# bf16 against fp32 training on text: "a bf16 run lands within 2 % of the fp32 loss curve after
# 200 steps on the demo data". Runs tools/demo.sh's training (debugmodel, AdamW with TorchTitan's
# defaults, B=8, T=256, shuffled windows, validation every 50 steps over 32768 val tokens) on the
# demo's shards (the Brown corpus, a 2048-token BPE, 5 % validation split; built once into
# build/bench-data/ and reused, as bench/train_vs_torch.sh) for STEPS (default 200) steps, once
# with --dtype float32 and once with --dtype bfloat16 (bf16 compute copy of fp32 master weights,
# fp32 AdamW moments), the same seed and windows. Prints each run's train loss (the mean of its
# last 10 steps) and its val loss at the last step, the relative difference |bf16 - fp32| / fp32
# of each, the val losses at every validation, and PASS (exit 0) when both differences are within
# 2 %, else FAIL (exit 1). The metrics are kept in build/bench-bf16-vs-fp32/ (`tiny-qwen3 plot`
# draws them).
# usage: bench/bf16_vs_fp32.sh [THREADS]       STEPS=N overrides the 200 steps
# About 2 x 200 steps of 3-7 s on 2 cores: 34 minutes on the 2-core Zen 3 VM with other work
# running (fp32 917 s, bf16 1065 s).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-200}
threads=()
[ $# -ge 1 ] && threads=(--threads "$1")
# shellcheck source=bench/demo_data.sh
source "$root/bench/demo_data.sh"

out=$root/build/bench-bf16-vs-fp32
mkdir -p "$out"
for dtype in float32 bfloat16; do
  echo "training $dtype, $steps steps (log: $out/$dtype.log)"
  started=$(date +%s)
  # tools/demo.sh's train line, less --log-every (the metrics have every step)
  if ! "$tq" train --data "$shards" --preset debugmodel --dtype "$dtype" --batch-size 8 \
    --seq-len 256 --steps "$steps" --data-order shuffled --val-every 50 --val-tokens 32768 \
    "${threads[@]}" --metrics "$out/$dtype.jsonl" --output "$out/$dtype.pt" >"$out/$dtype.log" 2>&1; then
    tail -3 "$out/$dtype.log"
    echo "FAIL: the $dtype run failed"
    exit 1
  fi
  echo "  $(grep -m1 '^device:' "$out/$dtype.log" || true); $(($(date +%s) - started)) s"
done

python3 - "$out/float32.jsonl" "$out/bfloat16.jsonl" <<'PY'
import json, sys

def load(path):
    rows = [json.loads(l) for l in open(path)]
    train = [r for r in rows if "loss" in r]
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    return train, val

(f_train, f_val), (b_train, b_val) = load(sys.argv[1]), load(sys.argv[2])
steps = f_train[-1]["step"]
n = min(10, len(f_train))
f_loss = sum(r["loss"] for r in f_train[-n:]) / n
b_loss = sum(r["loss"] for r in b_train[-n:]) / n
rel = lambda b, f: abs(b - f) / abs(f)
print(f"{'':28} {'float32':>10} {'bfloat16':>10} {'rel. diff':>10}")
for s in sorted(f_val):
    if s in b_val and s != steps:
        print(f"{f'val loss at step {s}':28} {f_val[s]:10.4f} {b_val[s]:10.4f} {100 * rel(b_val[s], f_val[s]):9.2f}%")
rows = [(f"train loss, last {n} steps", f_loss, b_loss), (f"val loss at step {steps}", f_val[steps], b_val[steps])]
ok = True
for name, f, b in rows:
    d = rel(b, f)
    ok &= d <= 0.02
    print(f"{name:28} {f:10.4f} {b:10.4f} {100 * d:9.2f}%")
if ok:
    print(f"PASS: bf16 within 2 % of fp32 after {steps} steps (train and val loss)")
else:
    print(f"FAIL: bf16 differs from fp32 by more than 2 % after {steps} steps")
sys.exit(0 if ok else 1)
PY
