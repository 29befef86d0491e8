// Packed AVX2 products (contract in gemm.h; blocking in gemm_driver.h): 6 x 16 tiles, 12
// accumulators of 8 lanes + 2 B vectors + a broadcast = 15 of the 16 ymm registers. Both
// kinds are fp32 FMAs: the bf16 kind rounds its operands to bf16 as it packs them (products
// of bf16 values are exact in fp32). Compiled with -mavx2 -mfma: everything here stays in an
// anonymous namespace (see gemm_driver.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/attention_driver.h"
#include "cpu/gemm_driver.h"

namespace tq::cpu {
namespace {

constexpr int MR = 6, NR = 16;

inline __m256i lanes_below(int64_t n) {  // all-ones in lanes 0..n-1
  const int c = n < 0 ? 0 : n > 8 ? 8 : int(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256i rne_biased(__m256i u) {  // u + 0x7fff + bit 16 of u: high half bf16(u), RNE
  return _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                          _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
}
// fp32 bits rounded to the nearest bf16 (ties even; NaN stays NaN), as core/common.h does.
inline __m256i round_bits(__m256i u) {
  const __m256 x = _mm256_castsi256_ps(u);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i r =
      _mm256_blendv_epi8(rne_biased(u), _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
  return _mm256_and_si256(r, _mm256_set1_epi32(int(0xffff0000u)));
}
inline __m256 round_bf16(__m256 x) {
  return _mm256_castsi256_ps(round_bits(_mm256_castps_si256(x)));
}

// 8 bf16 values from p (n of them valid, the rest 0) as fp32; and back (x holds bf16 values).
inline __m256 load_bf16(const uint16_t* p, int64_t n) {
  __m128i h;
  if (n >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    alignas(16) uint16_t t[8] = {};
    for (int64_t j = 0; j < n; ++j) t[j] = p[j];
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void store_bf16(uint16_t* p, int64_t n, __m256 x) {
  const __m256i s = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
  const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  if (n >= 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  alignas(16) uint16_t t[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
  for (int64_t j = 0; j < n; ++j) p[j] = t[j];
}
inline __m256 load_f32(const float* p, int64_t n) {
  if (n >= 8) return _mm256_loadu_ps(p);
  return n <= 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(p, lanes_below(n));
}
inline void store_f32(float* p, int64_t n, __m256 x) {
  if (n >= 8) return _mm256_storeu_ps(p, x);
  if (n > 0) _mm256_maskstore_ps(p, lanes_below(n), x);
}

// ---- packing: one slot = one k for both kinds ----

// 8 consecutive elements of v from element offset `off` as slots (the bf16 kind rounds fp32
// sources; bf16 sources are exact). `avail` of them lie inside the matrix: the rest read 0.
// Masked loads and stores are slow on AMD cores, so the packers use them only at the edges.
template <Slot SL>
inline __m256 load_slots(const View& v, int64_t off, int64_t avail) {
  if (avail <= 0) return _mm256_setzero_ps();
  if (v.bf16) return load_bf16(static_cast<const uint16_t*>(v.p) + off, avail);
  const __m256 x = load_f32(static_cast<const float*>(v.p) + off, avail);
  return SL == Slot::bf16 ? round_bf16(x) : x;
}

// r[i] <- column i of the 8x8 matrix whose rows are r[0..7].
inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int g = 0; g < 8; g += 4) {
    s[g + 0] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int q = 0; q < 4; ++q) {
    r[q] = _mm256_permute2f128_ps(s[q], s[4 + q], 0x20);
    r[4 + q] = _mm256_permute2f128_ps(s[q], s[4 + q], 0x31);
  }
}

inline void store_slot(uint32_t* d, int nr, __m256 x) {  // nr of the 8 lanes
  float* p = reinterpret_cast<float*>(d);
  if (nr == 6) {  // an A panel (MR = 6), or a row of a transposed tile
    _mm_storeu_ps(p, _mm256_castps256_ps128(x));
    return _mm_storel_pi(reinterpret_cast<__m64*>(p + 4), _mm256_extractf128_ps(x, 1));
  }
  store_f32(p, nr, x);
}

// Rows contiguous in k (ks == 1): 8 rows x 8 slots at a time through a transpose.
template <Slot SL>
void pack_kcontig(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                  int64_t s0, int64_t S) {
  for (int rg = 0; rg < R; rg += 8) {
    const int nr = R - rg < 8 ? R - rg : 8;
    for (int64_t s = 0; s < S; s += 8) {
      __m256 t[8];
      for (int r = 0; r < 8; ++r) {
        const int64_t i = r0 + rg + r;
        t[r] = r < nr && i < rows ? load_slots<SL>(v, i * v.rs + s0 + s, K - (s0 + s))
                                  : _mm256_setzero_ps();
      }
      transpose8(t);
      const int64_t ns = lo(8, S - s);
      for (int j = 0; j < ns; ++j) store_slot(dst + (s + j) * R + rg, nr, t[j]);
    }
  }
}

// Rows contiguous (rs == 1): each slot is 8 rows at a time from one k row.
// (Slot by slot, the whole panel width of each source line at once: W's rows for dx = dout W
// lie a page or more apart, and a pass per 8 lanes would fetch each line twice.)
template <Slot SL>
void pack_rcontig(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                  int64_t s0, int64_t S) {
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k = s0 + s;
    for (int rg = 0; rg < R; rg += 8) {
      const int nr = R - rg < 8 ? R - rg : 8;
      const int64_t i = r0 + rg, avail = rows - i;  // lanes past nr are read but not stored
      store_slot(dst + s * R + rg, nr,
                 k < K ? load_slots<SL>(v, i + k * v.ks, avail) : _mm256_setzero_ps());
    }
  }
}

template <Slot SL>
void pack(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R, int64_t s0,
          int64_t S) {
  static_assert(SL != Slot::bf16x2);
  if (v.ks == 1)
    pack_kcontig<SL>(dst, v, rows, K, r0, R, s0, S);
  else if (v.rs == 1)
    pack_rcontig<SL>(dst, v, rows, K, r0, R, s0, S);
  else
    pack_scalar<SL>(dst, v, rows, K, r0, R, s0, S);
}

// The R-row panels of rows r0..r0+n, dst [n/R][S][R]. MR-row panels, rows contiguous (dout's
// columns, the A of dW = doutᵀ x): slot by slot across all panels, so that each slot's source
// is one run of lines read once, not a line re-read (after its eviction) by each panel it spans.
template <Slot SL>
void pack_panels(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int64_t n,
                 int R, int64_t s0, int64_t S) {
  if (v.rs != 1 || v.ks == 1 || R != MR) {
    for (int64_t r = 0; r < n; r += R) pack<SL>(dst + r * S, v, rows, K, r0 + r, R, s0, S);
    return;
  }
  // By chunks of kChunk slots, panel by panel: the chunk's source rows stay in L1 across the
  // panels (they alias one another 8 ways at most), and each panel is written in one run (a
  // slot at a time across panels, the writes would alias as much).
  constexpr int64_t kChunk = 8;
  const int64_t avail = rows - r0,
                full = v.bf16 || avail < 8 ? 0 : lo(n, ((avail - 8) / MR + 1) * MR);
  const float* src = static_cast<const float*>(v.p) + r0;
  const int64_t ks = v.ks;
  for (int64_t c = 0; c < S; c += kChunk) {
    const int64_t cn = lo(kChunk, S - c), kn = lo(cn, K - s0 - c);  // slots inside the matrix
    int64_t r = 0;
    for (; r < full; r += MR) {
      uint32_t* d = dst + r * S + c * MR;
      int64_t s = 0;
      for (const float* row = src + (s0 + c) * ks + r; s < kn; ++s, row += ks) {
        const __m256 x = _mm256_loadu_ps(row);
        store_slot(d + s * MR, MR, SL == Slot::bf16 ? round_bf16(x) : x);
      }
      for (; s < cn; ++s) store_slot(d + s * MR, MR, _mm256_setzero_ps());
    }
    for (; r < n; r += MR)
      for (int64_t s = 0; s < cn; ++s) {
        const int64_t k = s0 + c + s;
        store_slot(dst + r * S + (c + s) * MR, MR,
                   k < K ? load_slots<SL>(v, r0 + r + k * ks, avail - r) : _mm256_setzero_ps());
      }
  }
}

// ---- micro-kernel: C[mr, nr] (+)= Ap[S][MR] x Bp[S][NR] ----

// round_bf16 without its NaN case, for the SGD step below: each value it rounds is an fp32
// sum or product of bf16 values (or of their products' sums), so a NaN among them is quiet
// with its low 16 bits zero, which this rounding leaves as it is (gemm_avx512.cpp; tested
// with NaNs and infinities against sgd_update_bf16).
inline __m256 round_bf16_quiet(__m256 x) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(rne_biased(_mm256_castps_si256(x)), _mm256_set1_epi32(int(0xffff0000u))));
}
// The optax bf16 SGD step on one weight vector w given its gradient sum g (fp32):
// bf16(w + bf16(step * bf16(0 + g))), step = bf16(-lr) -- sgd_update_bf16 in cpu/ops.cpp.
inline __m256 sgd_bf16(__m256 w, __m256 g, __m256 step) {
  g = round_bf16_quiet(_mm256_add_ps(g, _mm256_setzero_ps()));
  return round_bf16_quiet(_mm256_add_ps(w, round_bf16_quiet(_mm256_mul_ps(step, g))));
}

// Where the micro-kernel's A comes from: packed panels, MR rows in place (fp32 or bf16
// elements, row stride lda; rows past mr read row 0 and their sums are dropped), or fp32
// slots in place (MR rows contiguous, slots lda apart; rows past mr are read, then dropped).
enum class ASrc { packed, f32_rows, bf16_rows, f32_cols };

// The micro-kernel of gemm_driver.h; SGD16: C is a bf16 weight taking the step above.
template <bool SGD16, ASrc AS = ASrc::packed>
void micro(int64_t S, const uint32_t* __restrict A, const uint32_t* __restrict B, float* C,
           int64_t ldc, int mr, int nr, bool acc, float alpha, const float* init, int64_t ldi,
           const char* const* pf, int npf, int64_t lda = 0, Store st = Store::f32) {
  using AT = std::conditional_t<AS == ASrc::bf16_rows, uint16_t, float>;
  const float* a = reinterpret_cast<const float*>(A);
  const float* b = reinterpret_cast<const float*>(B);
  const AT* ar[MR];
  for (int r = 0; r < MR; ++r) ar[r] = reinterpret_cast<const AT*>(A) + (r < mr ? r * lda : 0);
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    c0[r] = c1[r] = _mm256_setzero_ps();
    if (init && r < mr) {
      c0[r] = load_f32(init + r * ldi, nr);
      c1[r] = load_f32(init + r * ldi + 8, nr - 8);
    }
    if (r < mr) {  // C is far (often DRAM): fetch it while the sum runs
      const bool c16 = SGD16 || st == Store::bf16;
      const char* cr = c16 ? reinterpret_cast<const char*>(C) + 2 * r * ldc
                           : reinterpret_cast<const char*>(C + r * ldc);
      _mm_prefetch(cr, _MM_HINT_T0);
      _mm_prefetch(cr + (c16 ? 31 : 63), _MM_HINT_T0);
    }
  }
  const auto slot = [&](int64_t s)
      __attribute__((always_inline)) {  // inlined whatever the unit size
    const __m256 b0 = _mm256_load_ps(b + s * NR), b1 = _mm256_load_ps(b + s * NR + 8);
    if (AS == ASrc::packed)
      _mm_prefetch(reinterpret_cast<const char*>(a + s * MR + 16 * MR), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      __m256 x;
      if constexpr (AS == ASrc::bf16_rows)  // 16 copies of the bf16, shifted into the top halves
        x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_set1_epi16(short(ar[r][s])), 16));
      else
        x = _mm256_broadcast_ss(AS == ASrc::f32_rows   ? ar[r] + s
                                : AS == ASrc::f32_cols ? a + s * lda + r
                                                       : a + s * MR + r);
      c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
    }
  };
  int64_t s = 0;
  for (; s < npf; ++s) {  // the next panel's lines, one per slot, then the plain loop
    _mm_prefetch(pf[s], _MM_HINT_T1);
    slot(s);
  }
#pragma GCC unroll 4
  for (; s < S; ++s) slot(s);
  const int n1 = nr - 8;
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    if (r >= mr) break;
    if constexpr (SGD16) {
      uint16_t* wr = reinterpret_cast<uint16_t*>(C) + r * ldc;
      const __m256 step = _mm256_set1_ps(alpha);
      store_bf16(wr, nr, sgd_bf16(load_bf16(wr, nr), c0[r], step));
      if (n1 > 0) store_bf16(wr + 8, n1, sgd_bf16(load_bf16(wr + 8, n1), c1[r], step));
      continue;
    }
    float* cr = C + r * ldc;
    if (acc && alpha != 1.0f) {  // one rounding, as the SGD update w -= lr * g compiles
      c0[r] = _mm256_fmadd_ps(c0[r], _mm256_set1_ps(alpha), load_f32(cr, nr));
      c1[r] = _mm256_fmadd_ps(c1[r], _mm256_set1_ps(alpha), load_f32(cr + 8, n1));
    } else if (acc) {
      c0[r] = _mm256_add_ps(c0[r], load_f32(cr, nr));
      c1[r] = _mm256_add_ps(c1[r], load_f32(cr + 8, n1));
    } else if (alpha != 1.0f) {
      c0[r] = _mm256_mul_ps(c0[r], _mm256_set1_ps(alpha));
      c1[r] = _mm256_mul_ps(c1[r], _mm256_set1_ps(alpha));
    }
    if (st != Store::f32) c0[r] = round_bf16(c0[r]), c1[r] = round_bf16(c1[r]);
    if (st == Store::bf16) {
      uint16_t* wr = reinterpret_cast<uint16_t*>(C) + r * ldc;
      store_bf16(wr, nr, c0[r]);
      if (n1 > 0) store_bf16(wr + 8, n1, c1[r]);
      continue;
    }
    store_f32(cr, nr, c0[r]);
    store_f32(cr + 8, n1, c1[r]);
  }
}

