// The GEMV path of the CPU products (cpu/gemm.h) at Qwen3 0.6B's decoding shapes, bf16 weights
// (the bf16 kind, x in fp32, out rounded to bf16 in fp32: matmul_forward_bf16w of a bf16 run),
// against its floor, W's bytes at this machine's read bandwidth (measured here on the same
// buffer, as tq_peak --read measures it), and against the packed path (the kernel set's own
// product, gemm_skinny at these rows) on the same weights.
//   tq_gemv_bench [rows ...]    (default: 1 8), on OMP_NUM_THREADS threads; TQ_CPU=avx2 for the
//                               AVX2 set
// Each weight matrix is read from DRAM: a pass runs one product on each of the copies of W that
// fit a 1 GiB buffer (far larger than any cache), and a product's time is its pass's over the
// copies. Rounds alternate the bandwidth reading and every product, so that the VM's fast and
// slow phases (docs/performance.md) fall on all of them; the best round of each is printed.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/gemm.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The read bandwidth as tq_peak --read measures it (bench/peak.cpp): every thread sums its share
// of the buffer as 8 runs side by side, zmm loads where the CPU has them.
constexpr int kRuns = 8;
__attribute__((target("avx512f"))) float sum512(const float* p, size_t n) {
  const size_t per = n / kRuns / 32 * 32;
  __m512 a[kRuns][2];
  for (auto& r : a) r[0] = r[1] = _mm512_setzero_ps();
  for (size_t i = 0; i < per; i += 32)
    for (int s = 0; s < kRuns; ++s) {
      a[s][0] = _mm512_add_ps(a[s][0], _mm512_load_ps(p + s * per + i));
      a[s][1] = _mm512_add_ps(a[s][1], _mm512_load_ps(p + s * per + i + 16));
    }
  for (auto& r : a) a[0][0] = _mm512_add_ps(a[0][0], _mm512_add_ps(r[0], r[1]));
  float l[16], t = 0;
  _mm512_storeu_ps(l, a[0][0]);
  for (float x : l) t += x;
  return t;
}
__attribute__((target("avx"))) float sum256(const float* p, size_t n) {
  const size_t per = n / kRuns / 16 * 16;
  __m256 a[kRuns][2];
  for (auto& r : a) r[0] = r[1] = _mm256_setzero_ps();
  for (size_t i = 0; i < per; i += 16)
    for (int s = 0; s < kRuns; ++s) {
      a[s][0] = _mm256_add_ps(a[s][0], _mm256_load_ps(p + s * per + i));
      a[s][1] = _mm256_add_ps(a[s][1], _mm256_load_ps(p + s * per + i + 8));
    }
  for (auto& r : a) a[0][0] = _mm256_add_ps(a[0][0], _mm256_add_ps(r[0], r[1]));
  float l[8], t = 0;
  _mm256_storeu_ps(l, a[0][0]);
  for (float x : l) t += x;
  return t;
}
double read_gbs(const void* buf, size_t bytes) {
  const float* p = static_cast<const float*>(buf);
  const size_t n = bytes / 4;
  const bool z = __builtin_cpu_supports("avx512f");
  float sink = 0;
  const auto t0 = Clock::now();
#pragma omp parallel reduction(+ : sink)
  {
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    const size_t i0 = n * t / nt / 16 * 16, i1 = n * (t + 1) / nt / 16 * 16;
    sink += z ? sum512(p + i0, i1 - i0) : sum256(p + i0, i1 - i0);
  }
  const double s = since(t0);
  if (sink == 1.0f) std::printf(" ");  // keeps the sums alive
  return double(bytes) / s * 1e-9;
}

struct Shape {
  const char* name;
  int64_t N, K;  // W [N = OC, K = IC]
};

}  // namespace

