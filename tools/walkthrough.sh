#!/usr/bin/env bash
# The walkthrough, end to end: install, build, train the debugmodel 20 SGD steps in bf16,
# save tiny-qwen3.pt, then check it independently. Extra arguments go to `train`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target tiny-qwen3 >/dev/null
"$root/build/tiny-qwen3" train --output tiny-qwen3.pt "$@"
"$root/build/tiny-qwen3" check tiny-qwen3.pt
