#!/usr/bin/env bash
# The walkthrough, end to end: install, build, train the debugmodel 20 SGD steps in bf16,
# save tiny-qwen3.pt, then check it independently. Extra arguments go to `train`.
# Then it prepares the walkthrough's own Python environment (tools/pyenv.sh: torch 2.6 from
# Debian 13, once, a few minutes) so that its steps 3-5 run as typed; TQ_PYENV=0 skips that.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/deps.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target tiny-qwen3 >/dev/null
"$root/build/tiny-qwen3" train --output tiny-qwen3.pt "$@"
"$root/build/tiny-qwen3" check tiny-qwen3.pt
if [ "${TQ_PYENV:-1}" != 0 ]; then
  rc=0
  bash "$root/tools/pyenv.sh" || rc=$?
  # 77: no Debian 13 mirror, not root, or no mount namespaces; the C++ walkthrough above stands
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
fi