// Cᵀ[nr, mr] <- T (mr <= 8 rows of nr, aligned, row stride ldt), stored as st says (bf16
// storage: C holds uint16_t). (Read back as the vectors it was written with: scalar reads of
// fresh vector stores would stall on store forwarding.)
inline void store_transposed(float* C, int64_t ldc, const float* T, int64_t ldt, int mr, int nr,
                             Store st) {
  for (int h = 0; h < nr; h += 8) {
    __m256 t[8];
    for (int r = 0; r < 8; ++r) {
      t[r] = _mm256_setzero_ps();
      if (r >= mr) continue;
      const __m256 x = _mm256_load_ps(T + r * ldt + h);
      t[r] = st != Store::f32 ? round_bf16(x) : x;
    }
    transpose8(t);  // t[c]: column h + c, rows 0..7
    for (int c = 0; c < 8 && h + c < nr; ++c)
      if (st == Store::bf16)
        store_bf16(reinterpret_cast<uint16_t*>(C) + (h + c) * ldc, mr, t[c]);
      else
        store_slot(reinterpret_cast<uint32_t*>(C + (h + c) * ldc), mr, t[c]);
  }
}

// ---- GEMV (gemm_driver.h): one vector of k of each of R W rows against M rows of A ----

// M R accumulators, one per C element: at most 12 of the 16 ymm, the rest for W and A.
constexpr int gemv_r(int M) {
  return M == 1 ? 8 : M == 2 ? 6 : M == 3 ? 4 : M == 4 ? 3 : M <= 6 ? 2 : 1;
}

