#!/usr/bin/env bash
# Data-parallel training under mpirun (2 ranks over loopback on this machine):
#  - 2 ranks at batch B give the losses of 1 process at B with --grad-accum 2, and of 1 process
#    at 2B (sequential windows), to 1e-5 relative over 20 AdamW steps, with and without
#    --shard-optimizer (fp32, block-causal, shuffled or sequential; bf16 and SGD too);
#  - the sharded and unsharded checkpoints hold the same tensors, and `eval` gives the same loss
#    on the 1-process and the 2-rank checkpoints;
#  - a 2-rank run stopped after step 10 and resumed on 1 rank (and a 1-process run resumed on
#    2) continues the uninterrupted curve; a resume on ranks that cannot keep the global batch
#    is refused;
#  - ranks given different flags are refused, naming the flag;
#  - a rank killed mid-run ends the job (non-zero exit) and the last checkpoint loads and
#    resumes; a rank that hangs (SIGSTOP) ends the others after --timeout with one line.
# `quick` (the sanitizer build's run): the first setting alone, 4 steps.
# usage: dist_train.sh TINY_QWEN3 MPIEXEC [quick]
set -u
bin=$1 mpiexec=$2 quick=${3:-}
dir=$(mktemp -d)
trap 'kill -CONT $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
fails=0
pass() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
# (mpirun as root needs --allow-run-as-root; in a sanitizer build, leaks are not checked in the
# ranks: OpenMPI leaves its own allocations at exit, from components it has unloaded, which no
# suppression can name. ASan's other checks stay on.)
opt=(--oversubscribe -x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
[ "$(id -u)" -eq 0 ] && opt+=(--allow-run-as-root)
mpi=("$mpiexec" -np 2 "${opt[@]}")
# a machine where mpirun cannot start two processes at all is skipped, saying why
if ! out=$("${mpi[@]}" true 2>&1); then
  echo "skipped: mpirun cannot start 2 processes here: $(grep -m1 -v '^-*$' <<<"$out")"
  exit 77
fi

# shared with the other training scripts: made_up_shards, same_tensors
# shellcheck source=tests/made_up.sh
source "$(dirname "$0")/made_up.sh"
made_up_shards "$bin" "$dir" 11 300 || {
  echo "FAIL: could not make shards"
  exit 1
}

# The per-step losses of metrics file $1, one a line.
losses() { grep -o '"loss":[^,}]*' "$1" | cut -d: -f2; }
# Whether the losses of metrics files $1 and $2 agree to 1e-5 relative at every step (and
# there are $3 of them).
close() {
  paste <(losses "$1") <(losses "$2") | awk -v want="$3" '
    { n++; d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r }
    END { printf "%d steps, largest relative difference %.2g", n, worst; exit !(n == want && worst <= 1e-5) }'
}
eval_loss() { "$bin" eval "$1" --data "$dir/shards" --tokens 2000 --threads 1 --json | grep -o '"loss": *[^,}]*' | cut -d: -f2; }

base="--data $dir/shards --log-every 20"
common="$base --steps 20"
# name|steps|flags: the criterion's 20 fp32 AdamW steps, fewer for the other settings (each
# 2-rank step shares this machine's two cores with the other rank)
settings=(
  "fp32-block-shuffled|20|--dtype float32 --batch-size 2 --seq-len 32 --data-order shuffled --val-every 10 --val-tokens 400"
  "fp32-causal-accum2|10|--dtype float32 --batch-size 1 --seq-len 48 --attention causal --grad-accum 2 --warmup-steps 4 --decay-type cosine"
  "bf16-block|8|--dtype bfloat16 --batch-size 2 --seq-len 32 --warmup-steps 2"
  "sgd-fp32|8|--optimizer sgd --learning-rate 0.05 --dtype float32 --batch-size 2 --seq-len 32 --warmup-steps 2"
)
[ "$quick" = quick ] && settings=("${settings[0]/|20|/|4|}")
for s in "${settings[@]}"; do
  IFS='|' read -r name steps flags <<<"$s"
  d=$dir/$name && mkdir -p "$d"
  accum=$(sed -nE 's/.*--grad-accum ([0-9]+).*/\1/p' <<<"$flags")
  accum=${accum:-1}
  one=${flags/--grad-accum $accum/}
  # one process: the same global batch as --grad-accum 2x (sequential and shuffled alike)
  # shellcheck disable=SC2086
  "$bin" train $base --steps "$steps" $one --grad-accum $((2 * accum)) --threads 1 --output "$d/one.pt" \
    --metrics "$d/one.jsonl" >"$d/one.log" 2>&1 || fail "$name: one process failed: $(tail -1 "$d/one.log")"
  for shard in "" --shard-optimizer; do
    tag=two${shard:+-sharded}
    # shellcheck disable=SC2086
    "${mpi[@]}" "$bin" train $base --steps "$steps" $flags $shard --output "$d/$tag.pt" --metrics "$d/$tag.jsonl" \
      >"$d/$tag.log" 2>&1 || fail "$name: 2 ranks $shard failed: $(grep -m1 error "$d/$tag.log")"
    if r=$(close "$d/one.jsonl" "$d/$tag.jsonl" "$steps"); then
      pass "$name: 2 ranks${shard:+ (sharded)} = 1 process with --grad-accum $((2 * accum)): $r"
    else
      fail "$name: 2 ranks${shard:+ (sharded)} against 1 process: $r"
    fi
  done
  if same_tensors "$d/two.pt" "$d/two-sharded.pt"; then
    pass "$name: the sharded run's checkpoint (gathered on rank 0) holds the unsharded one's tensors"
  else
    fail "$name: the sharded and unsharded checkpoints differ"
  fi
  grep -q "validation at step $steps" "$d/two.log" || [[ $flags != *--val-every* ]] ||
    fail "$name: no validation line from rank 0"
done

if [ "$quick" = quick ]; then
  echo "$fails failure(s)"
  [ $fails -eq 0 ]
  exit
fi

# 1 process at 2B equals 2 ranks at B (sequential windows: 2B's rows are the two Bs' rows)
d=$dir/fp32-block-shuffled
"$bin" train $common --dtype float32 --batch-size 4 --seq-len 32 --threads 1 --output "$d/b4.pt" \
  --metrics "$d/b4.jsonl" >"$d/b4.log" 2>&1
"${mpi[@]}" "$bin" train $common --dtype float32 --batch-size 2 --seq-len 32 --output "$d/b2.pt" \
  --metrics "$d/b2.jsonl" >"$d/b2.log" 2>&1
if r=$(close "$d/b4.jsonl" "$d/b2.jsonl" 20); then
  pass "2 ranks at B = 2 = 1 process at B = 4: $r"
else
  fail "2 ranks at B = 2 against 1 process at B = 4: $r"
fi
# the checkpoints load and give the same loss
l1=$(eval_loss "$d/one.pt") l2=$(eval_loss "$d/two-sharded.pt")
if awk -v a="$l1" -v b="$l2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-5 * a) }'; then
  pass "eval on the 1-process and the 2-rank (sharded) checkpoints: $l1 and $l2"
else
  fail "eval on the 1-process and the 2-rank checkpoints: '$l1' and '$l2'"
fi

# resume: 2 ranks stopped after 10 steps, resumed on 1 (--grad-accum 2 by itself); 1 process
# with --grad-accum 2 stopped, resumed on 2 ranks
d=$dir/resume && mkdir -p "$d"
flags="--dtype float32 --batch-size 2 --seq-len 32 --data-order shuffled"
"${mpi[@]}" "$bin" train $common $flags --shard-optimizer --stop-after 10 --output "$d/a/" \
  --metrics "$d/a.jsonl" >"$d/a1.log" 2>&1
"$bin" train --resume "$d/a/step-00000010.pt" --threads 1 --metrics "$d/a.jsonl" >"$d/a2.log" 2>&1
grep -q "resume: 1 rank(s) x --grad-accum 2" "$d/a2.log" || fail "resume on 1 rank: no --grad-accum line: $(grep -m1 error "$d/a2.log")"
if r=$(close "$dir/fp32-block-shuffled/two.jsonl" "$d/a.jsonl" 20); then
  pass "2 ranks stopped after step 10, resumed on 1 rank: the uninterrupted curve ($r)"
else
  fail "2 ranks resumed on 1 rank: $r"
fi
"$bin" train $common $flags --grad-accum 2 --threads 1 --stop-after 10 --output "$d/b/" \
  --metrics "$d/b.jsonl" >"$d/b1.log" 2>&1
"${mpi[@]}" "$bin" train --resume "$d/b/step-00000010.pt" --metrics "$d/b.jsonl" >"$d/b2.log" 2>&1
if r=$(close "$dir/fp32-block-shuffled/two.jsonl" "$d/b.jsonl" 20); then
  pass "1 process stopped after step 10, resumed on 2 ranks: the uninterrupted curve ($r)"
else
  fail "1 process resumed on 2 ranks: $r"
fi
# 3 ranks cannot keep a global batch of 2 micro-batches
out=$("$mpiexec" -np 3 "${opt[@]}" "$bin" train --resume "$d/b/step-00000010.pt" --output "$d/c.pt" 2>&1)
if [ $? -ne 0 ] && grep -q "error: rank [0-2]: .*do not make that global batch of 2" <<<"$out"; then
  pass "a resume on 3 ranks of a global batch of 2 is refused"
else
  fail "resume on 3 ranks: $(head -3 <<<"$out")"
fi

# ranks given different flags (mpirun's MPMD form: one command a rank)
out=$("$mpiexec" -np 1 "${opt[@]}" "$bin" train $common $flags --output "$d/m.pt" : \
  -np 1 "$bin" train $common $flags --learning-rate 0.001 --output "$d/m.pt" 2>&1)
if [ $? -ne 0 ] && grep -q "error: rank 1: --learning-rate 0.001 is not rank 0's 0.0008:" <<<"$out" &&
  [ ! -e "$d/m.pt" ]; then
  pass "ranks given different flags are refused: $(grep -m1 'error: rank 1' <<<"$out")"
else
  fail "ranks with different flags: $(head -3 <<<"$out")"
fi

# faults. The ranks' pids: the tiny-qwen3 children of mpirun $1, by their rank.
rank_pid() {
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
  done
}
# wait until checkpoint $1 exists (at most 60 s)
await() { for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
d=$dir/faults && mkdir -p "$d"
# a rank killed: the job ends, non-zero, and the checkpoint before it loads and resumes
"${mpi[@]}" "$bin" train $base $flags --steps 400 --save-every 4 --timeout 20 --output "$d/k/" \
  >"$d/k.log" 2>&1 &
job=$!
await "$d/k/step-00000004.pt" || fail "no checkpoint of the run to kill"
sleep 1
t0=$(date +%s)
kill -9 "$(rank_pid $job 1)"
wait $job
rc=$? took=$(($(date +%s) - t0))
last=$(ls "$d/k" | grep -E '^step-[0-9]+\.pt$' | tail -1)
if [ $rc -ne 0 ] && [ "$took" -le 20 ] && [ -n "$last" ] &&
  "$bin" check "$d/k/$last" --threads 1 >"$d/check.log" 2>&1; then
  pass "a rank killed: the job ended in ${took} s, exit $rc; $last loads ($(grep -m1 -o 'loss[^,]*' "$d/check.log"))"
else
  fail "a rank killed: exit $rc after ${took} s, last checkpoint '$last': $(tail -2 "$d/k.log")"
fi
"$bin" train --resume "$d/k/$last" --stop-after $((10#${last:5:8} + 1)) --threads 1 --output "$d/k2/" \
  >"$d/k2.log" 2>&1
[ $? -eq 3 ] && pass "the killed job's $last resumes" || fail "the killed job's $last does not resume: $(tail -1 "$d/k2.log")"
# a rank that hangs: the other ends the job after --timeout with one line
"${mpi[@]}" "$bin" train $base $flags --steps 400 --save-every 4 --timeout 5 --output "$d/h/" \
  >"$d/h.log" 2>&1 &
job=$!
await "$d/h/step-00000004.pt" || fail "no checkpoint of the run to hang"
hung=$(rank_pid $job 1)
t0=$(date +%s)
kill -STOP "$hung"
wait $job
rc=$? took=$(($(date +%s) - t0))
kill -CONT "$hung" 2>/dev/null
kill -9 "$hung" 2>/dev/null
lines=$(grep -c "error: rank 0: no answer from the other ranks in 5 s" "$d/h.log")
if [ $rc -ne 0 ] && [ "$took" -le 30 ] && [ "$lines" -eq 1 ]; then
  pass "a rank hung: rank 0 ended the job after ${took} s (--timeout 5), exit $rc: $(grep -m1 'error: rank 0' "$d/h.log")"
else
  fail "a rank hung: exit $rc after ${took} s, $lines timeout line(s): $(grep -m2 error "$d/h.log")"
fi

echo "$fails failure(s)"
[ $fails -eq 0 ]
