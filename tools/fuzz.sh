#!/usr/bin/env bash
# Fuzzes the file readers (tests/fuzz/): builds the targets with clang (libFuzzer, ASan, UBSan)
# in build-fuzz/ and runs TARGET, or all of them, for SECONDS each (default 600) from its seed
# corpus (tests/fuzz/corpus/TARGET, as checked in) and its format's dictionary. New inputs it
# finds go to build-fuzz/corpus/TARGET, and a later run starts from them too.
# A crash, leak, sanitizer report, hang (20 s) or an input needing over 2 GB fails the run: the
# input is kept in build-fuzz/findings/TARGET/ and the line to reproduce it is printed.
# usage: tools/fuzz.sh TARGET|all [SECONDS]
#   (targets: pickle zip pt resume safetensors hf_folder shard tokenizer encode)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
targets=${1:-all}
seconds=${2:-600}
[ "$targets" = all ] && targets="pickle zip pt resume safetensors hf_folder shard tokenizer encode"
bash "$root/tools/deps.sh" --fuzz
b=$root/build-fuzz
cmake -S "$root/tests/fuzz" -B "$b" -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$b" -j"$(nproc)" >/dev/null
cat "$root/tests/fuzz/pickle.dict" "$root/tests/fuzz/zip.dict" >"$b/pt.dict"
passed=0 failed=0
for t in $targets; do
  case $t in
    pickle) dict=$root/tests/fuzz/pickle.dict ;;
    zip) dict=$root/tests/fuzz/zip.dict ;;
    pt | resume) dict=$b/pt.dict ;;
    safetensors | hf_folder) dict=$root/tests/fuzz/json.dict ;;
    shard) dict=$root/tests/fuzz/shard.dict ;;
    tokenizer) dict=$root/tests/fuzz/tokenizer.dict ;;
    encode) dict=$root/tests/fuzz/tokenizer.dict ;;
    *) echo "unknown fuzz target '$t' (pickle zip pt resume safetensors hf_folder shard tokenizer encode)" >&2; exit 2 ;;
  esac
  mkdir -p "$b/corpus/$t" "$b/findings/$t"
  log=$b/findings/$t/last.log
  rc=0
  # OMP_NUM_THREADS=1: the readers' CRC checks run on OpenMP threads, whose stacks LeakSanitizer
  # would scan with every input
  OMP_NUM_THREADS=1 "$b/fuzz_$t" "$b/corpus/$t" "$root/tests/fuzz/corpus/$t" -dict="$dict" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$b/findings/$t/" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$( (grep -o 'cov: [0-9]* ft: [0-9]*' "$log" || true) | tail -1)
  corp=$( (grep -o 'corp: [0-9]*/[0-9]*[bKM]*' "$log" || true) | tail -1)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $t: ${execs:-?} inputs in ${seconds} s (${rate:-?}/s), ${cov:-cov: ?}, ${corp:-corp: ?}: no finding"
    passed=$((passed + 1))
  else
    echo "fuzz $t: FINDING (exit $rc) after ${execs:-?} inputs; $(grep -m1 -E 'ERROR|SUMMARY|runtime error|deadly signal|leak' "$log" || true)"
    art=$(sed -n 's/.*Test unit written to \(.*\)/\1/p' "$log" | tail -1)
    echo "  reproduce: $b/fuzz_$t ${art:-(no input saved)}   (log: $log)"
    grep -m3 -E 'ERROR|error in|SUMMARY' "$log" | sed 's/^/  /' || true
    failed=$((failed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
