// Helpers for vectorized loops, in an anonymous namespace: each file that includes it gets its
// own copy, compiled for that file's instructions (see gemm_driver.h).
//
// vexp: exp (libm's is a call per element). 2^n p(r), r = x - n ln2 in [-ln2/2, ln2/2], Cephes'
// degree-6 polynomial; within 2 ulp of exp over the normal range (tested against std::exp), 0 below
// it, inf above, NaN kept. Branch-free, so `omp simd` loops that call it vectorize: with AVX2 only
// in files built with -fno-trapping-math (GCC will not turn its selects into blends
// otherwise), and only with plain selects and memcpy (std::clamp and std::bit_cast defeat
// GCC 12's vectorizer).
#pragma once
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tq::cpu {
namespace {

inline float vexp(float x) {
  const float n = std::nearbyint(x * 1.44269504f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  // p 2^n by adding n to p's exponent: exact where the result is normal, which covers every x
  // the selects below let through (n reaches 128 just below the overflow bound, where p <= 1).
  // The same bits as the product p 2^n1 2^n2 (n1 + n2 = n), for every float x (checked
  // exhaustively), in ~25 % fewer instructions than that product.
  // The selects one after another, each on the last one's value (their cases exclude each
  // other: the same values as nested selects, for every float x, checked exhaustively). Nested,
  // GCC builds each mask under the others' and copies a caller's division into every branch
  // (SwiGLU's bf16 forward: 22 compares and 6 divisions per 32 elements, against 16 and 2 in
  // sequence); in sequence, SwiGLU in L2 on one AVX-512 thread runs fp32 16-26 % and bf16
  // 4-10 % faster. (The form also decides an fma contraction in a caller: see swiglu_bwd in
  // cpu/layers.cpp.)
  float nc = n > 128.0f ? 128.0f : n;  // (a defined conversion)
  nc = nc < -127.0f ? -127.0f : nc;
  uint32_t u;
  std::memcpy(&u, &p, 4);
  u += uint32_t(int32_t(nc)) << 23;
  float y;
  std::memcpy(&y, &u, 4);
  y = x != x ? x : y;
  y = x > 88.72283f ? INFINITY : y;
  return x < -87.33654f ? 0.0f : y;
}

// lane_sum: the sum of term(i), i < n, in 16 lanes (lane i % 16), the lanes then added
// pairwise. By lanes because a serial sum is one add latency per element; in this order
// because an `omp simd` reduction leaves the order to the compiler, and so the bits to the
// build machine's instructions (on AVX2 a D = 128 row of the fused QK-norm summed unlike the
// same row of rmsnorm). term is inlined and vectorized across the lanes.
#if defined(__AVX__)
// lane_sum's adds across its lanes, the upper 8 already added to the lower 8 (s8): then pairs of
// 4, 2 and 1. qk512's rows in layers.cpp end their sums here too, for the same bits.
inline float lanes8_sum(__m256 s8) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif
template <class F>
inline float lane_sum(int64_t n, F term) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) acc[l] += term(i + l);
  for (int l = 0; i + l < n; ++l) acc[l] += term(i + l);
#if defined(__AVX__)
  // the same adds in registers (GCC kept the loop below in memory, each add waiting on a
  // store: a D = 128 row's fused QK-norm backward spent 13 % of its time there)
  return lanes8_sum(_mm256_add_ps(_mm256_loadu_ps(acc), _mm256_loadu_ps(acc + 8)));
#else
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
#endif
}

// lane_max: the largest of x[0..n) by std::max's select (a NaN never replaces the value kept),
// in 16 lanes, then across them. GCC keeps the serial loop scalar (one compare's latency an
// element: a 0.6B step's loss, 151,936 logits a token, spent ~15 ms there). A maximum is exact,
// so this is the serial loop's value; of a +0 and a -0 either may come back, which changes no
// x - max but a zero's sign, and exp(+-0) = 1.
inline float lane_max(const float* x, int64_t n) {
  float m[16];
  for (int l = 0; l < 16; ++l) m[l] = -INFINITY;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
#pragma omp simd
    for (int l = 0; l < 16; ++l) m[l] = m[l] < x[i + l] ? x[i + l] : m[l];
  for (int l = 0; i + l < n; ++l) m[l] = m[l] < x[i + l] ? x[i + l] : m[l];
  float r = -INFINITY;
  for (int l = 0; l < 16; ++l) r = r < m[l] ? m[l] : r;
  return r;
}

}  // namespace
}  // namespace tq::cpu
