// Packed AVX-512 matrix products (contract in gemm.h). Compiled with AVX-512 flags: keep
// this file free of inline library templates (std::min, containers), whose AVX-512 copies
// the linker could pick for the rest of the program and run on CPUs without AVX-512.
//
// Blocking (BLIS order): each thread owns a band of C and, for each block of NC columns and
// KC k-slots, packs B[block, slots] and then A[MC rows, slots] into panels of NR columns /
// MR rows (one 32-bit slot = one fp32 k, or a bf16 pair of k's, stored panel[s][r]); every
// MR x NR tile of C is one micro-kernel call: 2 x MR accumulators of 16 lanes, one
// broadcast of A and two vector loads of B per slot. Each tile is summed by one thread in
// slot order, so results do not depend on the thread count. With few rows (W1's 32 tokens)
// the weights stream from DRAM: B panels are packed as they are used while the next one is
// prefetched into L2 across the current sums, and C tiles are prefetched ahead.
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu/gemm.h"

namespace tq::cpu {
namespace {

constexpr int MR = 12, NR = 32;  // 24 accumulators + 2 B vectors + broadcasts: 32 zmm
constexpr int64_t KCMAX = 256;   // slots per k block: B panel <= 32 KiB (L1), A panel 12 KiB
constexpr int64_t NC = 3072;     // columns per block: packed B <= 3 MiB (L3)
constexpr int64_t MC = 144;      // rows per block: packed A <= 144 KiB (L2)
constexpr int64_t SCMAX = 2048;  // slots of a scaled sum done as one k block

inline int64_t lo(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Grow-only workspace of the calling thread (attention calls products from its workers).
uint32_t* workspace(int64_t words) {
  static thread_local uint32_t* buf = nullptr;
  static thread_local int64_t cap = 0;
  if (words > cap) {
    std::free(buf);
    cap = words + words / 4;
    buf = static_cast<uint32_t*>(std::aligned_alloc(64, size_t((cap * 4 + 63) / 64 * 64)));
    if (!buf) std::abort();
  }
  return buf;
}

// ---- packing: dst[s * R + r] = slot s0 + s of row r0 + r, zero outside the matrix ----

// One slot of row i: its fp32 bits (f32 kind) or a bf16 pair, low half = even k.
inline uint16_t to_bf16(float f) {  // round to nearest even (NaN stays NaN)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
inline uint16_t elem_bf16(const View& v, int64_t i, int64_t k) {
  const int64_t off = i * v.rs + k * v.ks;
  return v.bf16 ? static_cast<const uint16_t*>(v.p)[off]
                : to_bf16(static_cast<const float*>(v.p)[off]);
}
inline uint32_t elem_f32(const View& v, int64_t i, int64_t k) {
  const int64_t off = i * v.rs + k * v.ks;
  if (v.bf16) return uint32_t(static_cast<const uint16_t*>(v.p)[off]) << 16;
  uint32_t u;
  std::memcpy(&u, static_cast<const float*>(v.p) + off, 4);
  return u;
}

template <bool BF>
void pack_scalar(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                 int64_t s0, int64_t S) {
  for (int64_t s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) {
      const int64_t i = r0 + r;
      uint32_t w = 0;
      if (i < rows) {
        if (BF) {
          const int64_t k = 2 * (s0 + s);
          if (k < K) w = elem_bf16(v, i, k);
          if (k + 1 < K) w |= uint32_t(elem_bf16(v, i, k + 1)) << 16;
        } else if (s0 + s < K) {
          w = elem_f32(v, i, s0 + s);
        }
      }
      dst[s * R + r] = w;
    }
}

// 16 consecutive slots of row i from element k: masked to the matrix.
template <bool BF>
inline __m512i load_slots(const View& v, int64_t i, int64_t k, int64_t K) {
  const int64_t n = K - k;  // elements left in the row
  if (n <= 0) return _mm512_setzero_si512();
  if (BF) {
    const __mmask32 m = n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1;
    if (v.bf16)
      return _mm512_maskz_loadu_epi16(m, static_cast<const uint16_t*>(v.p) + i * v.rs + k);
    const float* p = static_cast<const float*>(v.p) + i * v.rs + k;
    const __m512 a = _mm512_maskz_loadu_ps(__mmask16(m), p);
    const __m512 b = _mm512_maskz_loadu_ps(__mmask16(m >> 16), p + 16);
    return __m512i(_mm512_cvtne2ps_pbh(b, a));
  }
  const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  if (v.bf16)
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                 m, static_cast<const uint16_t*>(v.p) + i * v.rs + k)),
                             16);
  return _mm512_maskz_loadu_epi32(m, static_cast<const float*>(v.p) + i * v.rs + k);
}

// r[i] <- column i of the 16x16 matrix whose rows are r[0..15].
inline void transpose16(__m512i r[16]) {
  __m512i b[16], c[16];
  for (int i = 0; i < 16; i += 2) {
    b[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    b[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    c[g + 0] = _mm512_unpacklo_epi64(b[g], b[g + 2]);
    c[g + 1] = _mm512_unpackhi_epi64(b[g], b[g + 2]);
    c[g + 2] = _mm512_unpacklo_epi64(b[g + 1], b[g + 3]);
    c[g + 3] = _mm512_unpackhi_epi64(b[g + 1], b[g + 3]);
  }
  // c[4g + q], lane L: rows 4g..4g+3 of column 4L + q
  for (int q = 0; q < 4; ++q) {
    const __m512i x0 = _mm512_shuffle_i32x4(c[q], c[4 + q], 0x88);
    const __m512i y0 = _mm512_shuffle_i32x4(c[8 + q], c[12 + q], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(c[q], c[4 + q], 0xdd);
    const __m512i y1 = _mm512_shuffle_i32x4(c[8 + q], c[12 + q], 0xdd);
    r[q] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[8 + q] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    r[4 + q] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + q] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
}

// Rows contiguous in k (ks == 1): 16 rows x 16 slots at a time through a transpose.
template <bool BF>
void pack_kcontig(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                  int64_t s0, int64_t S) {
  const int per = BF ? 2 : 1;
  for (int rg = 0; rg < R; rg += 16) {
    const int nr = R - rg < 16 ? R - rg : 16;
    const __mmask16 sm = __mmask16((1u << nr) - 1);
    for (int64_t s = 0; s < S; s += 16) {
      __m512i t[16];
      for (int r = 0; r < 16; ++r) {
        const int64_t i = r0 + rg + r;
        t[r] =
            r < nr && i < rows ? load_slots<BF>(v, i, (s0 + s) * per, K) : _mm512_setzero_si512();
      }
      transpose16(t);
      const int64_t ns = lo(16, S - s);
      for (int j = 0; j < ns; ++j) _mm512_mask_storeu_epi32(dst + (s + j) * R + rg, sm, t[j]);
    }
  }
}

// 16 consecutive rows of element k (rows contiguous, rs == 1), as fp32 bits.
inline __m512 load_rows_f32(const View& v, int64_t i, int64_t k, __mmask16 m) {
  if (v.bf16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                              m, static_cast<const uint16_t*>(v.p) + i + k * v.ks)),
                          16));
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(v.p) + i + k * v.ks);
}