// v's lanes added in a fixed tree: halves, then quarters, ... (the same for every element)
inline float hsum(__m256 v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// 16 bf16 from p, n of them valid (the rest 0): lane j holds k = 2j low, 2j + 1 high.
inline __m256i load16_bf16(const uint16_t* p, int64_t n) {
  if (n >= 16) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) uint16_t t[16] = {};
  for (int64_t j = 0; j < n; ++j) t[j] = p[j];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
}
// Those k's as fp32: the even ones (shifted into the high halves) and the odd ones (masked).
inline __m256 even_bf16(__m256i v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline __m256 odd_bf16(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))));
}

// As on AVX-512: W's lines kGemvAhead bytes ahead with 4 rows of A or more.
constexpr int64_t kGemvAhead = 2048;

// sums[(m * R + r) * lds] = row m of A . row w[r] over K elements, lane j of a step's vector
// summing its k's in order, one FMA per product: fp32 (8 k a step; the last step masked to K),
// or for the bf16 kind W's bf16 widened in the register, 16 k a step, as its even and then its
// odd k's (gemv_a lays A's rounded rows out that way, zero past K). FMA-bound from 3 rows: built
// without AVX-512 (16 ymm), 8 rows read W at ~17 GB/s on the Zen 5 VM's 2 threads, against
// ~12 for the packed path.
template <int MM, bool BF>
void gemv_rows(int64_t K, const void* A, int64_t lda, const void* const* w, float* sums,
               int64_t lds) {
  constexpr int R = gemv_r(MM);
  constexpr bool kPrefetch = MM >= 4;
  const float* ar[MM];
  __m256 c[MM][R];
#pragma GCC unroll 8
  for (int m = 0; m < MM; ++m) {
    ar[m] = static_cast<const float*>(A) + m * lda;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c[m][r] = _mm256_setzero_ps();
  }
  if constexpr (BF) {
    const uint16_t* wr[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wr[r] = static_cast<const uint16_t*>(w[r]);
    const auto step = [&](int64_t k, int64_t n) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if constexpr (kPrefetch)
          _mm_prefetch(reinterpret_cast<const char*>(wr[r] + k) + kGemvAhead, _MM_HINT_T0);
        const __m256i x = load16_bf16(wr[r] + k, n);
        const __m256 xe = even_bf16(x), xo = odd_bf16(x);
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) {
          c[m][r] = _mm256_fmadd_ps(_mm256_load_ps(ar[m] + k), xe, c[m][r]);
          c[m][r] = _mm256_fmadd_ps(_mm256_load_ps(ar[m] + k + 8), xo, c[m][r]);
        }
      }
    };
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) step(k, 16);
    if (k < K) step(k, K - k);
  } else {
    const float* wr[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wr[r] = static_cast<const float*>(w[r]);
    const auto step = [&](int64_t k, int64_t n) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if constexpr (kPrefetch)
          _mm_prefetch(reinterpret_cast<const char*>(wr[r] + k) + kGemvAhead, _MM_HINT_T0);
        const __m256 x = load_f32(wr[r] + k, n);
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) c[m][r] = _mm256_fmadd_ps(load_f32(ar[m] + k, n), x, c[m][r]);
      }
    };
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) step(k, 8);
    if (k < K) step(k, K - k);
  }
