#!/usr/bin/env bash
# Installs the Debian 12 packages tiny-qwen3 needs. `deps.sh` for building and training,
# `deps.sh --test` adds the test tools (GoogleTest, Debian's PyTorch for the parity tests,
# clang-format, clang with libFuzzer for the fuzz targets), `deps.sh --fuzz` just the last,
# `deps.sh --bench` those and what the benchmarks use (bc, BLIS for PyTorch).
set -euo pipefail
pkgs=(g++ cmake make libopenblas-openmp-dev libdnnl2 libcli11-dev nlohmann-json3-dev zlib1g-dev
      libpcre2-dev libutf8proc-dev libssl-dev gnuplot-nox libopenmpi-dev openmpi-bin)
case "${1:-}" in
  --test) pkgs+=(libgtest-dev python3-torch clang-format clang-14 libclang-rt-14-dev libomp-14-dev) ;;
  --fuzz) pkgs+=(clang-14 libclang-rt-14-dev libomp-14-dev) ;;
  --bench) pkgs+=(libgtest-dev python3-torch bc time libblis4-openmp) ;;
esac
missing=()
# node and npm (the tokenizer tests' and benchmarks' reference, Hugging Face tokenizers' native
# build from npm): Debian's unless a node with its npm is already on the PATH
if [ "${1:-}" = --test ] || [ "${1:-}" = --bench ]; then
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
fi
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
