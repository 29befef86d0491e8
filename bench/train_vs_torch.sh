#!/usr/bin/env bash
# Training on text against PyTorch: tokens/s of `tiny-qwen3 train --data SHARDS --optimizer
# adamw` and of PyTorch 2.6 doing the same steps (bench/train_torch.py), eager and torch.compile,
# measured in the same run with the same threads, for TorchTitan's debugmodel on the demo's
# shards (tools/demo.sh: the Brown corpus, a 2048-token BPE, 5 % validation split; built once
# into build/bench-data/ and reused):
#   demo:  B=8, T=256  (tools/demo.sh's shape)       STEPS_DEMO=6 timed after WARMUP_DEMO=2
#   t1024: B=8, T=1024                               STEPS_T1024=3 timed after WARMUP_T1024=1
# each in float32 and bfloat16 (DTYPES). One table: median ms/step after the warm-up steps and
# tokens/s (B*T / step) of each side, and ours/eager, ours/compile = our tokens/s over theirs.
# usage: bench/train_vs_torch.sh [THREADS] [WORKLOADS]     e.g. 2 "demo t1024"
#
# tiny-qwen3: `train --data --optimizer adamw --threads THREADS` with TorchTitan's defaults
# (lr 8e-4, betas (0.9, 0.95), eps 1e-8, wd 0.1, warmup 2, linear decay 0.8, max norm 1),
# sequential windows and causal attention, as the PyTorch side; a step's ms is the `ms` of its
# --metrics JSONL line (loader, forward, backward, clipping, AdamW, the bf16 copy). bfloat16:
# the model computes with a bf16 copy of fp32 master weights; the AdamW moments are fp32.
# PyTorch: python/train_tiny_qwen3.py's model and loss_fn with fp32 parameters,
# torch.optim.AdamW (same hyper-parameters), LambdaLR with the same schedule,
# clip_grad_norm_(1.0), the same windows of the same shards (llm.c's: step k reads tokens
# [k*B*T, k*B*T + B*T + 1)). bfloat16 is torch.autocast(device_type="cpu", dtype=bfloat16)
# around forward and loss with fp32 parameters, gradients and moments: what TorchTitan does on
# one device (maybe_enable_amp) and the equivalent of ours. AdamW's single-tensor, foreach and
# fused steps are timed first on a copy of the parameters; the fastest trains (named in the
# notes). "compile" wraps forward + loss in torch.compile (inductor; the optimizer eager, as
# TorchTitan); where torch.compile does not work here its columns read n/a and the reason is
# printed. PyTorch is Debian 13's torch 2.6 from tools/pyenv.sh; where that cannot be built
# (exit 77) Debian 12's torch 1.13 (/usr/bin/python3, eager only), said in the output.
# A PyTorch step that runs past TORCH_STEP_LIMIT (default 3) times our median step is stopped
# (without AVX-512 BF16 Debian's torch multiplies bf16 slowly: on the 2-core Zen 3 VM one of the
# model's products ran at 7 GFLOP/s in bf16, 84 in fp32; the notes print this machine's): that
# row then shows the stopped step's time so far as a bound, ">", and the ratio as ">".
# torch.compile's first step (the compilation) gets COMPILE_ALLOWANCE_S (default 900) s more.
# Both sides run with OMP_WAIT_POLICY=passive: PyTorch's OpenMP threads spin between parallel
# regions against OpenBLAS's (measured on the 2-core Zen 3 VM with other work running: the demo
# fp32 forward+backward 58.6 s spinning, 11.7 s passive; ours within noise either way);
# PEER_OMP=default keeps OpenMP's default. And with glibc keeping freed memory (MALLOC_ARENA_MAX=1
# MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_ large), as bench/cpu_vs_torch.sh (why: there);
# PEER_MALLOC=glibc measures with glibc's defaults.
# ROUNDS=N (default 1): rounds per row, ours, eager and compile alternately, each side's fastest
# reported. On a shared machine other work slows either side: compare sides within a row, and
# see the load averages printed at the start and the end. The defaults took 17 minutes on the
# 2-core Zen 3 VM while another job ran (the t1024 rows most of it; `... 2 demo` for a quick look).
set -euo pipefail
if [ "${KEEP_OPENBLAS_ENV:-0}" != 1 ]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi
root=$(cd "$(dirname "$0")/.." && pwd)
threads=${1:-$(nproc)}
workloads=${2:-demo t1024}
dtypes=${DTYPES:-float32 bfloat16}
rounds=${ROUNDS:-1}
step_limit=${TORCH_STEP_LIMIT:-3}
start_load=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date +%s)
# shellcheck source=bench/demo_data.sh
source "$root/bench/demo_data.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

omp_env=(OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive)
[ "${PEER_OMP:-passive}" = default ] && omp_env=(OMP_NUM_THREADS="$threads")
malloc_env=(MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736)
[ "${PEER_MALLOC:-keep}" = glibc ] && malloc_env=()
run_env=("${omp_env[@]}" "${malloc_env[@]}")