int main(int argc, char** argv) {
  using namespace tq::cpu;
  std::vector<int64_t> rows;
  for (int i = 1; i < argc; ++i) rows.push_back(std::atoll(argv[i]));
  if (rows.empty()) rows = {1, 8};
  const char* cap = std::getenv("TQ_CPU");
  const GemmSet* set = cap && std::strcmp(cap, "avx2") == 0 ? gemm_set(Isa::avx2) : nullptr;
  if (!set) set = gemm_set(Isa::avx512) ? gemm_set(Isa::avx512) : gemm_set(Isa::avx2);
  if (!set) {
    std::printf("no AVX2 or AVX-512 kernels on this CPU\n");
    return 0;
  }
  // Qwen3 0.6B: C = 1024, F = 3072, H = 16, KVH = 8, D = 128, vocabulary 151936
  const Shape shapes[] = {{"qkv", 4096, 1024},
                          {"o", 1024, 2048},
                          {"w1|w3", 6144, 1024},
                          {"w2", 1024, 3072},
                          {"lm_head", 151936, 1024}};
  const size_t bytes = size_t(1) << 30;
  auto* buf = static_cast<uint16_t*>(std::aligned_alloc(4096, bytes));
  if (!buf) return 1;
#pragma omp parallel for schedule(static)  // (pages first touched by the thread reading them)
  for (int64_t i = 0; i < int64_t(bytes / 2); ++i)  // bf16 values in [-0.5, 0.5)
    buf[i] = uint16_t(0x3c00 + (uint32_t(i) * 2654435761u >> 24) % 0x300) | ((i & 1) << 15);

  const int64_t maxm = *std::max_element(rows.begin(), rows.end()), maxk = 3072;
  std::vector<float> x(size_t(maxm * maxk));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 37 % 101) - 50) / 64.0f;
  std::vector<float> out(size_t(maxm * 151936));

  const int rounds = 5;
  double bw = 0;
  std::vector<double> best(2 * std::size(shapes) * rows.size(), 1e30);
  for (int round = 0; round < rounds; ++round) {
    bw = std::max(bw, read_gbs(buf, bytes));
    size_t at = 0;
    for (const Shape& s : shapes)
      for (int64_t M : rows)
        for (int path = 0; path < 2; ++path, ++at) {
          const int64_t wb = s.N * s.K * 2, copies = int64_t(bytes) / wb;
          const View A{x.data(), false, s.K, 1};
          const auto t0 = Clock::now();
          for (int64_t c = 0; c < copies; ++c) {
            const View B{buf + c * s.N * s.K, true, s.K, 1};
            if (path == 0 && gemv_fits(true, M, s.N, s.K, A, B))
              set->gemv_bf16(M, s.N, s.K, A, B, out.data(), s.N, false, 1.0f, Store::round);
            else
              set->bf16(M, s.N, s.K, A, B, out.data(), s.N, false, 1.0f, Store::round);
          }
          best[at] = std::min(best[at], since(t0) / double(copies));
        }
  }
  std::printf("%s kernels, %d threads\n", set->name, omp_get_max_threads());
  std::printf("read bandwidth: %.1f GB/s (%d threads)\n", bw, omp_get_max_threads());
  std::printf("%-8s %4s %9s %9s %8s %7s %9s %8s\n", "W", "M", "MiB", "gemv ms", "GB/s", "floor",
              "packed ms", "speedup");
  size_t at = 0;
  for (const Shape& s : shapes)
    for (int64_t M : rows) {
      const double wb = double(s.N * s.K * 2), g = best[at++], p = best[at++];
      // floor: the time W's bytes take at the read bandwidth, and this product's multiple of it
      std::printf("%-8s %4lld %9.2f %9.3f %8.1f %6.2fx %9.3f %7.2fx\n", s.name,
                  static_cast<long long>(M), wb / (1 << 20), g * 1e3, wb / g * 1e-9,
                  g / (wb / (bw * 1e9)), p * 1e3, p / g);
    }
  std::free(buf);
}