// Rows contiguous (rs == 1): each slot is 16 rows at a time from one or two k rows.
template <bool BF>
void pack_rcontig(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                  int64_t s0, int64_t S) {
  for (int rg = 0; rg < R; rg += 16) {
    const int64_t left = rows - (r0 + rg);
    const int nr = R - rg < 16 ? R - rg : 16;
    const int nv = left <= 0 ? 0 : int(lo(nr, left));
    const __mmask16 m = __mmask16((1u << nv) - 1), sm = __mmask16((1u << nr) - 1);
    const int64_t i = r0 + rg;
    for (int64_t s = 0; s < S; ++s) {
      __m512i w;
      if (BF) {
        const int64_t k = 2 * (s0 + s);
        const __m512 a = k < K ? load_rows_f32(v, i, k, m) : _mm512_setzero_ps();
        const __m512 b = k + 1 < K ? load_rows_f32(v, i, k + 1, m) : _mm512_setzero_ps();
        // round both to bf16 (exact for bf16 values), then interleave a (low) with b (high)
        const __m256i ah = __m256i(_mm512_cvtneps_pbh(a)), bh = __m256i(_mm512_cvtneps_pbh(b));
        w = _mm512_or_si512(_mm512_cvtepu16_epi32(ah),
                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(bh), 16));
      } else {
        w = s0 + s < K ? _mm512_castps_si512(load_rows_f32(v, i, s0 + s, m))
                       : _mm512_setzero_si512();
      }
      _mm512_mask_storeu_epi32(dst + s * R + rg, sm, w);
    }
  }
}

template <bool BF>
void pack(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R, int64_t s0,
          int64_t S) {
  if (v.ks == 1)
    pack_kcontig<BF>(dst, v, rows, K, r0, R, s0, S);
  else if (v.rs == 1)
    pack_rcontig<BF>(dst, v, rows, K, r0, R, s0, S);
  else
    pack_scalar<BF>(dst, v, rows, K, r0, R, s0, S);
}

