#!/usr/bin/env bash
# The device check, one command on a GPU machine (CUDA 13, PyTorch 2.x, no network), within
# 5 minutes: the CUDA tests, the CUDA backend against the CPU backend and against PyTorch on
# the same GPU, data-parallel training on 2 GPUs where there are 2 (NCCL, under mpirun), and a
# benchmark against PyTorch eager and torch.compile; one table at the end.
# usage: bench/gpu_check.sh [BUILD]
#   BUILD: a build folder with tiny-qwen3 and tq_tests (default build-gpu). Where it has none,
#   the script builds one, which needs the Debian packages of tools/deps.sh; a GPU machine
#   without them runs what tools/gpu_bundle.sh made on a Debian 12 machine (carried along).
# Exit 0 when every check passes, 1 when one fails; benchmark rows never fail it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build-gpu}
py=${PYTHON:-python3}
if [ ! -x "$bin/tiny-qwen3" ] || [ ! -x "$bin/tq_tests" ]; then
  echo "building $bin"
  cmake -S "$root" -B "$bin" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$bin" -j"$(nproc)" --target tiny-qwen3 tq_tests >/dev/null || {
    echo "error: cannot build here; run tools/gpu_bundle.sh on a Debian 12 machine and bring $bin"
    exit 2
  }
fi
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tq="$bin/tiny-qwen3"
[ -x "$bin/tests/tq_tests" ] && tests="$bin/tests/tq_tests" || tests="$bin/tq_tests"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows=()
failed=0
row() { rows+=("$(printf "%-44s %s" "$1" "$2")"); }
verdict() { if [ "$1" = 1 ]; then echo PASS; else failed=1; echo FAIL; fi; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"

# 1. kernel and model tests
timeout 120 "$tests" --gtest_filter='Cuda*:Shapes/CudaAttention*' >"$out/tests" 2>&1
rc=$?
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out/tests")
skipped=$(grep -c '^\[  SKIPPED \] .*(' "$out/tests")
ok=0; [ "$rc" = 0 ] && [ "$skipped" = 0 ] && [ -n "$passed" ] && ok=1
[ "$ok" = 1 ] || grep -m1 -A1 -E 'Skipped|Failure' "$out/tests"
row "CUDA kernel and model tests" "${passed:-0} passed, $skipped skipped $(verdict $ok)"

# 2. the walkthrough on both backends: fp32 every step, bf16 step 5 and the final loss
losses() { sed -n 's/^step \([0-9]*\): loss=\([0-9.]*\).*/\2/p' "$1"; }
for dt in float32 bfloat16; do
  for be in cuda cpu; do
    timeout 120 "$tq" train --backend "$be" --dtype "$dt" --steps 20 --output "$out/$be-$dt.pt" \
      >"$out/$be-$dt.log" 2>&1 || true
  done
done
grep '^device' "$out/cuda-float32.log" || grep -m1 error "$out/cuda-float32.log"
d32=$(paste <(losses "$out/cuda-float32.log") <(losses "$out/cpu-float32.log") |
  awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ } END { if (n == 20) printf "%.2e", m; else print "missing" }')
ok=0; [ "$d32" != missing ] && lt "$d32" 1e-4 && ok=1
row "fp32 20 step losses, CUDA vs CPU" "max |diff| $d32 (limit 1e-4) $(verdict $ok)"
b5c=$(losses "$out/cuda-bfloat16.log" | sed -n 5p)
b5h=$(losses "$out/cpu-bfloat16.log" | sed -n 5p)
d5=$(awk -v a="${b5c:-nan}" -v b="${b5h:-nan}" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.4f", d }')
ok=0; [ -n "$b5c" ] && [ -n "$b5h" ] && lt "$d5" 0.05 && ok=1
row "bf16 step 5, CUDA vs CPU" "$b5c vs $b5h, |diff| $d5 (limit 0.05) $(verdict $ok)"
fin=$(sed -n 's/^final loss: \([0-9.]*\)/\1/p' "$out/cuda-bfloat16.log")
ok=0; [ -n "$fin" ] && lt "$fin" 3.0 && ok=1
row "bf16 final loss on CUDA" "${fin:-none} (limit < 3.0) $(verdict $ok)"

# 3. first-step gradients against PyTorch fp32 on the same GPU
timeout 60 "$tq" train --backend cuda --dtype float32 --steps 1 --output "$out/g.pt" \
  --dump-first-step "$out/dump.pt" >/dev/null 2>&1
g=$(timeout 120 "$py" "$root/bench/gpu_torch.py" grads "$out/dump.pt" 2>"$out/grads.err")
ok=0; [ -n "$g" ] && lt "${g%% *}" 1e-4 && ok=1
[ -n "$g" ] || tail -3 "$out/grads.err"
row "fp32 first-step grads vs PyTorch (GPU)" "worst rel L2 ${g:-error} (limit 1e-4) $(verdict $ok)"

# 4. data-parallel training, 2 ranks on 2 GPUs (NCCL), against 1 GPU accumulating the same
#    global batch (--batch-size is each rank's): the fp32 losses agree (the gradient sums differ
#    only in order), and the tokens/s scaling (not a test; mean step ms after step 5)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -lt 2 ] || ! command -v mpirun >/dev/null; then
  echo "data-parallel check skipped: $([ "$ngpu" -lt 2 ] && echo "$ngpu GPU(s), it needs 2" ||
    echo "no mpirun (the build needs MPI: libopenmpi-dev)")"
else
  d="$out/dp"
  mkdir -p "$d"
  # shellcheck source=tests/made_up.sh
  source "$root/tests/made_up.sh"  # the training tests' made-up documents, 12,000 of them
  made_up_shards "$tq" "$d" 7 12000 2>/dev/null || echo "error: could not make the data-parallel check's shards"
  dp=(--data "$d/shards" --preset debugmodel --dtype float32 --batch-size 16 --seq-len 512
    --steps 20 --optimizer adamw)
  root_flag=(); [ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)
  timeout 150 "$tq" train --backend cuda "${dp[@]}" --grad-accum 2 --output "$d/one.pt" \
    >"$d/one.log" 2>&1
  timeout 150 mpirun -np 2 --oversubscribe "${root_flag[@]}" -x LD_LIBRARY_PATH \
    "$tq" train --backend cuda "${dp[@]}" --output "$d/two.pt" >"$d/two.log" 2>&1
  # "step  3/20 | loss 9.123456 | ... | 12.3 ms" -> "3 9.123456 12.3", each step once
  steps() {
    awk -F' [|] ' '/^step +[0-9]+\/[0-9]+ [|] loss / { split($1, a, "[ /]+")
      if (!seen[a[2]]++) { sub(/^loss /, "", $2); sub(/ ms$/, "", $6); print a[2], $2, $6 } }' "$1"
  }
  read -r dl n1 n2 <<<"$(join <(steps "$d/one.log" | sort -k1,1) <(steps "$d/two.log" | sort -k1,1) |
    awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d; n++
           if ($1 > 5) { a += $3; b += $5; k++ } }
         END { if (n == 20 && a > 0 && b > 0) printf "%.2e %.0f %.0f", m, k * 16384e3 / a, k * 16384e3 / b
               else print "missing" }')"
  ok=0; [ "$dl" != missing ] && lt "$dl" 1e-3 && ok=1
  [ "$ok" = 1 ] || grep -m2 -iE 'error|abort' "$d/two.log" "$d/one.log"
  row "fp32 20 step losses, 2 GPUs vs 1 (accum 2)" "max |diff| $dl (limit 1e-3) $(verdict $ok)"
  [ "$dl" != missing ] && row "bench: data-parallel scaling (B=2x16, T=512)" "1 GPU $n1 tok/s, 2 GPUs $n2 tok/s: $(
    awk -v a="$n1" -v b="$n2" 'BEGIN { printf "%.0f%%", 100 * b / (2 * a) }') efficiency"
