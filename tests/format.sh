#!/usr/bin/env bash
# Every C++ and CUDA source in the repository is as the one .clang-format says (clang-format 14,
# Debian 12's: another version may lay some lines out otherwise). Exit 77 (skipped) without it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v clang-format >/dev/null; then
  echo "clang-format not installed: skipped (tools/deps.sh --test installs it)"
  exit 77
fi
cd "$root"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu')
else
  mapfile -t files < <(find src tests bench tools -name '*.cpp' -o -name '*.h' -o -name '*.cu')
fi
clang-format --dry-run --Werror "${files[@]}"
echo "${#files[@]} files formatted as .clang-format says"
