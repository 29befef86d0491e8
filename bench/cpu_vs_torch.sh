#!/usr/bin/env bash
# Walkthrough step time (B=1, T=32, debugmodel, SGD): tiny-qwen3 against plain PyTorch eager
# (Debian's torch under /usr/bin/python3) measured in the same run, both dtypes, the same
# thread count. Prints median ms/step and the ratio. usage: bench/cpu_vs_torch.sh [THREADS] [STEPS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-$(nproc)}
steps=${2:-20}
bash "$root/tools/deps.sh" --bench
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target tiny-qwen3 >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# PyTorch's sgemm comes from libblas.so.3 (OpenBLAS here, which oversubscribes the cores with
# torch's OpenMP threads); BLIS with OpenMP is the other option on Debian 12. Report its best
# over {libblas.so.3, BLIS} x {1, THREADS} threads.
blis=/usr/lib/x86_64-linux-gnu/blis-openmp
torch_best() {  # dtype -> "ms config"
  local best="" cfg ms t
  for t in 1 "$threads"; do
    for cfg in default blis; do
      [ "$cfg" = blis ] && [ ! -d "$blis" ] && continue
      if [ "$cfg" = blis ]; then
        ms=$(LD_LIBRARY_PATH=$blis OMP_NUM_THREADS=$t /usr/bin/python3 "$root/bench/torch_step.py" "$1" "$t" "$steps")
      else
        ms=$(OMP_NUM_THREADS=$t /usr/bin/python3 "$root/bench/torch_step.py" "$1" "$t" "$steps")
      fi
      if [ -z "$best" ] || (($(echo "$ms < ${best%% *}" | bc -l))); then best="$ms $cfg/${t}t"; fi
    done
  done
  echo "$best"
}
[ -d "$blis" ] || echo "(libblis4-openmp not installed: PyTorch measured with libblas.so.3 only)"
printf "%-10s %8s %14s %14s %-14s %8s\n" dtype threads "tiny-qwen3 ms" "pytorch ms" "(torch config)" ratio
for dtype in float32 bfloat16; do
  ours=$("$root/build/tiny-qwen3" train --dtype "$dtype" --threads "$threads" --steps "$steps" \
    --output "$out/x.pt" | sed -n 's/^speed: median step \([0-9.]*\) ms.*/\1/p')
  read -r theirs cfg <<<"$(torch_best "$dtype")"
  printf "%-10s %8s %14s %14s %-14s %7.2fx\n" "$dtype" "$threads" "$ours" "$theirs" "$cfg" \
    "$(echo "$theirs / $ours" | bc -l)"
done