fi

# 5. benchmark (not a test): step times in the same run
ours() {  # preset dtype B T steps -> "median_ms GFLOP/s" (TorchTitan's count, the speed line)
  timeout 150 "$tq" train --backend cuda --preset "$1" --dtype "$2" --batch-size "$3" --seq-len "$4" \
    --steps "$5" --output "$out/b.pt" 2>&1 |
    sed -n 's/^speed: median step \([0-9.]*\) ms, [0-9]* tokens\/s, \([0-9.]*\) GFLOP.*/\1 \2/p'
}
torch_ms() {  # mode preset dtype B T steps -> median ms
  timeout 150 "$py" "$root/bench/gpu_torch.py" time "$@" 2>>"$out/torch.err" | cut -d' ' -f1
}
bench_row() {  # label preset dtype B T steps
  local o gf e c mfu
  read -r o gf <<<"$(ours "$2" "$3" "$4" "$5" "$6")"
  e=$(torch_ms eager "$2" "$3" "$4" "$5" "$6")
  c=$(torch_ms compile "$2" "$3" "$4" "$5" "$6")
  # against the H100/H200 dense bf16 peak, 989 TFLOP/s
  mfu=$(awk -v g="${gf:-0}" 'BEGIN { printf "%.1f%%", 100 * g / 989e3 }')
  row "$1" "ours ${o:-fail} ms (MFU $mfu) | eager ${e:-fail} ms | compile ${c:-fail} ms$(
    [ -n "$o" ] && [ -n "$e" ] && awk -v o="$o" -v e="$e" -v c="${c:-0}" 'BEGIN {
      printf " | %.2fx eager", e / o; if (c > 0) printf ", %.2fx compile", c / o }')"
}
bench_row "bench: walkthrough (B=1, T=32, bf16)" debugmodel bfloat16 1 32 20
bench_row "bench: 0.6B (B=8, T=1024, bf16)" 0.6B bfloat16 8 1024 5
[ -s "$out/torch.err" ] && tail -3 "$out/torch.err"

echo
printf "%-44s %s\n" check result
printf "%s\n" "${rows[@]}"
exit $failed
