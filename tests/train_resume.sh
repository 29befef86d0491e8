#!/usr/bin/env bash
# train --resume continues a run bit for bit: for each setting below (both optimizers, both
# dtypes, accumulation, shuffling, both attention modes), a run of 20 steps and the
# same run stopped after step 10 (--stop-after) and resumed give the same losses, learning
# rates and gradient norms (the metrics JSONL, every digit) and the same final checkpoint
# (every tensor record byte for byte: weights, moments, step counts). Then a run stopped by
# SIGTERM mid-way and resumed equals it too, and a run killed (SIGKILL) while it writes a
# checkpoint leaves every checkpoint before it whole and resumable.
# usage: train_resume.sh TINY_QWEN3
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
pass() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

# shared with the other training scripts: made_up_shards, same_tensors
# shellcheck source=tests/made_up.sh
source "$(dirname "$0")/made_up.sh"
made_up_shards "$bin" "$dir" 7 200 || {
  echo "FAIL: could not make shards"
  exit 1
}

# The records of metrics file $1 without the timings: what must be equal.
numbers() { sed -E 's/,?"(ms|tokens_per_s)":[^,}]*//g' "$1"; }

common="--data $dir/shards --threads 2"
settings=(
  "adamw-bf16-accum2-shuffled-block|--dtype bfloat16 --batch-size 2 --seq-len 48 --grad-accum 2 --data-order shuffled --attention block-causal --val-every 5 --val-tokens 200"
  "adamw-fp32-sequential-causal|--dtype float32 --batch-size 3 --seq-len 32 --attention causal --warmup-steps 4 --decay-type cosine"
  "sgd-fp32-accum3-shuffled-block|--optimizer sgd --learning-rate 0.05 --dtype float32 --batch-size 2 --seq-len 32 --grad-accum 3 --data-order shuffled --attention block-causal"
  "sgd-bf16-sequential-causal|--optimizer sgd --learning-rate 0.05 --dtype bfloat16 --batch-size 2 --seq-len 40 --attention causal --max-norm 0"
)
for s in "${settings[@]}"; do
  name=${s%%|*} flags=${s#*|}
  d=$dir/$name && mkdir -p "$d"
  # shellcheck disable=SC2086
  "$bin" train $common $flags --log-every 5 --steps 20 --output "$d/full.pt" --metrics "$d/full.jsonl" >"$d/full.log" 2>&1
  rc_full=$?
  # shellcheck disable=SC2086
  "$bin" train $common $flags --log-every 5 --steps 20 --stop-after 10 --output "$d/part.pt" \
    --metrics "$d/part.jsonl" >"$d/stop.log" 2>&1
  rc_stop=$?
  "$bin" train --resume "$d/part.pt" --threads 2 >"$d/resume.log" 2>&1
  rc_resume=$?
  if [ $rc_full -ne 0 ] || [ $rc_stop -ne 3 ] || [ $rc_resume -ne 0 ]; then
    fail "$name: exit codes full $rc_full, --stop-after $rc_stop (3 expected), --resume $rc_resume: $(tail -n 2 "$d/stop.log" "$d/resume.log")"
  elif ! grep -q "^stopped after step 10 of 20 (--stop-after): checkpoint $d/part.pt" "$d/stop.log"; then
    fail "$name: no 'stopped after step 10' line: $(tail -n 1 "$d/stop.log")"
  elif [ "$(numbers "$d/full.jsonl")" != "$(numbers "$d/part.jsonl")" ]; then
    fail "$name: the resumed run's metrics differ: $(diff <(numbers "$d/full.jsonl") <(numbers "$d/part.jsonl") | head -n 4)"
  elif ! same_tensors "$d/full.pt" "$d/part.pt"; then
    fail "$name: the final checkpoints' tensors differ"
  else
    pass "$name: 20 steps = 10, stopped, + 10 resumed ($(grep -c '"loss"' "$d/part.jsonl") steps, $(tail -n 1 "$d/part.jsonl" | head -c 60)...)"
  fi
done

# SIGTERM mid-run: saves at the end of that step, exits 128 + 15 with the line, and resumes.
d=$dir/adamw-bf16-accum2-shuffled-block
s=${settings[0]}
# shellcheck disable=SC2086
"$bin" train $common ${s#*|} --log-every 1 --steps 20 --output "$d/term.pt" --metrics "$d/term.jsonl" \
  >"$d/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q "^step  2/20" "$d/term.log" 2>/dev/null && break
  sleep 0.05
done
kill -TERM $pid
wait $pid
rc=$?
"$bin" train --resume "$d/term.pt" --threads 2 --log-every 5 >"$d/term_resume.log" 2>&1
rc2=$?
if [ $rc -ne 143 ] || ! grep -q "^stopped after step [0-9]* of 20 (Terminated): checkpoint $d/term.pt; continue with: tiny-qwen3 train --resume $d/term.pt" "$d/term.log"; then
  fail "SIGTERM: exit $rc (143 expected): $(tail -n 1 "$d/term.log")"
elif [ $rc2 -ne 0 ] || [ "$(numbers "$d/full.jsonl")" != "$(numbers "$d/term.jsonl")" ] ||
  ! same_tensors "$d/full.pt" "$d/term.pt"; then
  fail "SIGTERM: the resumed run differs from the uninterrupted one (exit $rc2)"
else
  pass "SIGTERM: $(grep '^stopped' "$d/term.log" | cut -d: -f1), resumed to the same 20 steps"
fi

# SIGKILL while a checkpoint is written: the ones before it stay whole, and resume.
k=$dir/killed/
# shellcheck disable=SC2086
"$bin" train $common ${s#*|} --steps 20 --save-every 1 --output "$k" >"$dir/kill.log" 2>&1 &
pid=$!
killed=0
for _ in $(seq 1 3000); do
  if compgen -G "$k/step-00000003.pt.tmp.*" >/dev/null; then
    kill -KILL $pid && killed=1
    break
  fi
  sleep 0.01
done
wait $pid 2>/dev/null
if [ $killed -ne 1 ]; then
  fail "SIGKILL: never saw the third checkpoint being written: $(tail -n 2 "$dir/kill.log")"
else
  ok=1
  for f in "$k"/step-0000000[12].pt; do
    "$bin" check "$f" --threads 2 >"$dir/check.log" 2>&1 || {
      ok=0
      fail "SIGKILL: $f does not check: $(tail -n 1 "$dir/check.log")"
    }
  done
  [ -e "$k/step-00000003.pt" ] && {
    ok=0
    fail "SIGKILL: a step-00000003.pt appeared from a killed write"
  }
  if [ $ok -eq 1 ] && "$bin" train --resume "$k/step-00000002.pt" --threads 2 --save-every 0 \
    --metrics "$dir/after_kill.jsonl" >"$dir/after.log" 2>&1 &&
    [ "$(numbers "$dir/after_kill.jsonl")" = "$(numbers "$d/full.jsonl" | sed -n '/"step":3,/,$p')" ] &&
    same_tensors "$d/full.pt" "$k/step-00000020.pt" && ! compgen -G "$k/*.tmp.*" >/dev/null; then
    pass "SIGKILL mid-save: step-1 and step-2 check, step-2 resumes to the uninterrupted run, and the killed save's temporary is gone"
  elif [ $ok -eq 1 ]; then
    fail "SIGKILL: resuming step-00000002.pt: $(tail -n 2 "$dir/after.log")"
  fi
fi
echo "$fails failed"
[ "$fails" -eq 0 ]