#pragma GCC unroll 8
  for (int m = 0; m < MM; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) sums[(m * R + r) * lds] = hsum(c[m][r]);
}

// The kernel set for gemm_driver.h (the bf16 kind one k per slot, rounded on packing).
struct Kern {
  static constexpr int MR = cpu::MR, NR = cpu::NR;
  static constexpr Slot kBf16Slot = Slot::bf16;
  template <Slot SL>
  static void pack(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                   int64_t s0, int64_t S) {
    cpu::pack<SL>(dst, v, rows, K, r0, R, s0, S);
  }
  template <Slot SL>
  static void pack_panels(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0,
                          int64_t n, int R, int64_t s0, int64_t S) {
    cpu::pack_panels<SL>(dst, v, rows, K, r0, n, R, s0, S);
  }
  template <Slot SL, bool SGD16>
  static void micro(int64_t S, const uint32_t* A, const uint32_t* B, float* C, int64_t ldc, int mr,
                    int nr, bool acc, float alpha, const float* init, int64_t ldi,
                    const char* const* pf, int npf, Store st = Store::f32) {
    cpu::micro<SGD16>(S, A, B, C, ldc, mr, nr, acc, alpha, init, ldi, pf, npf, 0, st);
  }
  // gemm_skinny: C[mr, nr] (+)= A[mr, S] (in place, fp32 or bf16, row stride lda) x Bp[S][NR]
  // into an aligned [MR][NR] buffer T, then Cᵀ[nr, mr] <- T, stored as st says. (Read
  // back as the vectors it was written with: scalar reads of fresh vector stores would stall on
  // store forwarding.)
  // (B in place for dx at few rows, as on AVX-512, measured 7 % slower here: a 32-row block
  // is six tiles of six, each reading the panel's strided lines again.)
  static constexpr bool kInPlaceA = true, kInPlaceB = false;
  // (6-row tiles reading the SGD product's A in place measured 10-20 % slower than packing it)
  static constexpr bool kScaledColsA = false;
  static bool in_place(bool bf16_kind, const View& A, int64_t) { return !bf16_kind || A.bf16; }
  static void store_t(float* C, int64_t ldc, const float* T, int mr, int nr, Store st) {
    store_transposed(C, ldc, T, NR, mr, nr, st);
  }
  static void micro_inplace(int64_t S, const void* A, bool bf16, int64_t lda, const uint32_t* B,
                            float* C, int64_t ldc, int mr, int nr, bool acc, const char* const* pf,
                            int npf) {
    const auto a = static_cast<const uint32_t*>(A);
    if (bf16)
      cpu::micro<false, ASrc::bf16_rows>(S, a, B, C, ldc, mr, nr, acc, 1.0f, nullptr, 0, pf, npf,
                                         lda);
    else
      cpu::micro<false, ASrc::f32_rows>(S, a, B, C, ldc, mr, nr, acc, 1.0f, nullptr, 0, pf, npf,
                                        lda);
  }
  // dst[0..n) = src (rnd: rounded to bf16), the lines past the caches (as on AVX-512)
  static void store_nt(float* dst, const float* src, int64_t n, bool rnd) {
    int64_t i = 0;
    for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 32; ++i)
      dst[i] = rnd ? round_to_bf16(src[i]) : src[i];
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(src + i);
      _mm256_stream_ps(dst + i, rnd ? round_bf16(x) : x);
    }
    for (; i < n; ++i) dst[i] = rnd ? round_to_bf16(src[i]) : src[i];
  }
  // dst[0..n) = the bf16 bits of src (values that are bf16 already), past the caches likewise
  // (attention's saved P)
  static void store_nt_bf16(uint16_t* dst, const float* src, int64_t n) {
    int64_t i = 0;
    for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 16; ++i) dst[i] = to_bf16(src[i]);
    for (; i + 8 <= n; i += 8) {
      const __m256i x = _mm256_srli_epi32(_mm256_castps_si256(_mm256_loadu_ps(src + i)), 16);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
    }
    for (; i < n; ++i) dst[i] = to_bf16(src[i]);
  }
  // attention (cpu/attention_driver.h): its probabilities and score gradients read in place,
  // by rows (micro_inplace) or by slots lda apart
  static void micro_cols(int64_t S, const float* A, int64_t lda, const uint32_t* B, float* C,
                         int64_t ldc, int mr, int nr, bool acc, Store st = Store::f32) {
    cpu::micro<false, ASrc::f32_cols>(S, reinterpret_cast<const uint32_t*>(A), B, C, ldc, mr, nr,
                                      acc, 1.0f, nullptr, 0, nullptr, 0, lda, st);
  }
  // GEMV (gemm_driver.h): the f32 kind reads fp32 A in place and widens bf16 rows; the bf16
  // kind lays every row out for gemv_rows, rounded to bf16 (as the packs round it), each 16 k's
  // as their 8 even then their 8 odd ones, zero past K.
  static constexpr int gemv_r(int M) { return cpu::gemv_r(M); }
  template <bool BF>
  static const void* gemv_a(const View& A, int M, int64_t K, int64_t& lda) {
    if (!BF && !A.bf16) {
      lda = A.rs;
      return A.p;
    }
    lda = (K + 15) / 16 * 16;
    float* d = reinterpret_cast<float*>(workspace(M * lda));
    for (int m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; k += 16) {
        const int64_t n = K - k;
        float* dk = d + m * lda + k;
        if (!BF) {  // bf16 widened
          const uint16_t* p = static_cast<const uint16_t*>(A.p) + m * A.rs + k;
          _mm256_store_ps(dk, load_bf16(p, n));
          _mm256_store_ps(dk + 8, load_bf16(p + 8, n - 8));
          continue;
        }
        __m256i v;
        if (A.bf16) {
          v = load16_bf16(static_cast<const uint16_t*>(A.p) + m * A.rs + k, n);
        } else {  // fp32 rounded to bf16, 16 of them into one vector in order
          const float* p = static_cast<const float*>(A.p) + m * A.rs + k;
          const __m256i u0 = _mm256_srli_epi32(round_bits(_mm256_castps_si256(load_f32(p, n))), 16),
                        u1 = _mm256_srli_epi32(
                            round_bits(_mm256_castps_si256(load_f32(p + 8, n - 8))), 16);
          v = _mm256_permute4x64_epi64(_mm256_packus_epi32(u0, u1), 0xd8);
        }
        _mm256_store_ps(dk, even_bf16(v));
        _mm256_store_ps(dk + 8, odd_bf16(v));
      }
    return d;
  }
  template <bool BF>
  static void gemv_rows(int M, int64_t K, const void* a, int64_t lda, const void* const* w,
                        float* sums, int64_t lds) {
    with_gemv_rows(
        M, [&](auto rows) { cpu::gemv_rows<decltype(rows)::value, BF>(K, a, lda, w, sums, lds); });
  }
};

