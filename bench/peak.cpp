// The machine's arithmetic peak, measured: fp32 FMA (vfmadd231ps: zmm on AVX-512 CPUs, else
// ymm) and, where the CPU has it, bf16 dot products (vdpbf16ps), on every OpenMP thread at
// once. Prints GFLOP/s per kind; without vdpbf16ps the bf16 kind runs as fp32 FMAs (gemm.h).
// Independent accumulators hide the FMA latency; nothing touches memory in the loop.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

__attribute__((target("avx512f"))) static float lanes_sum(__m512 v) {
  float l[16], t = 0;
  _mm512_storeu_ps(l, v);
  for (float x : l) t += x;
  return t;
}
__attribute__((target("avx512f"))) static float fma_loop(long iters) {
  __m512 a[12], x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
  for (auto& r : a) r = _mm512_setzero_ps();
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+v"(x), "+v"(y));  // opaque operands: x*y cannot be hoisted out
    for (auto& r : a) r = _mm512_fmadd_ps(x, y, r);
  }
  __m512 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, a[k]);
  return lanes_sum(s);
}
__attribute__((target("avx2,fma"))) static float fma_loop_avx2(long iters) {
  __m256 a[12], x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
  for (auto& r : a) r = _mm256_setzero_ps();
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+x"(x), "+x"(y));
    for (auto& r : a) r = _mm256_fmadd_ps(x, y, r);
  }
  __m256 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm256_add_ps(s, a[k]);
  float l[8], t = 0;
  _mm256_storeu_ps(l, s);
  for (float v : l) t += v;
  return t;
}
__attribute__((target("avx512f,avx512bf16"))) static float bf16_loop(long iters) {
  __m512 a[12];
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (auto& r : a) r = _mm512_setzero_ps();
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+v"(x), "+v"(y));
    for (auto& r : a) r = _mm512_dpbf16_ps(r, x, y);
  }
  __m512 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, a[k]);
  return lanes_sum(s);
}

template <typename F>
static double gflops(F loop, double flop_per_iter) {
  const long iters = 20000000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    sink += loop(iters);
    if (sink == 1.0f) std::printf(" ");  // keeps the loops alive
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flop_per_iter * iters * omp_get_max_threads() / s * 1e-9);
  }
  return best;
}

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      std::printf("fp32 n/a\nbf16 n/a\n");
      return 0;
    }
    const double f = gflops(fma_loop_avx2, 12 * 8 * 2);  // 12 FMAs of 8 lanes
    std::printf("fp32 %.1f\nbf16 %.1f\n", f, f);
    return 0;
  }
  std::printf("fp32 %.1f\n", gflops(fma_loop, 12 * 16 * 2));  // 12 FMAs of 16 lanes
  if (__builtin_cpu_supports("avx512bf16"))
    std::printf("bf16 %.1f\n", gflops(bf16_loop, 12 * 16 * 4));  // 2 products + 2 adds a lane
  else
    std::printf("bf16 n/a\n");
}
