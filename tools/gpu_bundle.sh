#!/usr/bin/env bash
# Builds, on a Debian 12 machine with the CUDA toolkit, what bench/gpu_check.sh runs on a GPU
# machine that has CUDA and PyTorch but none of our Debian packages: build-gpu/ with
# tiny-qwen3, tq_tests, the CUDA backend libtq_cuda.so and lib/, the shared libraries they
# need beyond glibc and CUDA's own
# (OpenBLAS, gfortran, gomp, ...), found through RUNPATH $ORIGIN/lib. Portable code
# (-DTQ_NATIVE=OFF): the GPU machine's CPU is not this one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-gpu}
bash "$root/tools/deps.sh" --test
[ -x /usr/local/cuda/bin/nvcc ] || { echo "error: no nvcc at /usr/local/cuda/bin" >&2; exit 2; }
cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=Release -DTQ_NATIVE=OFF \
  -DCMAKE_BUILD_RPATH='$ORIGIN/lib;$ORIGIN/../lib' >/dev/null
cmake --build "$out" -j"$(nproc)" --target tiny-qwen3 tq_tests
mkdir -p "$out/lib"
cp -f "$out/tests/tq_tests" "$out/tq_tests"
# everything ldd resolves outside glibc and the CUDA toolkit (the GPU machine brings those)
for b in "$out/tiny-qwen3" "$out/tq_tests" "$out/libtq_cuda.so"; do
  ldd "$b" | awk '$3 ~ /^\// { print $3 }' | { grep -v "^$out/lib/" || true; } |
    { grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so|/libcu|/libnv|/libnccl' || true; } |
    while read -r lib; do cp -fL "$lib" "$out/lib/"; done
done
du -sh "$out/tiny-qwen3" "$out/tq_tests" "$out/libtq_cuda.so" "$out/lib"
echo "carry $out (with the repository) to the GPU machine and run: bash bench/gpu_check.sh"