# PyTorch 2.6 (tools/pyenv.sh's Debian 13 root: its wrapper passes only a few variables, so
# ours go through env inside it), else Debian 12's torch 1.13.
torch_env=("${run_env[@]}" COMPILE_ALLOWANCE_S="${COMPILE_ALLOWANCE_S:-900}")
[ -n "${TORCH_COMPILE_BACKEND:-}" ] && torch_env+=(TORCH_COMPILE_BACKEND="$TORCH_COMPILE_BACKEND")
if pyenv_msg=$(bash "$root/tools/pyenv.sh" 2>&1); then
  py=("$root/build/pyenv/enter" env "${torch_env[@]}" python3)
  pynote=""
else
  rc=$?
  py=(env "${torch_env[@]}" /usr/bin/python3)
  pynote="PyTorch 2.6 not available (tools/pyenv.sh exit $rc: $(echo "$pyenv_msg" | tail -1)); using /usr/bin/python3"
  echo "note: $pynote"
fi
peer() { (cd "$root" && "${py[@]}" "$root/bench/train_torch.py" "$@"); }
torch_version=$(cd "$root" && "${py[@]}" -c 'import torch; print(torch.__version__)' 2>/dev/null)
probe=$(peer probe "$threads" 2>&1)
read -r _ mm_fp32 mm_bf16 <<<"$(grep '^matmul ' <<<"$probe" || echo "matmul ? ?")"
probe=$(tail -1 <<<"$probe")
compile_ok=0
if [ "$probe" = "compile ok" ]; then
  compile_ok=1
  compile_note="compile: torch.compile (${TORCH_COMPILE_BACKEND:-inductor}) of forward + loss, the optimizer eager"
else
  why=${probe#compile unavailable }
  case $why in
    *"C++ compiler"*) why="$why -- inductor's CPU kernels need g++ and Python headers, which tools/pyenv.sh's Debian 13 root does not include" ;;
  esac
  compile_note="compile: not available ($why)"
fi

ours() {  # dtype B T warmup steps -> median ms after the warm-up
  # causal attention: the PyTorch side's (block-causal, the default with --data, skips tiles)
  env "${run_env[@]}" "$tq" train --data "$shards" --optimizer adamw --attention causal \
    --dtype "$1" --threads "$threads" --batch-size "$2" --seq-len "$3" --steps "$(($4 + $5))" \
    --metrics "$out/m.jsonl" --output "$out/x.pt" >"$out/log" 2>&1 || true  # short runs may "fail" to learn
  python3 - "$out/m.jsonl" "$4" "$(($4 + $5))" <<'PY' || { tail -5 "$out/log" >&2; return 1; }
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = [r["ms"] for r in rows if "ms" in r]
if len(ms) != int(sys.argv[3]):
    sys.exit(f"tiny-qwen3 wrote {len(ms)} of {sys.argv[3]} steps")
print(f"{statistics.median(ms[int(sys.argv[2]):]):.1f}")
PY
}
torch_run() {  # mode dtype B T warmup steps optimizer limit_ms -> its "result ..." line
  local cap res
  # a safety net around the per-step limit: every step at the limit, the compilation, start-up
  cap=$(echo "($5 + $6) * $8 / 1000 * 1.5 + ${COMPILE_ALLOWANCE_S:-900} + 300" | bc)
  (cd "$root" && timeout "${cap%.*}" "${py[@]}" "$root/bench/train_torch.py" run "$shards" \
    "$1" "$2" "$threads" "$3" "$4" "$6" "$5" "$7" "$8") \
    >"$out/torch.log" 2>&1 || true
  res=$(grep '^result ' "$out/torch.log" | tail -1 || true)
  if [ -z "$res" ]; then
    echo "PyTorch ($1 $2 B=$3 T=$4) failed:" >&2
    tail -5 "$out/torch.log" >&2
    res="result failed"
  fi
  grep '^optimizer ' "$out/torch.log" | sed 's/^optimizer //' | paste -sd, - | sed 's/,/, /g' >"$out/opts" || true
  echo "$res"
}
better() {  # old new -> the faster of two measurements; "ok" beats a bound, a bound the larger
  local old=$1 new=$2
  [ -z "$old" ] && { echo "$new"; return; }
  read -r _ so mo _ <<<"$old"
  read -r _ sn mn _ <<<"$new"
  if [ "$sn" = ok ] && { [ "$so" != ok ] || (($(echo "$mn < $mo" | bc -l))); }; then echo "$new"
  elif [ "$sn" = timeout ] && [ "$so" = timeout ] && (($(echo "$mn > $mo" | bc -l))); then echo "$new"
  else echo "$old"; fi
}