// The source lines pack() will read for these rows and slots, into `out` (at most `cap`):
// with few rows (W1's 32 tokens) each weight panel is used briefly, and DRAM latency, not
// bandwidth, bounds the product unless the next panel streams into L2 during this one --
// spread over its sum, since a burst of prefetches overflows the miss queues and is dropped.
template <bool BF>
int panel_lines(const char** out, int cap, const View& v, int64_t rows, int64_t K, int64_t r0,
                int R, int64_t s0, int64_t S) {
  const int64_t per = BF ? 2 : 1, es = v.bf16 ? 2 : 4, k0 = s0 * per, k1 = lo(K, (s0 + S) * per);
  const char* p = static_cast<const char*>(v.p);
  int n = 0;
  if (v.ks == 1) {
    for (int64_t r = r0; r < lo(rows, r0 + R); ++r)
      for (int64_t b = 0; b < (k1 - k0) * es && n < cap; b += 64)
        out[n++] = p + (r * v.rs + k0) * es + b;
  } else if (v.rs == 1 && r0 < rows) {
    const int64_t span = (lo(rows, r0 + R) - r0) * es;
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t b = 0; b < span && n < cap; b += 64) out[n++] = p + (k * v.ks + r0) * es + b;
  }
  return n;
}

// ---- micro-kernel: C[mr, nr] (+)= Ap[S][MR] x Bp[S][NR] ----
template <bool BF>
inline __m512 madd(__m512 c, __m512i a, __m512 b) {
  if constexpr (BF)
    return _mm512_dpbf16_ps(c, __m512bh(a), __m512bh(b));
  else
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), b, c);
}

// x rounded to the nearest bf16 (ties even; NaN stays NaN), as f32_to_bf16 in core/common.h
inline __m512 round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i bias = _mm512_add_epi32(
      _mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
  __m512i r = _mm512_add_epi32(u, bias);
  r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), u,
                           _mm512_set1_epi32(0x400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
}
inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline void store_bf16(uint16_t* p, __mmask16 m, __m512 x) {  // x already a bf16 value
  _mm256_mask_storeu_epi16(p, m,
                           _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}
// The optax bf16 SGD step on one weight vector w given its gradient sum g (fp32):
// bf16(w + bf16(step * bf16(0 + g))), step = bf16(-lr) -- sgd_update_bf16 in cpu/ops.cpp.
inline __m512 sgd_bf16(__m512 w, __m512 g, __m512 step) {
  g = round_bf16(_mm512_add_ps(g, _mm512_setzero_ps()));
  return round_bf16(_mm512_add_ps(w, round_bf16(_mm512_mul_ps(step, g))));
}

// SGD16: C is a bf16 weight (uint16_t) that takes the SGD step above with alpha = bf16(-lr).
// The sum starts from zero, or from `init` (fp32 partial sums, row stride ldi) when given.
template <bool BF, bool SGD16 = false>
void micro(int64_t S, const uint32_t* __restrict A, const uint32_t* __restrict B, float* C,
           int64_t ldc, int mr, int nr, bool acc, float alpha, const float* init = nullptr,
           int64_t ldi = 0, const char* const* pf = nullptr, int npf = 0) {
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xffff) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32  ? __mmask16(0xffff)
                       : nr > 16 ? __mmask16((1u << (nr - 16)) - 1)
                                 : 0;
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    c0[r] = c1[r] = _mm512_setzero_ps();
    if (init && r < mr) {
      c0[r] = _mm512_maskz_loadu_ps(m0, init + r * ldi);
      c1[r] = _mm512_maskz_loadu_ps(m1, init + r * ldi + 16);
    }
    if (r < mr) {  // C is far (often DRAM): fetch it while the sum runs
      const char* cr = SGD16 ? reinterpret_cast<const char*>(C) + 2 * r * ldc
                             : reinterpret_cast<const char*>(C + r * ldc);
      _mm_prefetch(cr, _MM_HINT_T0);
      _mm_prefetch(cr + 64, _MM_HINT_T0);
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    const __m512 b0 = _mm512_load_ps(B + s * NR), b1 = _mm512_load_ps(B + s * NR + 16);
    _mm_prefetch(reinterpret_cast<const char*>(B + s * NR + 8 * NR), _MM_HINT_T0);
    if (s < npf) _mm_prefetch(pf[s], _MM_HINT_T1);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi32(int(A[s * MR + r]));
      c0[r] = madd<BF>(c0[r], a, b0);
      c1[r] = madd<BF>(c1[r], a, b1);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r) {
    if (r >= mr) break;
    if constexpr (SGD16) {
      uint16_t* wr = reinterpret_cast<uint16_t*>(C) + r * ldc;
      const __m512 step = _mm512_set1_ps(alpha);
      store_bf16(wr, m0, sgd_bf16(load_bf16(wr, m0), c0[r], step));
      store_bf16(wr + 16, m1, sgd_bf16(load_bf16(wr + 16, m1), c1[r], step));
      continue;
    }
    float* cr = C + r * ldc;
    if (acc && alpha != 1.0f) {  // one rounding, as the SGD update w -= lr * g compiles
      c0[r] = _mm512_fmadd_ps(c0[r], _mm512_set1_ps(alpha), _mm512_maskz_loadu_ps(m0, cr));
      c1[r] = _mm512_fmadd_ps(c1[r], _mm512_set1_ps(alpha), _mm512_maskz_loadu_ps(m1, cr + 16));
    } else if (acc) {
      c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, cr));
      c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, cr + 16));
    } else if (alpha != 1.0f) {
      c0[r] = _mm512_mul_ps(c0[r], _mm512_set1_ps(alpha));
      c1[r] = _mm512_mul_ps(c1[r], _mm512_set1_ps(alpha));
    }
    _mm512_mask_storeu_ps(cr, m0, c0[r]);
    _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
  }
}