// ---- dx = dout W with few rows (W1's 32 tokens) ----

// Cᵀ[NT, 8 TV] (+)= sum over kn slots of W[k][n0 + i] x Dt[k][t]: NT columns of W broadcast
// where they lie (row stride ldw; WE: float, or uint16_t for bf16 weights, whose columns are
// read in pairs, one 32-bit broadcast for two, when PAIRS), Dt the tokens packed [slot][8 TV].
// The sum starts from zero or from run; it goes back to run (keep), or into cacc as C's first
// k block or added to it.
enum class WtEnd { keep, first, add };
template <int TV, int NT, class WE, bool PAIRS = false>
void micro_wt(int64_t kn, const WE* w, int64_t ldw, const float* dt, float* run, float* cacc,
              bool from_run, WtEnd end, int nt, const char* const* pf, int npf) {
  static_assert(!PAIRS || (std::is_same_v<WE, uint16_t> && NT % 2 == 0));
  constexpr int T = 8 * TV;
  __m256 c[NT][TV];
  const WE* wr[NT];
#pragma GCC unroll 8
  for (int i = 0; i < NT; ++i) {
    wr[i] = w + (i < nt ? i : 0);
#pragma GCC unroll 4
    for (int j = 0; j < TV; ++j)
      c[i][j] = from_run ? _mm256_load_ps(run + i * T + 8 * j) : _mm256_setzero_ps();
  }
  const auto slot = [&](int64_t k) __attribute__((always_inline)) {
    __m256 b[TV];
#pragma GCC unroll 4
    for (int j = 0; j < TV; ++j) {
      b[j] = _mm256_load_ps(dt + k * T + 8 * j);
      __asm__("" : "+x"(b[j]));  // in a register, not re-read by every FMA (the load ports bound)
    }
#pragma GCC unroll 8
    for (int i = 0; i < NT; ++i) {
      __m256 x;
      if constexpr (PAIRS) {  // columns i, i + 1: the low and high halves of one word
        const __m256i u = _mm256_castps_si256(
            _mm256_broadcast_ss(reinterpret_cast<const float*>(wr[i & ~1] + k * ldw)));
        x = _mm256_castsi256_ps(i % 2 ? _mm256_and_si256(u, _mm256_set1_epi32(int(0xffff0000u)))
                                      : _mm256_slli_epi32(u, 16));
      } else if constexpr (std::is_same_v<WE, uint16_t>) {
        x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_set1_epi16(short(wr[i][k * ldw])), 16));
      } else {
        x = _mm256_broadcast_ss(wr[i] + k * ldw);
      }
#pragma GCC unroll 4
      for (int j = 0; j < TV; ++j) c[i][j] = _mm256_fmadd_ps(x, b[j], c[i][j]);
    }
  };
  int64_t k = 0;
  for (; k < npf; ++k) {
    _mm_prefetch(pf[k], _MM_HINT_T1);
    slot(k);
  }