rows=() notes=()
for w in $workloads; do
  case $w in
    demo) B=8 T=256 warm=${WARMUP_DEMO:-2} steps=${STEPS_DEMO:-6} ;;
    t1024) B=8 T=1024 warm=${WARMUP_T1024:-1} steps=${STEPS_T1024:-3} ;;
    *) echo "unknown workload $w (demo, t1024)" >&2; exit 2 ;;
  esac
  for dtype in $dtypes; do
    ms="" eager="" comp="" opt=auto
    for ((r = 0; r < rounds; r++)); do
      m=$(ours "$dtype" $B $T "$warm" "$steps")
      if [ -z "$ms" ] || (($(echo "$m < $ms" | bc -l))); then ms=$m; fi
      limit=$(echo "$step_limit * $ms" | bc)
      # a side stopped once is not run again: another round would give the same bound
      read -r _ st _ <<<"${eager:-x x}"
      if [ "$st" != timeout ]; then
        res=$(torch_run eager "$dtype" $B $T "$warm" "$steps" "$opt" "$limit")
        eager=$(better "$eager" "$res")
        read -r _ st _ o _ <<<"$res"
        if [ "$opt" = auto ] && { [ "$st" = ok ] || [ "$st" = timeout ]; }; then
          opt=$o
          notes+=("$w $dtype: torch AdamW $o, the fastest step of: $(cat "$out/opts") (ms)")
        fi
      fi
      read -r _ st _ <<<"${comp:-x x}"
      if [ $compile_ok = 1 ] && [ "$st" != timeout ]; then
        res=$(torch_run compile "$dtype" $B $T "$warm" "$steps" "$opt" "$limit")
        comp=$(better "$comp" "$res")
      fi
    done
    rows+=("$w $dtype $B $T $ms|$eager|$comp")
    c=${comp#result }
    echo "done: $w $dtype (ours $ms ms; eager: ${eager#result }; compile: ${c:-n/a})" >&2
  done
done

# "result ok MS OPT" / "result timeout MS OPT K" / others -> "ms tokens/s ratio" cells
cells() {  # result ours_ms tokens
  local st ms o k
  read -r _ st ms o k <<<"$1"
  case $st in
    ok) printf "%s %.0f %sx" "$ms" "$(echo "$3 * 1000 / $ms" | bc -l)" \
      "$(echo "scale = 2; $ms / $2" | bc)" ;;
    timeout) printf ">%s <%.0f >%sx" "$ms" "$(echo "$3 * 1000 / $ms" | bc -l)" \
      "$(echo "scale = 2; $ms / $2" | bc)" ;;
    *) printf "n/a n/a n/a" ;;
  esac
}
echo
echo "tiny-qwen3 train --data (AdamW) against PyTorch $torch_version, $threads threads, $(nproc) CPUs"
printf "%-8s %-9s %10s %9s | %10s %9s | %10s %9s | %10s %12s\n" workload dtype "ours ms" "tokens/s" \
  "eager ms" "tokens/s" "compile ms" "tokens/s" "ours/eager" "ours/compile"
for row in "${rows[@]}"; do
  IFS='|' read -r head eager comp <<<"$row"
  read -r w dtype B T ms <<<"$head"
  read -r em et er <<<"$(cells "$eager" "$ms" $((B * T)))"
  read -r cm ct cr <<<"$(cells "$comp" "$ms" $((B * T)))"
  printf "%-8s %-9s %10s %9.0f | %10s %9s | %10s %9s | %10s %12s\n" "$w" "$dtype" "$ms" \
    "$(echo "$B * $T * 1000 / $ms" | bc -l)" "$em" "$et" "$cm" "$ct" "$er" "$cr"
done
echo "ms: median step after the warm-up (demo: ${WARMUP_DEMO:-2} + ${STEPS_DEMO:-6} steps, t1024:" \
  "${WARMUP_T1024:-1} + ${STEPS_T1024:-3}), fastest of $rounds round(s); ours/x: our tokens/s over x's (>1: ours faster)"
echo "torch: bfloat16 = autocast(cpu, bf16) with fp32 parameters; AdamW variant: the fastest of those timed;" \
  "one product ([2048, 256] x [256, 3072]) runs at $mm_fp32 GFLOP/s in fp32, $mm_bf16 in bf16"
for n in "${notes[@]}"; do echo "  $n"; done
for row in "${rows[@]}"; do
  IFS='|' read -r head eager comp <<<"$row"
  read -r w dtype _ <<<"$head"
  for r in "eager $eager" "compile $comp"; do
    read -r mode _ st ms o k <<<"$r"
    if [ "${st:-}" = timeout ]; then
      echo "  $w $dtype: PyTorch $mode stopped in step $((k + 1)) after $ms ms (past $step_limit x our median step): a bound"
    fi
  done
done
echo "$compile_note"
if [ -n "$pynote" ]; then echo "note: $pynote"; fi
echo "load average: $start_load at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end;" \
  "$(($(date +%s) - started)) s in all (a shared machine: other work slows either side)"
