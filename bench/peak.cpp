// The machine's arithmetic peak, measured: fp32 FMA (vfmadd231ps: zmm on AVX-512 CPUs, else
// ymm) and, where the CPU has it, bf16 dot products (vdpbf16ps), on every OpenMP thread at
// once. Prints GFLOP/s per kind; without vdpbf16ps the bf16 kind runs as fp32 FMAs (gemm.h).
// Independent accumulators hide the FMA latency; nothing touches memory in the loop.
// `tq_peak --read` also prints the read bandwidth, the floor of products bound by reading their
// weights once (decoding's GEMV path, gemm.h), as `read bandwidth: X GB/s (N threads)`.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// The read bandwidth: every thread sums its share of a 1 GiB buffer (larger than any cache) as
// kStreams runs side by side, best of 5 passes after one that faults the pages in (each thread
// touches the pages it reads). One run a thread read ~20-25 % slower on the Zen 5 VM (the
// hardware prefetchers keep more lines in flight for several streams: 1 stream 43, 4 61, 8 63,
// 16 55 GB/s on 2 threads), and the GEMV path's threads read several rows of W at once.
constexpr int kStreams = 8;
__attribute__((target("avx512f"))) static float sum512(const float* p, size_t n) {
  const size_t per = n / kStreams / 32 * 32;
  __m512 a[kStreams][2];
  for (auto& r : a) r[0] = r[1] = _mm512_setzero_ps();
  for (size_t i = 0; i < per; i += 32)
    for (int s = 0; s < kStreams; ++s) {
      a[s][0] = _mm512_add_ps(a[s][0], _mm512_load_ps(p + s * per + i));
      a[s][1] = _mm512_add_ps(a[s][1], _mm512_load_ps(p + s * per + i + 16));
    }
  for (int s = 1; s < kStreams; ++s) a[0][0] = _mm512_add_ps(a[0][0], a[s][0]);
  for (auto& r : a) a[0][0] = _mm512_add_ps(a[0][0], r[1]);
  return lanes_sum(a[0][0]);
}
__attribute__((target("avx"))) static float sum256(const float* p, size_t n) {
  const size_t per = n / kStreams / 16 * 16;
  __m256 a[kStreams][2];
  for (auto& r : a) r[0] = r[1] = _mm256_setzero_ps();
  for (size_t i = 0; i < per; i += 16)
    for (int s = 0; s < kStreams; ++s) {
      a[s][0] = _mm256_add_ps(a[s][0], _mm256_load_ps(p + s * per + i));
      a[s][1] = _mm256_add_ps(a[s][1], _mm256_load_ps(p + s * per + i + 8));
    }
  for (int s = 1; s < kStreams; ++s) a[0][0] = _mm256_add_ps(a[0][0], a[s][0]);
  for (auto& r : a) a[0][0] = _mm256_add_ps(a[0][0], r[1]);
  float l[8], t = 0;
  _mm256_storeu_ps(l, a[0][0]);
  for (float x : l) t += x;
  return t;
}
static double read_gbs() {
  const size_t bytes = size_t(1) << 30, n = bytes / 4;
  auto* p = static_cast<float*>(std::aligned_alloc(4096, bytes));
  if (!p) return 0;
  const bool z = __builtin_cpu_supports("avx512f");
  const auto share = [n](size_t& i0, size_t& i1) {  // this thread's floats, whole lines
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    i0 = n * t / nt / 16 * 16, i1 = n * (t + 1) / nt / 16 * 16;
  };
#pragma omp parallel
  {
    size_t i0, i1;
    share(i0, i1);
    std::fill(p + i0, p + i1, 1.0f);
  }
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    {
      size_t i0, i1;
      share(i0, i1);
      sink += z ? sum512(p + i0, i1 - i0) : sum256(p + i0, i1 - i0);
    }
    if (sink == 1.0f) std::printf(" ");  // keeps the sums alive
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, double(bytes) / s * 1e-9);
  }
  std::free(p);
  return best;
}

static void peaks() {
  if (!__builtin_cpu_supports("avx512f")) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      std::printf("fp32 n/a\nbf16 n/a\n");
      return;
    }
    const double f = gflops(fma_loop_avx2, 12 * 8 * 2);  // 12 FMAs of 8 lanes
    std::printf("fp32 %.1f\nbf16 %.1f\n", f, f);
    return;
  }
  std::printf("fp32 %.1f\n", gflops(fma_loop, 12 * 16 * 2));  // 12 FMAs of 16 lanes
  if (__builtin_cpu_supports("avx512bf16"))
    std::printf("bf16 %.1f\n", gflops(bf16_loop, 12 * 16 * 4));  // 2 products + 2 adds a lane
  else
    std::printf("bf16 n/a\n");
}

int main(int argc, char** argv) {
  __builtin_cpu_init();
  peaks();
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--read") == 0 && __builtin_cpu_supports("avx")) {
      std::printf("read bandwidth: %.1f GB/s (%d threads)\n", read_gbs(), omp_get_max_threads());
      break;
    }
}