#pragma GCC unroll 4
  for (; k < kn; ++k) slot(k);
#pragma GCC unroll 8
  for (int i = 0; i < NT; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < TV; ++j) {
      float* d = (end == WtEnd::keep ? run : cacc) + i * T + 8 * j;
      _mm256_store_ps(d, end == WtEnd::add ? _mm256_add_ps(c[i][j], _mm256_load_ps(d)) : c[i][j]);
    }
}

// C[M, N] = A Bᵀ for M <= 32 rows (dx = dout W at W1's 32 tokens), B's rows contiguous in n
// (W's rows; fp32 for the fp32 kind, bf16 for the bf16 kind): computed as Cᵀ, NT columns of W by
// all tokens a tile, W broadcast where it lies and the tokens packed once [slot][T] (T = 8 TV) for
// both threads. Against the blocked product, which packs W panel by panel (reading 64 bytes from
// each of 256 rows a page or more apart) and sums 32 tokens as six 6-row tiles: each W element is
// read once per tile of columns, no rows are wasted, nothing of W is copied. The sums run in
// gemm()'s k blocks and order (each block from zero, then added to C): the same bits. BF: the bf16
// kind (the tokens rounded as packed; W bf16, two columns broadcast from one word).
template <int TV, bool BF>
void gemm_wt(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc, Store st) {
  using WE = std::conditional_t<BF, uint16_t, float>;
  constexpr Slot SL = BF ? Slot::bf16 : Slot::f32;
  constexpr int T = 8 * TV, NT = TV == 3 ? 3 : 8 / TV;  // 8-9 accumulators
  constexpr int64_t NCH = 128, KS = 64;  // columns a chunk (its sums: 2 x 16 KiB), slots a step
  const int64_t KCB = kc_for(K);
  const bool serial = omp_in_parallel() || omp_get_max_threads() == 1;
  const int nthreads = serial ? 1 : omp_get_max_threads();
  const int64_t wdt = (K * T + 15) / 16 * 16, wsum = 2 * (NCH + NT) * T;  // (a tile past nc)
  uint32_t* ws = workspace(wdt + nthreads * wsum);
  float* const dt = reinterpret_cast<float*>(ws);  // [K][T]
  const WE* W = static_cast<const WE*>(B.p);
  const int64_t ldw = B.ks;
  const auto band = [&](int t, int nt) {
    // the tokens' slots, packed by both threads
    const int64_t kg = (K + 7) / 8, p0 = kg * t / nt * 8, p1 = lo(K, kg * (t + 1) / nt * 8);
    if (p1 > p0) pack<SL>(ws + p0 * T, A, M, K, 0, T, p0, p1 - p0);
    if (!serial) {
#pragma omp barrier
    }
    float* run = reinterpret_cast<float*>(ws + wdt + t * wsum);
    float* cacc = run + (NCH + NT) * T;
    const int64_t nl = (N + 15) / 16, n0 = lo(N, nl * t / nt * 16),
                  n1 = lo(N, nl * (t + 1) / nt * 16);
    constexpr int kLines = 1024;
    const char* lines[kLines];
    for (int64_t c0 = n0; c0 < n1; c0 += NCH) {
      const int64_t nc = lo(NCH, n1 - c0), tiles = (nc + NT - 1) / NT;
      for (int64_t pc = 0; pc < K; pc += KCB) {
        const int64_t kc = lo(KCB, K - pc);
        for (int64_t s0 = 0; s0 < kc; s0 += KS) {
          const int64_t sn = lo(KS, kc - s0), k0 = pc + s0;
          // the lines of the next step (these columns' next slots, else the next chunk's
          // first), handed out to this step's tiles
          const int64_t kn0 = k0 + sn < K ? k0 + sn : 0, cn0 = k0 + sn < K ? c0 : c0 + NCH;
          const int npf = cn0 < n1 ? panel_lines<SL>(lines, kLines, B, N, K, cn0,
                                                     int(lo(NCH, n1 - cn0)), kn0, KS)
                                   : 0;
          const int per = int(lo((npf + tiles - 1) / tiles, sn));
          const WtEnd end = s0 + sn < kc ? WtEnd::keep : pc == 0 ? WtEnd::first : WtEnd::add;
          for (int64_t i = 0; i < nc; i += NT) {
            const int64_t f = (i / NT) * per;
            const int ntl = int(lo(NT, nc - i)), nf = int(lo(per, npf - f > 0 ? npf - f : 0));
            const WE* w = W + k0 * ldw + c0 + i;  // (c0 + i even with NT)
            if constexpr (BF && NT % 2 == 0)
              if (ntl == NT) {
                micro_wt<TV, NT, WE, true>(sn, w, ldw, dt + k0 * T, run + i * T, cacc + i * T,
                                           s0 > 0, end, ntl, lines + f, nf);
                continue;
              }
            micro_wt<TV, NT, WE>(sn, w, ldw, dt + k0 * T, run + i * T, cacc + i * T, s0 > 0, end,
                                 ntl, lines + f, nf);
          }
        }
      }
      // Cᵀ -> C, 8 columns at a time
      for (int64_t i = 0; i < nc; i += 8)
        store_transposed(tile(C, c0 + i, st == Store::bf16), ldc, cacc + i * T, T,
                         int(lo(8, nc - i)), int(M), st);
    }
  };
  if (serial) return band(0, 1);
#pragma omp parallel
  band(omp_get_thread_num(), omp_get_num_threads());
}

