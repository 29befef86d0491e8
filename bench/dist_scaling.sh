#!/usr/bin/env bash
# Data-parallel scaling on this machine, at one global batch (2 micro-batches of B x T a step),
# measured in the same run:
#   1 x 2    one process of 2 threads, --grad-accum 2 (the peer)
#   2 x 1    mpirun -np 2, one thread a rank (each rank a micro-batch; the gradient all-reduced
#            in buckets during the backward)
#   2 x 1 z  the same with --shard-optimizer (ZeRO-1: each rank steps half, then the gather)
#   alone    one rank's work without the other: 1 process, 1 thread, one micro-batch (what a
#            2 x 1 step would take if communication and sharing the machine cost nothing)
# Each: the median step ms over the steps after the first two; for the ranks also the median
# `comm` ms (the step's wait for the other rank: all-reduce left after the backward, ZeRO-1's
# gather, imbalance). Then the all-reduce alone (tq_allreduce_bench) at the gradient's size
# against the ring model: 2 (N-1)/N x gradient bytes at the bus bandwidth.
# BUSY=N runs it all with N busy loops beside (each in a session of its own, as a process from
# another terminal: see bench/under_load.sh), for how the ranks share the machine with others.
# usage: bench/dist_scaling.sh [PRESET] [B] [T] [STEPS]      e.g. debugmodel 8 128 8
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-debugmodel}
B=${2:-8}
T=${3:-128}
steps=${4:-8}
# shellcheck source=bench/demo_data.sh
source "$root/bench/demo_data.sh"
cmake --build "$root/build" -j"$(nproc)" --target tq_allreduce_bench >/dev/null
mpi=(mpirun -np 2 --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
tmp=$(mktemp -d)
busy_stop() {
  [ -f "$tmp/busy" ] || return 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$tmp/busy"
}
trap 'busy_stop; rm -rf "$tmp"' EXIT
for ((i = 0; i < ${BUSY:-0}; i++)); do
  setsid -f bash -c "echo \$\$ >>'$tmp/busy'; exec timeout 3600 bash -c 'while :; do :; done'" \
    </dev/null >/dev/null 2>&1
done

# median of stdin's numbers
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# runs "$@" with --metrics; prints "MS COMM" (medians over steps 3..)
timed() {
  local m=$tmp/m.jsonl
  rm -f "$m"
  "$@" --metrics "$m" >"$tmp/log" 2>&1 || {
    echo "failed: $* ($(grep -m1 error "$tmp/log"))" >&2
    exit 1
  }
  local ms comm
  ms=$(grep '"step"' "$m" | grep -v val_loss | awk 'NR > 2' | grep -o '"ms":[^,}]*' | cut -d: -f2 | median)
  comm=$(grep '"step"' "$m" | grep -v val_loss | awk 'NR > 2' | { grep -o '"comm_ms":[^,}]*' || echo x:0; } | cut -d: -f2 | median)
  echo "$ms $comm"
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs;" \
  "$preset, 2 micro-batches of $B x $T a step, $steps steps, ${BUSY:-0} busy loop(s) beside"
printf "%-9s | %8s | %8s %8s %6s | %8s %8s %6s | %8s %6s\n" dtype "1x2 ms" "2x1 ms" comm "speed" \
  "2x1z ms" comm "speed" "alone" "eff"
common=(--data "$shards" --preset "$preset" --seq-len "$T" --batch-size "$B" --steps "$steps"
        --warmup-steps 2 --output "$tmp/ck.pt")
for dtype in bfloat16 float32; do
  read -r one _ < <(timed "$tq" train "${common[@]}" --dtype "$dtype" --grad-accum 2 --threads 2)
  read -r two two_comm < <(timed "${mpi[@]}" "$tq" train "${common[@]}" --dtype "$dtype" --threads 1)
  read -r zero zero_comm < <(timed "${mpi[@]}" "$tq" train "${common[@]}" --dtype "$dtype" --threads 1 \
    --shard-optimizer)
  read -r alone _ < <(timed "$tq" train "${common[@]}" --dtype "$dtype" --threads 1)
  # speed: the peer's step time over ours; eff: the ideal (one rank alone) over 2 x 1's
  awk -v d="$dtype" -v one="$one" -v two="$two" -v tc="$two_comm" -v z="$zero" -v zc="$zero_comm" \
    -v a="$alone" 'BEGIN { printf "%-9s | %8.1f | %8.1f %8.1f %5.2fx | %8.1f %8.1f %5.2fx | %8.1f %5.0f%%\n",
      d, one, two, tc, one / two, z, zc, one / z, a, 100 * a / two }'
done

params=$("$tq" train --data "$shards" --preset "$preset" --steps 1 --seq-len 8 --output "$tmp/p.pt" \
  --threads 1 | sed -n 's/^parameters: //p' | tr -d ,)
mib=$(((params * 4 + (1 << 20) - 1) >> 20))
echo "all-reduce of the fp32 gradient ($params parameters, $mib MiB) alone, 2 ranks:"
p2=1
while [ $p2 -lt "$mib" ]; do p2=$((p2 * 2)); done
"${mpi[@]}" "$root/build/tq_allreduce_bench" "$p2" | awk 'NR == 1 || $1 * 8 >= p2' p2="$p2"
