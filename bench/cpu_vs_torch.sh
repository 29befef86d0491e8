#!/usr/bin/env bash
# tiny-qwen3 against plain PyTorch eager (Debian's torch under /usr/bin/python3, the same model
# and SGD update in python/train_tiny_qwen3.py) measured in the same run, the same dtype,
# threads and batch, for W1 = the walkthrough (B=1, T=32) and W2 = (B=8, T=256), debugmodel.
# One table: median ms/step after warm-up, tokens/s, GFLOP/s (TorchTitan's count, the
# `speed:` line), % of this machine's measured peak (bench/peak.cpp) by that count and by
# the causal count (attention's masked half not counted: W2 445 GFLOP), the ratio to PyTorch's
# best configuration ({libblas.so.3, BLIS} x {1, THREADS} threads), and tiny-qwen3's peak
# RSS against the memory it plans (parameters, gradients, activations, scratch).
# usage: bench/cpu_vs_torch.sh [THREADS] [STEPS] [WORKLOADS]   e.g. 2 10 "W1 W2"
# ROUNDS=N (default 2): rounds per row, the fastest of each side reported (below).
# Both sides run with glibc keeping freed memory (MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0
# MALLOC_TRIM_THRESHOLD_ large): PyTorch frees its gradients and activations every step, and by
# default glibc hands them back to the kernel, so that every step faults them in again; on a
# VM where a fault costs ~10 us (the Zen 5 VM: first touch of 128 MiB 329 ms, then
# 4.5 ms) that made PyTorch's W1 fp32 step 407 ms instead of 86. tiny-qwen3 allocates before
# step 0 and is unaffected. PEER_MALLOC=glibc measures with glibc's defaults instead.
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, which some machines set to pin OpenBLAS to an older
# kernel, are unset for both sides, as on a fresh machine; KEEP_OPENBLAS_ENV=1 keeps them.
set -euo pipefail
if [ "${KEEP_OPENBLAS_ENV:-0}" != 1 ]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-$(nproc)}
steps=${2:-10}
workloads=${3:-W1 W2}
bash "$root/tools/deps.sh" --bench
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target tiny-qwen3 tq_peak >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The peak is read before every row and at the end, and the table printed against the highest
# reading: on a shared VM a single reading taken in a slow moment (seen: fp32 155 against 230
# GFLOP/s) would inflate every %peak.
declare -A peak low
readings=0
read_peak() {
  local kind gf
  while read -r kind gf; do
    if [ -z "${peak[$kind]:-}" ] || (($(echo "$gf > ${peak[$kind]}" | bc -l))); then peak[$kind]=$gf; fi
    if [ -z "${low[$kind]:-}" ] || (($(echo "$gf < ${low[$kind]}" | bc -l))); then low[$kind]=$gf; fi
  done < <(OMP_NUM_THREADS=$threads "$root/build/tq_peak")
  readings=$((readings + 1))
}
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  echo "note: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE picks OpenBLAS's sgemm kernel for both sides"
fi
# PyTorch takes its sgemm from libblas.so.3 (OpenBLAS here; its threads oversubscribe the cores
# with torch's OpenMP threads); BLIS with OpenMP is the other option on Debian 12.
blis=/usr/lib/x86_64-linux-gnu/blis-openmp
[ -d "$blis" ] || echo "(libblis4-openmp not installed: PyTorch measured with libblas.so.3 only)"
malloc_env=(MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736)
[ "${PEER_MALLOC:-keep}" = glibc ] && malloc_env=()
# Debian 12's BLIS (0.9) knows CPUs up to Zen 3 and Ice Lake: on newer ones (Zen 5: family 26)
# it picks its portable 'generic' kernels (W2 fp32 products ~70 against ~360 GFLOP/s). Then
# its AVX-512 ('skx') or AVX2 ('haswell') kernels are selected by BLIS_ARCH_TYPE (its arch_t).
blis_arch=()
if [ -d "$blis" ]; then
  sub=$(BLIS_ARCH_DEBUG=1 LD_LIBRARY_PATH=$blis /usr/bin/python3 -c \
    'import torch; a = torch.ones(8, 8); a @ a' 2>&1 | sed -n "s/.*sub-configuration '\([a-z0-9]*\)'.*/\1/p" | head -1)
  if [ "$sub" = generic ]; then
    if grep -qw avx512f /proc/cpuinfo; then blis_arch=(BLIS_ARCH_TYPE=0) sub=skx
    elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then blis_arch=(BLIS_ARCH_TYPE=3) sub=haswell
    fi
    [ ${#blis_arch[@]} -gt 0 ] && echo "note: BLIS does not know this CPU; PyTorch's BLIS runs use its '$sub' kernels"
  fi
fi
# A PyTorch configuration that runs past TORCH_TIMEOUT seconds (default 600; PyTorch's bf16 on
# CPUs without AVX-512 BF16 takes minutes a step) is stopped and reported as a lower bound.
torch_timeout=${TORCH_TIMEOUT:-600}
torch_run() {  # dtype threads config B T -> median ms (fails when it times out)
  local lib=()
  [ "$3" = blis ] && lib=(LD_LIBRARY_PATH=$blis "${blis_arch[@]}")
  OMP_NUM_THREADS=$2 timeout "$torch_timeout" env "${malloc_env[@]}" "${lib[@]}" /usr/bin/python3 \
    "$root/bench/torch_step.py" "$1" "$2" "$steps" "$4" "$5"
}
torch_best() {  # dtype B T -> "ms config", ms prefixed with ">" when every config timed out
  local best="" bound="" cfg ms t ts=(1)
  [ "$threads" != 1 ] && ts+=("$threads")
  for t in "${ts[@]}"; do
    for cfg in default blis; do
      [ "$cfg" = blis ] && [ ! -d "$blis" ] && continue
      if ! ms=$(torch_run "$1" "$t" "$cfg" "$2" "$3"); then
        [ -n "$bound" ] || bound="$(echo "$torch_timeout * 1000 / ($steps + 2)" | bc) $cfg/${t}t"
        continue
      fi
      if [ -z "$best" ] || (($(echo "$ms < ${best%% *}" | bc -l))); then best="$ms $cfg/${t}t"; fi
    done
  done
  if [ -n "$best" ]; then echo "$best"; else echo ">$bound"; fi
}
ours() {  # dtype B T -> "ms tokens/s GFLOP/s plan_MiB rss_MiB"
  /usr/bin/time -v -o "$out/time" env "${malloc_env[@]}" "$root/build/tiny-qwen3" train --dtype "$1" \
    --threads "$threads" --steps "$((steps + 2))" --batch-size "$2" --seq-len "$3" \
    --output "$out/x.pt" >"$out/log" || true  # a too-short run "fails" to learn: still timed
  echo "$(sed -n 's/^speed: median step \([0-9.]*\) ms, \([0-9]*\) tokens\/s, \([0-9.]*\) GFLOP.*/\1 \2 \3/p' "$out/log")" \
    "$(sed -n 's/^memory: \([0-9.]*\) MiB planned.*/\1/p' "$out/log")" \
    "$(awk -F': ' '/Maximum resident/{printf "%.0f", $2 / 1024}' "$out/time")"
}
# A shared VM has slow phases of seconds to minutes that slow both sides by 20-30 % (seen on
# the Zen 5 VM: one row 1257 ms a step, 950-968 ms a minute later). So each row is measured in
# ROUNDS rounds (default 2): ours, then PyTorch's best configuration, alternately; each side's
# fastest round is reported (the configuration search is the first round of PyTorch's).
rounds=${ROUNDS:-2}
rows=()
for w in $workloads; do
  case $w in W1) B=1 T=32 ;; W2) B=8 T=256 ;; *) echo "unknown workload $w" >&2; exit 2 ;; esac
  for dtype in float32 bfloat16; do
    read_peak
    read -r ms tps gf plan rss <<<"$(ours "$dtype" $B $T)"
    read -r theirs cfg <<<"$(torch_best "$dtype" $B $T)"
    bt=${cfg##*/} bt=${bt%t}  # PyTorch's best configuration: "$bt" threads, "${cfg%%/*}" BLAS
    for ((r = 1; r < rounds; r++)); do
      read -r ms2 tps2 gf2 _ rss2 <<<"$(ours "$dtype" $B $T)"
      if (($(echo "$ms2 < $ms" | bc -l))); then ms=$ms2 tps=$tps2 gf=$gf2; fi
      ((rss2 > rss)) && rss=$rss2
      if [ "${theirs#>}" = "$theirs" ] && t2=$(torch_run "$dtype" "$bt" "${cfg%%/*}" $B $T) &&
        (($(echo "$t2 < $theirs" | bc -l))); then theirs=$t2; fi
    done
    k=fp32
    [ "$dtype" = bfloat16 ] && k=bf16
    # %peak(c): the causal count -- attention's 6 L H D (T+1) per token instead of
    # TorchTitan's dense 12 L H D T (debugmodel: L=8, H=16, D=128) -- the work a step needs
    gfc=$(echo "$gf - $B * $T * 8 * 16 * 128 * (12 * $T - 6 * ($T + 1)) / ($ms * 1000000)" | bc -l)
    rows+=("$w $dtype $ms $tps $gf $gfc $k $theirs $cfg $rss/$plan")
  done
done
read_peak
echo "measured peak, $threads threads: fp32 ${peak[fp32]} GFLOP/s, bf16 ${peak[bf16]} GFLOP/s" \
  "(highest of $readings readings; lowest ${low[fp32]} / ${low[bf16]})"
printf "%-4s %-9s %9s %9s %8s %6s %8s %11s %-11s %7s %14s\n" work dtype "ms/step" "tokens/s" "GFLOP/s" \
  "%peak" "%peak(c)" "pytorch ms" "(config)" ratio "RSS/plan MiB"
for row in "${rows[@]}"; do
  read -r w dtype ms tps gf gfc k theirs cfg mem <<<"$row"
  gt=""
  [ "${theirs#>}" != "$theirs" ] && gt=">"  # a bound: PyTorch timed out
  # ratios and % of peak cut to the digits shown, not rounded: 1.996x reads 1.99x, not a met 2x
  printf "%-4s %-9s %9s %9s %8s %5.1f%% %7.1f%% %11s %-11s %7s %14s\n" "$w" "$dtype" "$ms" "$tps" \
    "$gf" "$(echo "scale = 1; 100 * $gf / ${peak[$k]}" | bc)" \
    "$(echo "scale = 1; 100 * $gfc / ${peak[$k]}" | bc)" "$theirs" "$cfg" \
    "$gt$(printf "%.2fx" "$(echo "scale = 2; ${theirs#>} / $ms" | bc)")" "$mem"
done