// Tile address: C holds fp32, or bf16 weights for the fused SGD step.
template <bool SGD16>
inline float* tile(float* C, int64_t off) {
  return SGD16 ? reinterpret_cast<float*>(reinterpret_cast<uint16_t*>(C) + off) : C + off;
}

// Slots per k block: at most KCMAX, blocks of equal size (a 256-wide K is one block).
int64_t kc_for(int64_t S) {
  const int64_t nb = (S + KCMAX - 1) / KCMAX;
  return ((S + nb - 1) / nb + 7) / 8 * 8;
}

template <bool BF, bool SGD16 = false>
void gemm(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc, bool accumulate,
          float alpha) {
  if (M <= 0 || N <= 0) return;
  const int64_t S = BF ? (K + 1) / 2 : K;  // slots
  if (S == 0) {                            // empty sum
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m) std::memset(C + m * ldc, 0, size_t(N) * 4);
    return;
  }
  // With alpha or the SGD step, the sum must be whole before the store: when it spans k
  // blocks, each C block is finished over all of them (partial sums in a per-thread fp32
  // block) before the next, at the price of packing B again for every block of rows.
  // A scaled sum up to SCMAX slots (the fused SGD over 2048 tokens) is one k block: measured
  // faster than finishing C blocks over several; NC shrinks to keep packed B within 4 MiB.
  const bool scaled = alpha != 1.0f || SGD16;
  const int64_t KCB = scaled && S <= SCMAX ? S : kc_for(S);
  const int64_t panels = (int64_t(1) << 20) / KCB / NR,
                NCB = lo(NC, (panels > 0 ? panels : 1) * NR);
  const bool finish = scaled && S > KCB;
  const int64_t per_thread = (MC + NCB) * KCB + (finish ? MC * NCB : 0);
  // Called from inside a parallel loop (attention's blocks): this thread does it all, without
  // the cost of entering a nested region.
  const bool serial = omp_in_parallel() || omp_get_max_threads() == 1;
  uint32_t* ws = workspace(per_thread * (serial ? 1 : omp_get_max_threads()));
  // Each thread owns a band of C (columns, or rows when there are more rows) and runs the
  // blocked product on it with its own packing buffers: no barriers, and B or A is packed
  // straight from memory into the cache that uses it.
  const auto band = [&](int t, int nt) {
    int64_t m0 = 0, m1 = M, n0 = 0, n1 = N;
    if (N / NR >= M / MR) {
      const int64_t np = (N + NR - 1) / NR;
      n0 = lo(N, np * t / nt * NR), n1 = lo(N, np * (t + 1) / nt * NR);
    } else {
      const int64_t mp = (M + MR - 1) / MR;
      m0 = lo(M, mp * t / nt * MR), m1 = lo(M, mp * (t + 1) / nt * MR);
    }
    uint32_t* Bp = ws + per_thread * t;
    uint32_t* Ap = Bp + NCB * KCB;
    float* Tp = reinterpret_cast<float*>(Ap + MC * KCB);  // [MC, NCB] partial sums (finish)
    constexpr int kLines = 2048;
    const char* lines[kLines];
    for (int64_t jc = n0; jc < n1; jc += NCB) {
      const int64_t nc = lo(NCB, n1 - jc);
      for (int64_t icf = m0; icf < (finish ? m1 : m0 + 1); icf += MC)  // finish: rows outside
        for (int64_t pc = 0; pc < S; pc += KCB) {
          const int64_t kc = lo(KCB, S - pc);
          const bool last = pc + kc == S;
          // One block of rows: pack each B panel just before its tiles, the next one's
          // source already in flight. Several: pack the B block once for all of them.
          const bool stream = m1 - m0 <= MC;
          if (!stream)
            for (int64_t jr = 0; jr < nc; jr += NR)
              pack<BF>(Bp + jr * kc, B, N, K, jc + jr, NR, pc, kc);
          for (int64_t ic = finish ? icf : m0; ic < (finish ? lo(m1, icf + MC) : m1); ic += MC) {
            const int64_t mc = lo(MC, m1 - ic), mt = (mc + MR - 1) / MR * MR;
            for (int64_t ir = 0; ir < mc; ir += MR)
              pack<BF>(Ap + ir * kc, A, M, K, ic + ir, MR, pc, kc);
            for (int64_t jr = 0; jr < nc; jr += NR) {
              int npf = 0;  // next panel's lines, handed out to this panel's tiles
              if (stream) {
                pack<BF>(Bp + jr * kc, B, N, K, jc + jr, NR, pc, kc);
                if (jr + NR < nc)
                  npf = panel_lines<BF>(lines, kLines, B, N, K, jc + jr + NR, NR, pc, kc);
                else if (!last)  // the next k block's first panel
                  npf = panel_lines<BF>(lines, kLines, B, N, K, jc, NR, pc + kc,
                                        lo(KCB, S - pc - kc));
              }
              const int per_tile = int((npf + (mc + MR - 1) / MR - 1) / ((mc + MR - 1) / MR));
              for (int64_t ir = 0; ir < mc; ir += MR) {
                const int mr = int(lo(MR, mc - ir)), nr = int(lo(NR, nc - jr));
                const uint32_t *a = Ap + ir * kc, *b = Bp + jr * kc;
                float* c = tile<SGD16>(C, (ic + ir) * ldc + jc + jr);
                float* tp = Tp + ir * NCB + jr;
                {  // C of the tile four ahead (short sums leave DRAM latency exposed)
                  int64_t pi = ir + 4 * MR, pj = jr;
                  if (pi >= mt) pi -= mt, pj += NR;
                  if (pj < nc && pi < mc)
                    for (int r = 0; r < int(lo(MR, mc - pi)); ++r) {
                      const char* cr = reinterpret_cast<const char*>(
                          tile<SGD16>(C, (ic + pi + r) * ldc + jc + pj));
                      _mm_prefetch(cr, _MM_HINT_T0);
                      _mm_prefetch(cr + (SGD16 ? 63 : 127), _MM_HINT_T0);
                    }
                }
                const int t0 = int(ir / MR) * per_tile;
                const char* const* pf = lines + t0;
                const int np = int(lo(per_tile, lo(kc, npf - t0 > 0 ? npf - t0 : 0)));
                if (!finish)
                  micro<BF, SGD16>(kc, a, b, c, ldc, mr, nr, accumulate || pc > 0,
                                   last ? alpha : 1.0f, nullptr, 0, pf, np);
                else if (!last)
                  micro<BF>(kc, a, b, tp, NCB, mr, nr, pc > 0, 1.0f, nullptr, 0, pf, np);
                else
                  micro<BF, SGD16>(kc, a, b, c, ldc, mr, nr, accumulate, alpha, tp, NCB, pf, np);
              }
            }
          }
        }
    }
  };
  if (serial) return band(0, 1);
#pragma omp parallel
  band(omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace

void gemm_f32(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
              bool accumulate, float alpha) {
  gemm<false>(M, N, K, A, B, C, ldc, accumulate, alpha);
}
void gemm_bf16(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
               bool accumulate, float alpha) {
  gemm<true>(M, N, K, A, B, C, ldc, accumulate, alpha);
}

void gemm_bf16_sgd(int64_t M, int64_t N, int64_t K, View A, View B, uint16_t* W, int64_t ldw,
                   float lr) {
  const uint32_t step = uint32_t(to_bf16(-lr)) << 16;  // bf16(-lr) as fp32 bits
  float alpha;
  std::memcpy(&alpha, &step, 4);
  gemm<true, true>(M, N, K, A, B, reinterpret_cast<float*>(W), ldw, true, alpha);
}

}  // namespace tq::cpu
