#!/usr/bin/env bash
# The demo's budget as a race: tiny-qwen3 and PyTorch 2.6 (bench/train_torch.py race) each train
# debugmodel with AdamW (TorchTitan's defaults, clipping) on the demo's data (B=8, T=256,
# sequential windows, causal attention, DTYPE) for BUDGET seconds of wall time (default 600:
# tools/demo.sh's), then report the mean val loss over the same first 32768 val tokens. Each side
# times a few steps first and sizes its schedule to the steps that fit in what is left of the
# budget (TorchTitan's schedule depends on the total), so each ends its decay inside it.
# Ours counts its start, the probe, the run, its validation and its final checkpoint save;
# PyTorch's its probe and run (its validation and start-up come after the clock). Prints
# steps, seconds and val loss of each.
# usage: bench/demo_race.sh [THREADS] [DTYPE]     BUDGET=seconds
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-$(nproc)}
dtype=${2:-bfloat16}
budget=${BUDGET:-600}
# shellcheck source=bench/demo_data.sh
source "$root/bench/demo_data.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
py=$root/build/pyenv/bin/python3
if ! bash "$root/tools/pyenv.sh" >/dev/null 2>&1; then
  py=/usr/bin/python3
  echo "note: no torch 2.x environment here (tools/pyenv.sh); PyTorch is Debian 12's 1.13"
fi
run_env=(OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0
  MALLOC_TRIM_THRESHOLD_=68719476736)
flags=(--data "$shards" --dtype "$dtype" --batch-size 8 --seq-len 256 --attention causal
  --data-order sequential --threads "$threads")

started=$(date +%s.%N)
env "${run_env[@]}" "$tq" train "${flags[@]}" --steps 4 --metrics "$out/probe.jsonl" \
  --output "$out/probe.pt" >/dev/null 2>&1 || true
ms=$(python3 -c 'import json, statistics, sys
print(statistics.median([json.loads(l)["ms"] for l in open(sys.argv[1]) if "ms" in l][1:]))' \
  "$out/probe.jsonl")
left=$(python3 -c "import sys; print(max(0.0, $budget - ($(date +%s.%N) - $started)))")
# what the run spends besides its steps: its validation (16 forward windows, ~ a third of a
# step each) and the checkpoint, about 6 steps' time
steps=$(python3 -c "print(max(1, int($left * 1000 / $ms) - 6))")
env "${run_env[@]}" "$tq" train "${flags[@]}" --steps "$steps" --val-every "$steps" \
  --val-tokens 32768 --metrics "$out/m.jsonl" --output "$out/x.pt" >"$out/log" 2>&1 || true
ours_s=$(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')")
ours_val=$(python3 -c 'import json, sys
print([json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1])' "$out/m.jsonl")
theirs=$(env "${run_env[@]}" "$py" "$root/bench/train_torch.py" race "$shards" "$dtype" "$threads" \
  8 256 "$budget" 32768 | grep '^race')
read -r _ t_steps t_s t_val <<<"$theirs"
echo "demo race, $dtype, $threads threads, budget $budget s ($(python3 -c "print(f'{$ms:.0f}')") ms a step for ours)"
printf '%-10s %6s %9s %10s\n' side steps seconds "val loss"
printf '%-10s %6s %9s %10.4f\n' tiny-qwen3 "$steps" "$ours_s" "$ours_val"
printf '%-10s %6s %9s %10.4f\n' pytorch "$t_steps" "$t_s" "$t_val"
