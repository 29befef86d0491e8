#!/usr/bin/env bash
# A training step while other processes take cores. For W1 = the walkthrough (B=1, T=32) and
# W2 = (B=8, T=256), fp32 and bf16: tiny-qwen3 at its default threads, at --threads 1, and
# PyTorch eager (Debian's torch 1.13, the same model and SGD step; its best of 1 and all
# threads in each condition), each idle, with one busy process, and with one busy process per
# core. Prints the median ms per step and its ratio to the same configuration idle.
# usage: bench/under_load.sh [STEPS_W1] [STEPS_W2] [WORKLOADS]   e.g. 20 6 "W1 W2"
# The busy processes are plain loops started detached into sessions of their own (setsid), as
# a process started from another terminal is: with autogroup scheduling (Linux's default on
# desktops and many servers) each session is a scheduling group, and a loop in the script's own
# group would share our group's time instead of taking a core's worth. Each loop ends itself
# after BUSY_SECONDS (default 3600) and is killed when the script exits.
# TORCH_TIMEOUT (default 300 s) bounds each PyTorch measurement: one that runs past it is
# printed as a lower bound (">").
set -euo pipefail
if [ "${KEEP_OPENBLAS_ENV:-0}" != 1 ]; then unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; fi
root=$(cd "$(dirname "$0")/.." && pwd)
steps_w1=${1:-20}
steps_w2=${2:-6}
workloads=${3:-W1 W2}
cores=$(nproc)
bash "$root/tools/deps.sh" --bench
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$cores" --target tiny-qwen3 >/dev/null
out=$(mktemp -d)
busy_stop() {
  [ -f "$out/busy" ] || return 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$out/busy"
  rm -f "$out/busy"
  sleep 0.2
}
trap 'busy_stop; rm -rf "$out"' EXIT
busy_start() {  # N loops, each in a session of its own
  local i
  for ((i = 0; i < $1; i++)); do
    setsid -f bash -c "echo \$\$ >>'$out/busy'; exec timeout ${BUSY_SECONDS:-3600} bash -c 'while :; do :; done'" \
      </dev/null >/dev/null 2>&1
  done
  sleep 0.5  # let them start and settle
}
malloc_env=(MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736)
torch_timeout=${TORCH_TIMEOUT:-300}
ours() {  # dtype B T steps [--threads 1] -> median ms
  env "${malloc_env[@]}" "$root/build/tiny-qwen3" train --dtype "$1" --batch-size "$2" \
    --seq-len "$3" --steps "$(($4 + 2))" "${@:5}" --output "$out/x.pt" >"$out/log" 2>&1 || true
  sed -n 's/^speed: median step \([0-9.]*\) ms.*/\1/p' "$out/log"
}
torch_one() {  # dtype threads B T steps -> median ms, or nothing when it timed out
  OMP_NUM_THREADS=$2 timeout "$torch_timeout" env "${malloc_env[@]}" /usr/bin/python3 \
    "$root/bench/torch_step.py" "$1" "$2" "$5" "$3" "$4" 2>/dev/null || true
}
torch_best() {  # dtype B T steps -> "ms" of the faster of 1 and all threads, ">bound" if none ended
  local a b
  a=$(torch_one "$1" 1 "$2" "$3" "$4")
  b=""
  [ "$cores" -gt 1 ] && b=$(torch_one "$1" "$cores" "$2" "$3" "$4")
  if [ -z "$a" ] && [ -z "$b" ]; then
    echo ">$(echo "$torch_timeout * 1000 / ($4 + 2)" | bc)"
  elif [ -z "$a" ] || { [ -n "$b" ] && (($(echo "$b < $a" | bc -l))); }; then
    echo "$b"
  else
    echo "$a"
  fi
}
ratio() {  # ms idle_ms -> "N.NNx"
  [ -n "$1" ] && [ -n "$2" ] || { echo "-"; return; }
  local gt=""
  [ "${1#>}" != "$1" ] && gt=">"
  [ "${2#>}" != "$2" ] && { echo "-"; return; }
  echo "$gt$(printf "%.2fx" "$(echo "scale = 3; ${1#>} / $2" | bc)")"
}
conditions=("idle:0" "1 busy:1")
[ "$cores" -gt 1 ] && conditions+=("$cores busy:$cores")
echo "cores: $cores; autogroup: $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo n/a)"
printf "%-4s %-9s %-8s %10s %7s %10s %7s %10s %7s\n" work dtype load "ours ms" ratio \
  "ours 1t" ratio "pytorch" ratio
for w in $workloads; do
  case $w in
    W1) B=1 T=32 steps=$steps_w1 ;;
    W2) B=8 T=256 steps=$steps_w2 ;;
    *) echo "unknown workload $w" >&2; exit 2 ;;
  esac
  for dtype in float32 bfloat16; do
    idle_ours="" idle_one="" idle_torch=""
    for c in "${conditions[@]}"; do
      name=${c%%:*} n=${c##*:}
      busy_start "$n"
      a=$(ours "$dtype" $B $T "$steps")
      b=$(ours "$dtype" $B $T "$steps" --threads 1)
      p=$(torch_best "$dtype" $B $T "$steps")
      busy_stop
      if [ "$n" = 0 ]; then idle_ours=$a idle_one=$b idle_torch=$p; fi
      printf "%-4s %-9s %-8s %10s %7s %10s %7s %10s %7s\n" "$w" "$dtype" "$name" "$a" \
        "$(ratio "$a" "$idle_ours")" "$b" "$(ratio "$b" "$idle_one")" "$p" "$(ratio "$p" "$idle_torch")"
    done
  done
done
echo "ratio: the step against the same configuration idle (2.00x is half the machine's cores)"