// The kinds' entries: dx at few rows as above (fp32 weights for the fp32 kind, bf16 for the
// bf16 kind), everything else the blocked product.
template <bool BF>
void gemm_entry(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
                bool accumulate, float alpha, Store st) {
  if (M > 0 && M <= 32 && N > 0 && K > 0 && !accumulate && alpha == 1.0f && B.rs == 1 &&
      B.bf16 == BF) {
    if (M > 24) return gemm_wt<4, BF>(M, N, K, A, B, C, ldc, st);
    if (M > 16) return gemm_wt<3, BF>(M, N, K, A, B, C, ldc, st);
    if (M > 8) return gemm_wt<2, BF>(M, N, K, A, B, C, ldc, st);
    return gemm_wt<1, BF>(M, N, K, A, B, C, ldc, st);
  }
  gemm<Kern, BF>(M, N, K, A, B, C, ldc, accumulate, alpha, st);
}

}  // namespace

namespace avx2 {
extern const GemmSet kernels = {
    "avx2",
    gemm_entry<false>,
    gemm_entry<true>,
    gemv<Kern, false>,
    gemv<Kern, true>,
    gemm_sgd16<Kern>,
    gemm_dx_sgd<gemm_entry<false>, false>,
    gemm_dx_sgd16<gemm_entry<true>, gemm_sgd16<Kern>, per_slot(Kern::kBf16Slot), false>,
    {attn_forward<Kern, false>, attn_forward<Kern, true>, attn_forward<Kern, true, true>},
    {attn_backward<Kern, false>, attn_backward<Kern, true>, attn_backward<Kern, true, true>}};
}  // namespace avx2

}  // namespace tq::cpu
