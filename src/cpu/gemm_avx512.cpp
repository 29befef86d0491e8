// Packed AVX-512 products (contract in gemm.h; blocking in gemm_driver.h): 12 x 32 tiles,
// 2 x 12 accumulators of 16 lanes, one broadcast of A and two vector loads of B per slot;
// fp32 FMAs, or vdpbf16ps on bf16 pairs for the bf16 kind. Compiled with AVX-512 flags:
// everything here stays in an anonymous namespace (see gemm_driver.h).
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <cstdint>
#include <cstring>

#include "cpu/attention_driver.h"
#include "cpu/bf16_avx512.h"
#include "cpu/gemm_driver.h"

namespace tq::cpu {
namespace {
using namespace bf16x16;  // rne_biased, round_bf16, load_bf16, store_bf16

constexpr int MR = 12, NR = 32;  // 24 accumulators + 2 B vectors + broadcasts: 32 zmm

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
    return _mm512_castps_si512(load_bf16(static_cast<const uint16_t*>(v.p) + i * v.rs + k, m));
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

// 4 slots of row i from element k, all inside the row (fp32, or bf16 pairs from bf16 or fp32).
template <bool BF>
inline __m128i load_quad(const View& v, int64_t i, int64_t k) {
  if (v.bf16)
    return _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(v.p) + i * v.rs + k));
  const float* p = static_cast<const float*>(v.p) + i * v.rs + k;
  if (BF) return __m128i(_mm256_cvtneps_pbh(_mm256_loadu_ps(p)));
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// dst[j * R + r] = slot j of row i0 + r for 16 slots from element k and nr <= 16 rows, all
// inside the matrix. Lane a of X[b][p] is row 4a + b's slots 4p..4p+3 (4-slot broadcasts, a
// row's line read whole), then a 4 x 4 transpose within each lane: half the shuffles of
// transpose16, which bound the packs (16 x 16 words in ~40 instead of ~60 ns with rows a
// 4 KiB multiple apart, ~27 instead of ~50 close together).
template <bool BF>
inline void pack16_quads(uint32_t* dst, int64_t R, const View& v, int64_t i0, int64_t k, int nr,
                         int ns, __mmask16 sm) {
  constexpr int per = BF ? 2 : 1;
  __m512i X[4][4] = {};  // lanes of rows past nr stay 0 (never stored)
#pragma GCC unroll 4
  for (int a = 0; a < 4; ++a)
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b)
      if (4 * a + b < nr)
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p)
          X[b][p] = _mm512_mask_broadcast_i32x4(X[b][p], __mmask16(0xf << (4 * a)),
                                                load_quad<BF>(v, i0 + 4 * a + b, k + 4 * p * per));
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i u0 = _mm512_unpacklo_epi32(X[0][p], X[1][p]),
                  u1 = _mm512_unpackhi_epi32(X[0][p], X[1][p]),
                  u2 = _mm512_unpacklo_epi32(X[2][p], X[3][p]),
                  u3 = _mm512_unpackhi_epi32(X[2][p], X[3][p]);
    const __m512i t[4] = {_mm512_unpacklo_epi64(u0, u2), _mm512_unpackhi_epi64(u0, u2),
                          _mm512_unpacklo_epi64(u1, u3), _mm512_unpackhi_epi64(u1, u3)};
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q)
      if (4 * p + q < ns) _mm512_mask_storeu_epi32(dst + (4 * p + q) * R, sm, t[q]);
  }
}

// Rows contiguous in k (ks == 1): 16 rows x 16 slots at a time, by pack16_quads inside the
// matrix and through transpose16 at its edges (masked loads, zeros outside). Each row gives a
// group only a line or two, rows lie pages apart (the A of dx = dout W, of the forward's x W,
// 1-24 KiB), and the hardware prefetchers did not follow such short runs: read from DRAM the
// pack ran at ~8 GB/s on one core of the Zen 5 VM. So it fetches the lines kPackAhead slots
// ahead of the rows it is on, and past their end those of the next rows it will pack (the
// next 16 of the panel, else the next panel's): ~17 GB/s; W2 forward products -5 to -7 %,
// dx -4 to -5 % (fp32 and bf16, alternating per call in one process, caches flushed).
constexpr int64_t kPackAhead = 32;
template <bool BF>
void pack_kcontig(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                  int64_t s0, int64_t S) {
  const int per = BF ? 2 : 1;
  const char* base = static_cast<const char*>(v.p);
  const int64_t es = v.bf16 ? 2 : 4, run = 16 * per * es;  // bytes of a row in a group
  for (int rg = 0; rg < R; rg += 16) {
    const int nr = R - rg < 16 ? R - rg : 16;
    const __mmask16 sm = __mmask16((1u << nr) - 1);
    // every stored row inside the matrix, in words load_quad reads (not bf16 into fp32 words)
    const bool inside = r0 + rg + nr <= rows && (BF || !v.bf16);
    const int64_t next = rg + 16 < R ? r0 + rg + 16 : r0 + R;  // the rows packed after these
    for (int64_t s = 0; s < S; s += 16) {
      if (inside && (s0 + s + 16) * per <= K) {
        for (int r = 0; r < nr; ++r) {
          int64_t i = r0 + rg + r, sa = s + kPackAhead;
          if (sa >= S) sa -= S, i = next + r;
          if (i < rows && (s0 + sa) * per < K)
            for (int64_t b = 0; b < run; b += 64)
              _mm_prefetch(base + (i * v.rs + (s0 + sa) * per) * es + b, _MM_HINT_T0);
        }
        pack16_quads<BF>(dst + s * R + rg, R, v, r0 + rg, (s0 + s) * per, nr, int(lo(16, S - s)),
                         sm);
        continue;
      }
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
  if (v.bf16) return load_bf16(static_cast<const uint16_t*>(v.p) + i + k * v.ks, m);
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(v.p) + i + k * v.ks);
}

// Rows contiguous (rs == 1): each slot is 16 rows at a time from one or two k rows.
template <bool BF>
void pack_rcontig(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                  int64_t s0, int64_t S) {
  // word i of a pair slot: bf16 i (the even k) low, bf16 16 + i (the odd k) high (a local
  // constant: nothing AVX-512 may run at load time on CPUs without it)
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int rg = 0; rg < R; rg += 16) {
    const int64_t left = rows - (r0 + rg);
    const int nr = R - rg < 16 ? R - rg : 16;
    const int nv = left <= 0 ? 0 : int(lo(nr, left));
    const __mmask16 m = __mmask16((1u << nv) - 1), sm = __mmask16((1u << nr) - 1);
    const int64_t i = r0 + rg;
    for (int64_t s = 0; s < S; ++s) {
      __m512i w;
      if (BF && v.bf16) {  // the two k rows' bf16 side by side, interleaved: no widening
        const int64_t k = 2 * (s0 + s);
        const uint16_t* p = static_cast<const uint16_t*>(v.p) + i;
        const __m256i a =
            k < K ? _mm256_maskz_loadu_epi16(m, p + k * v.ks) : _mm256_setzero_si256();
        const __m256i b =
            k + 1 < K ? _mm256_maskz_loadu_epi16(m, p + (k + 1) * v.ks) : _mm256_setzero_si256();
        w = _mm512_permutexvar_epi16(pairs, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
      } else if (BF) {
        const int64_t k = 2 * (s0 + s);
        const __m512 a = k < K ? load_rows_f32(v, i, k, m) : _mm512_setzero_ps();
        const __m512 b = k + 1 < K ? load_rows_f32(v, i, k + 1, m) : _mm512_setzero_ps();
        // round both to bf16 (exact for bf16 values): [a0..a15 b0..b15], then interleave
        w = _mm512_permutexvar_epi16(pairs, __m512i(_mm512_cvtne2ps_pbh(b, a)));
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
    pack_scalar<BF ? Slot::bf16x2 : Slot::f32>(dst, v, rows, K, r0, R, s0, S);
}

// The R-row panels of rows r0..r0+n, dst [n/R][S][R]. Rows contiguous (the A and B of
// dW = doutᵀ x, the B of dx = dout W): by chunks of a few slots across all panels, so that each
// source line is read once, and each k row as one run, not once per panel (k rows 4 KiB
// multiples apart share one L1 set: a chunk reads at most 8 of them). The next chunk's runs
// are fetched into L1 meanwhile: its k rows lie a page or more apart (dout's rows, 16-24 KiB
// in dW's A), where no hardware prefetcher follows, so each line would wait on DRAM in turn
// (W2 bf16 SGD products -18 %, dx -4 % on Zen 5; fp32 dW reads its A in place). One chunk
// ahead is not enough to cover DRAM latency: the chunk four ahead is also fetched into L2
// (W2 bf16 SGD products a further -4 %, fp32 dx + dW -3 % on Zen 4). Where the rows are
// long (at least a line a panel: x in the wo and w2 SGD products), each panel packed issues
// its share of those lines, not all of them in a burst before the first (Zen 5, both ways
// alternating in one process: those products -3 to -6 %; spread over short runs, A of qkv
// and w13, +1 to +3 %; the same bits). Written out
// here, not through a line visitor shared with panel_lines: built that way, GCC 12 left no
// prefetch in the object at all (measured +24 %, then seen in the disassembly).
template <bool BF>
void pack_panels(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int64_t n,
                 int R, int64_t s0, int64_t S) {
  constexpr int64_t per = BF ? 2 : 1;
  const bool chunked = v.rs == 1 && v.ks != 1;
  const int64_t chunk = chunked ? (BF ? 4 : 8) : S, es = v.bf16 ? 2 : 4,
                span = (lo(rows, r0 + n) - r0) * es;
  const char* src = static_cast<const char*>(v.p) + r0 * es;
  // lines of a chunk's k row; spread over the panels where each gets one of its own
  const int64_t lines = (span + 63) / 64, np = (n + R - 1) / R;
  const bool spread = lines >= np;
  for (int64_t c = 0; c < S; c += chunk) {
    const int64_t k4 = (s0 + c + 4 * chunk) * per, e4 = lo(K, k4 + chunk * per),
                  k1 = (s0 + c + chunk) * per, e1 = lo(K, k1 + chunk * per);
    for (int64_t r = 0; r < n; r += R) {
      if (chunked) {  // the chunk 4 ahead into L2, the next one into L1 (spread: a panel's share)
        const int64_t p = r / R;
        // clang-format off
        const int64_t b0 = spread ? p * lines / np * 64 : 0,
                      b1 = spread ? (p + 1) * lines / np * 64 : r == 0 ? lines * 64 : 0;
        // clang-format on
        for (int64_t k = k4; k < e4; ++k)
          for (int64_t b = b0; b < b1; b += 64) _mm_prefetch(src + k * v.ks * es + b, _MM_HINT_T1);
        for (int64_t k = k1; k < e1; ++k)
          for (int64_t b = b0; b < b1; b += 64) _mm_prefetch(src + k * v.ks * es + b, _MM_HINT_T0);
      }
      pack<BF>(dst + r * S + c * R, v, rows, K, r0 + r, R, s0 + c, lo(chunk, S - c));
    }
  }
}

// ---- micro-kernel: C[mr, nr] (+)= Ap[S][MR] x Bp[S][NR] ----
template <bool BF>
inline __m512 madd(__m512 c, __m512i a, __m512 b) {
  if constexpr (BF)
    return _mm512_dpbf16_ps(c, __m512bh(a), __m512bh(b));
  else
    return _mm512_fmadd_ps(_mm512_castsi512_ps(a), b, c);
}

// The optax bf16 SGD step, bf16(w + bf16(step * bf16(0 + g))) with step = bf16(-lr)
// (sgd_update_bf16 in cpu/ops.cpp), for a row of up to 32 weights (sgd_row). Its roundings
// have no NaN case: each rounds an fp32 sum or product of bf16 values (or of their products'
// sums), so a NaN there is quiet with its low 16 bits zero, which the plain rounding leaves as
// it is (tested with NaNs and infinities against sgd_update_bf16): round_bf16 without its
// compare and or. The step takes ~40 % fewer instructions this way than with the full
// rounding, which at W1's 32 tokens was half of the SGD products' time.
inline __m512 round_bf16_quiet(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(rne_biased(_mm512_castps_si512(x)), _mm512_set1_epi32(int(0xffff0000u))));
}
// Row r (32 weights at wr, the first nr in mask m) from its sums g0 (weights 0-15), g1
// (16-31). Stored as one vector, the high halves of the two results picked by `halves`
// (_mm512_permutex2var_epi16 indices; measured faster than two narrowing stores).
inline void sgd_row(uint16_t* wr, __mmask32 m, __m512 g0, __m512 g1, __m512 step, __m512i halves) {
  const __m512 w0 = load_bf16(wr, __mmask16(m)), w1 = load_bf16(wr + 16, __mmask16(m >> 16));
  // bf16(w + bf16(step * bf16(0 + g)))
  const __m512 t0 = round_bf16_quiet(
      _mm512_mul_ps(step, round_bf16_quiet(_mm512_add_ps(g0, _mm512_setzero_ps()))));
  const __m512 t1 = round_bf16_quiet(
      _mm512_mul_ps(step, round_bf16_quiet(_mm512_add_ps(g1, _mm512_setzero_ps()))));
  const __m512i n0 = rne_biased(_mm512_castps_si512(_mm512_add_ps(w0, t0))),
                n1 = rne_biased(_mm512_castps_si512(_mm512_add_ps(w1, t1)));
  _mm512_mask_storeu_epi16(wr, m, _mm512_permutex2var_epi16(n0, halves, n1));
}
alignas(64) constexpr uint16_t sgd_halves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

// Where the micro-kernel's A comes from: packed panels; MR rows in place (slot s of row r is
// word s of A + r * lda: an fp32 element, or a bf16 pair; rows past mr read row 0 and their
// sums are dropped); or fp32 slots in place (MR rows contiguous, slots lda apart; rows past mr
// are read, then dropped).
enum class ASrc { packed, rows, cols };

// Pairs of two bf16 rows x0, x1 (32 each) for vpermt2w: columns 0-15, then 16-31, each as
// (x0[c], x1[c]) words
alignas(64) constexpr uint16_t bip_pairs[64] = {
    0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
    11, 43, 12, 44, 13, 45, 14, 46, 15, 47, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53,
    22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

// The micro-kernel of gemm_driver.h; SGD16: C is a bf16 weight taking the step above.
// BIP: B in place instead of packed, slot s at B + s * ldb (fp32 rows of a matrix: masked to
// nr columns at its edge); with BF, bf16 rows, slot s the rows 2s and 2s + 1 at B + 2 s ldb,
// interleaved into pairs here (W1's dx = dout W of bf16 weights: no pack of W). RT: the rows
// it sums (mr <= RT), MR or, for a tile of at most 8 rows, 8 (W1's 32 tokens are tiles of 12,
// 12 and 8 rows in dx = dout W: -11 % FMAs there).
template <bool BF, bool SGD16 = false, ASrc AS = ASrc::packed, bool BIP = false, int RT = MR>
void micro(int64_t S, const uint32_t* __restrict A, const uint32_t* __restrict B, float* C,
           int64_t ldc, int mr, int nr, bool acc, float alpha, const float* init = nullptr,
           int64_t ldi = 0, const char* const* pf = nullptr, int npf = 0, int64_t lda = 0,
           Store st = Store::f32, int64_t ldb = NR) {
  const uint32_t* ar[MR];
  for (int r = 0; r < MR; ++r) ar[r] = A + (r < mr ? r * lda : 0);
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xffff) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32  ? __mmask16(0xffff)
                       : nr > 16 ? __mmask16((1u << (nr - 16)) - 1)
                                 : 0;
  __m512 c0[RT], c1[RT];
#pragma GCC unroll 12
  for (int r = 0; r < RT; ++r) {
    c0[r] = c1[r] = _mm512_setzero_ps();
    if (init && r < mr) {
      c0[r] = _mm512_maskz_loadu_ps(m0, init + r * ldi);
      c1[r] = _mm512_maskz_loadu_ps(m1, init + r * ldi + 16);
    }
    if (r < mr) {  // C is far (often DRAM): fetch it while the sum runs
      const char* cr = SGD16 || st == Store::bf16 ? reinterpret_cast<const char*>(C) + 2 * r * ldc
                                                  : reinterpret_cast<const char*>(C + r * ldc);
      _mm_prefetch(cr, _MM_HINT_T0);
      _mm_prefetch(cr + 64, _MM_HINT_T0);
    }
  }
  const bool edge = nr < NR;
  // BF with BIP: slot s is k rows 2s and 2s + 1 of bf16 B, interleaved into pairs here
  const __mmask32 m32 = nr >= 32 ? ~__mmask32(0) : (__mmask32(1) << nr) - 1;
  __m512i lo16, hi16;
  if constexpr (BF && BIP)
    lo16 = _mm512_load_si512(bip_pairs), hi16 = _mm512_load_si512(bip_pairs + 32);
  for (int64_t s = 0; s < S; ++s) {
    __m512 b0, b1;
    if constexpr (BF && BIP) {
      const uint16_t* bs = reinterpret_cast<const uint16_t*>(B) + 2 * s * ldb;
      const __m512i x0 = _mm512_maskz_loadu_epi16(m32, bs),
                    x1 = _mm512_maskz_loadu_epi16(m32, bs + ldb);
      b0 = _mm512_castsi512_ps(_mm512_permutex2var_epi16(x0, lo16, x1));
      b1 = _mm512_castsi512_ps(_mm512_permutex2var_epi16(x0, hi16, x1));
      _mm_prefetch(reinterpret_cast<const char*>(bs + 16 * ldb), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(bs + 17 * ldb), _MM_HINT_T0);
    } else if constexpr (BIP) {
      const uint32_t* bs = B + s * ldb;
      b0 = edge ? _mm512_maskz_loadu_ps(m0, bs) : _mm512_loadu_ps(bs);
      b1 = edge ? _mm512_maskz_loadu_ps(m1, bs + 16) : _mm512_loadu_ps(bs + 16);
      _mm_prefetch(reinterpret_cast<const char*>(bs + 8 * ldb), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(bs + 8 * ldb + 16), _MM_HINT_T0);
    } else {
      b0 = _mm512_load_ps(B + s * NR), b1 = _mm512_load_ps(B + s * NR + 16);
      // both lines of the slot 16 ahead: B panels are often in L3 (packed B blocks up to
      // 3 MiB), and 8 slots (one line each) did not cover its latency (products -2 to -5 %)
      _mm_prefetch(reinterpret_cast<const char*>(B + (s + 16) * NR), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(B + (s + 16) * NR + 16), _MM_HINT_T0);
    }
    if (s < npf) _mm_prefetch(pf[s], _MM_HINT_T1);
#pragma GCC unroll 12
    for (int r = 0; r < RT; ++r) {
      const __m512i a = _mm512_set1_epi32(int(AS == ASrc::rows   ? ar[r][s]
                                              : AS == ASrc::cols ? A[s * lda + r]
                                                                 : A[s * MR + r]));
      c0[r] = madd<BF>(c0[r], a, b0);
      c1[r] = madd<BF>(c1[r], a, b1);
    }
  }
  if constexpr (SGD16) {
    const __m512i halves = _mm512_load_si512(sgd_halves);
    const __mmask32 m = nr >= 32 ? ~__mmask32(0) : (__mmask32(1) << nr) - 1;
#pragma GCC unroll 12
    for (int r = 0; r < RT; ++r) {
      if (r >= mr) break;
      sgd_row(reinterpret_cast<uint16_t*>(C) + r * ldc, m, c0[r], c1[r], _mm512_set1_ps(alpha),
              halves);
    }
    return;
  }
#pragma GCC unroll 12
  for (int r = 0; r < RT; ++r) {
    if (r >= mr) break;
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
    if (st != Store::f32) c0[r] = round_bf16(c0[r]), c1[r] = round_bf16(c1[r]);
    if (st == Store::bf16) {
      uint16_t* wr = reinterpret_cast<uint16_t*>(C) + r * ldc;
      store_bf16(wr, m0, c0[r]);
      store_bf16(wr + 16, m1, c1[r]);
      continue;
    }
    _mm512_mask_storeu_ps(cr, m0, c0[r]);
    _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
  }
}

// ---- GEMV (gemm_driver.h): one vector of k of each of R W rows against M rows of A ----

// M R accumulators, one per C element, beside R vectors of W and one of A: at most 29 of the 32
// zmm. With W in L2, one core summed 8 rows at ~40 GB/s of W (R = 3: vdpbf16ps at ~75 % of
// tq_peak) and 1 row at ~100 (R = 8); R = 12 for one row ran at half that.
constexpr int gemv_r(int M) {
  return M <= 2 ? 8 : M == 3 ? 6 : M == 4 ? 5 : M <= 6 ? 4 : 3;
}

// v's lanes added in a fixed tree: halves, then quarters, ... (the same for every element)
inline float hsum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// With 4 rows of A or more, each step also fetches W's lines kGemvAhead bytes ahead (past the
// end of a row, its sub-band's next one): 8 rows took 15-17 % less time with it than with the
// hardware prefetchers alone (W1|W3, W2, qkv, lm_head; 2 threads), 4 rows -9 to +4 %; with 1-3
// rows it cost 1-8 % (the hardware prefetchers keep up there).
constexpr int64_t kGemvAhead = 2048;

// sums[(m * R + r) * lds] = row m of A . row w[r] over K elements, lane j of a step's vector
// summing its k's in order: fp32 FMAs (16 k a step), or for the bf16 kind bf16 pairs by
// vdpbf16ps (32 k a step, an odd K padded with 0), as the packed kernels sum them. The last
// step is masked to K (zeros add nothing).
template <int MM, bool BF>
void gemv_rows(int64_t K, const void* A, int64_t lda, const void* const* w, float* sums,
               int64_t lds) {
  constexpr int R = gemv_r(MM);
  constexpr bool kPrefetch = MM >= 4;
  constexpr int64_t V = BF ? 32 : 16, es = BF ? 2 : 4;
  const char* ar[MM];
  const char* wr[R];
  __m512 c[MM][R];
#pragma GCC unroll 8
  for (int m = 0; m < MM; ++m) {
    ar[m] = static_cast<const char*>(A) + m * lda * es;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c[m][r] = _mm512_setzero_ps();
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wr[r] = static_cast<const char*>(w[r]);
  const auto step = [&](int64_t off, __mmask32 mk, bool tail) __attribute__((always_inline)) {
    const auto load = [&](const char* p) __attribute__((always_inline)) {
      if (!tail) return _mm512_loadu_si512(p);
      return BF ? _mm512_maskz_loadu_epi16(mk, p) : _mm512_maskz_loadu_epi32(__mmask16(mk), p);
    };
    // W's vectors held, each A vector loaded once a step into a register (the asm: else GCC
    // folds it into every FMA as a memory operand). Loaded once per W vector, 8 rows ran at 19.5
    // instead of 34 GB/s from L2 (the load ports bound).
    __m512i x[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[r] = load(wr[r] + off);
    if constexpr (kPrefetch)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) _mm_prefetch(wr[r] + off + kGemvAhead, _MM_HINT_T0);
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m) {
      __m512i y = load(ar[m] + off);
      __asm__("" : "+v"(y));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        if constexpr (BF)
          c[m][r] = _mm512_dpbf16_ps(c[m][r], __m512bh(y), __m512bh(x[r]));
        else
          c[m][r] = _mm512_fmadd_ps(_mm512_castsi512_ps(y), _mm512_castsi512_ps(x[r]), c[m][r]);
    }
  };
  int64_t k = 0;
  for (; k + V <= K; k += V) step(k * es, ~__mmask32(0), false);
  if (k < K) {
    const int64_t n = K - k;  // < V
    step(k * es, BF ? (__mmask32(1) << n) - 1 : __mmask32((1u << n) - 1), true);
  }
#pragma GCC unroll 8
  for (int m = 0; m < MM; ++m)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) sums[(m * R + r) * lds] = hsum(c[m][r]);
}

// The kernel set for gemm_driver.h (the bf16 kind as pairs: Slot::bf16 is never asked for).
struct Kern {
  static constexpr int MR = cpu::MR, NR = cpu::NR;
  static constexpr Slot kBf16Slot = Slot::bf16x2;
  template <Slot SL>
  static void pack(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                   int64_t s0, int64_t S) {
    static_assert(SL != Slot::bf16);
    cpu::pack<SL == Slot::bf16x2>(dst, v, rows, K, r0, R, s0, S);
  }
  template <Slot SL>
  static void pack_panels(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0,
                          int64_t n, int R, int64_t s0, int64_t S) {
    cpu::pack_panels<SL == Slot::bf16x2>(dst, v, rows, K, r0, n, R, s0, S);
  }
  template <Slot SL, bool SGD16>
  static void micro(int64_t S, const uint32_t* A, const uint32_t* B, float* C, int64_t ldc, int mr,
                    int nr, bool acc, float alpha, const float* init, int64_t ldi,
                    const char* const* pf, int npf, Store st = Store::f32) {
    if (mr <= 8)
      return cpu::micro<SL == Slot::bf16x2, SGD16, ASrc::packed, false, 8>(
          S, A, B, C, ldc, mr, nr, acc, alpha, init, ldi, pf, npf, 0, st);
    cpu::micro<SL == Slot::bf16x2, SGD16>(S, A, B, C, ldc, mr, nr, acc, alpha, init, ldi, pf, npf,
                                          0, st);
  }
  // gemm_skinny: C[mr, nr] (+)= A[mr, S] (in place: fp32 elements, or bf16 pairs for the
  // bf16 kind; row stride lda elements) x Bp[S][NR] into an aligned [MR][NR] buffer T, then
  // Cᵀ[nr, mr] <- T, stored as st says (C: uint16_t for Store::bf16). Pairs in place need an
  // even K (a pair must not run past its row).
  static constexpr bool kInPlaceA = true;
  // the scaled sums read a rows-contiguous fp32 A in place (micro_cols): W2's SGD product -5 %
  static constexpr bool kScaledColsA = true;
  static bool in_place(bool bf16_kind, const View& A, int64_t K) {
    return bf16_kind
               ? A.bf16 && K % 2 == 0 && A.rs % 2 == 0 && reinterpret_cast<uintptr_t>(A.p) % 4 == 0
               : !A.bf16;
  }
  static void store_t(float* C, int64_t ldc, const float* T, int mr, int nr, Store st) {
    const __mmask16 m = __mmask16((1u << mr) - 1);
    for (int h = 0; h < nr; h += 16) {
      __m512i t[16];
      for (int r = 0; r < 16; ++r) {
        t[r] = _mm512_setzero_si512();
        if (r >= mr) continue;
        const __m512 x = _mm512_load_ps(T + r * NR + h);
        t[r] = _mm512_castps_si512(st != Store::f32 ? round_bf16(x) : x);
      }
      transpose16(t);  // t[c]: token h + c, rows 0..15
      for (int c = 0; c < 16 && h + c < nr; ++c)
        if (st == Store::bf16)
          store_bf16(reinterpret_cast<uint16_t*>(C) + (h + c) * ldc, m, _mm512_castsi512_ps(t[c]));
        else
          _mm512_mask_storeu_epi32(C + (h + c) * ldc, m, t[c]);
    }
  }
  static void micro_inplace(int64_t S, const void* A, bool bf16, int64_t lda, const uint32_t* B,
                            float* C, int64_t ldc, int mr, int nr, bool acc, const char* const* pf,
                            int npf) {
    const auto a = static_cast<const uint32_t*>(A);
    if (bf16)  // the bf16 kind's pairs
      cpu::micro<true, false, ASrc::rows>(S, a, B, C, ldc, mr, nr, acc, 1.0f, nullptr, 0, pf, npf,
                                          lda / 2);
    else
      cpu::micro<false, false, ASrc::rows>(S, a, B, C, ldc, mr, nr, acc, 1.0f, nullptr, 0, pf, npf,
                                           lda);
  }
  // B in place (kInPlaceB), masked to nr columns: fp32 rows of the matrix, slot s at
  // B + s * ldb, or (BF) bf16 rows, slot s the rows 2s and 2s + 1 at B + 2 s ldb (an even K)
  static constexpr bool kInPlaceB = true;
  template <bool BF>
  static void micro_bip(int64_t S, const uint32_t* A, const void* B, int64_t ldb, float* C,
                        int64_t ldc, int mr, int nr, bool acc, const char* const* pf, int npf,
                        Store st) {
    const auto b = static_cast<const uint32_t*>(B);
    if (mr <= 8)
      return cpu::micro<BF, false, ASrc::packed, true, 8>(S, A, b, C, ldc, mr, nr, acc, 1.0f,
                                                          nullptr, 0, pf, npf, 0, st, ldb);
    cpu::micro<BF, false, ASrc::packed, true>(S, A, b, C, ldc, mr, nr, acc, 1.0f, nullptr, 0, pf,
                                              npf, 0, st, ldb);
  }
  // dst[0..n) = src (rnd: rounded to bf16), the 64-byte lines past the caches: results written
  // once, a few lines each far apart, and read only by a later kernel (attention's dK, dV),
  // that would otherwise each be read in from DRAM first. The caller fences (_mm_sfence).
  static void store_nt(float* dst, const float* src, int64_t n, bool rnd) {
    int64_t i = 0;
    for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 64; ++i)
      dst[i] = rnd ? round_to_bf16(src[i]) : src[i];
    for (; i + 16 <= n; i += 16) {
      const __m512 x = _mm512_loadu_ps(src + i);
      _mm512_stream_ps(dst + i, rnd ? round_bf16(x) : x);
    }
    for (; i < n; ++i) dst[i] = rnd ? round_to_bf16(src[i]) : src[i];
  }
  // dst[0..n) = the bf16 bits of src (values that are bf16 already), past the caches likewise
  // (attention's saved P)
  static void store_nt_bf16(uint16_t* dst, const float* src, int64_t n) {
    int64_t i = 0;
    for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 32; ++i) dst[i] = to_bf16(src[i]);
    for (; i + 16 <= n; i += 16) {
      const __m512i x = _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(src + i)), 16);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(x));
    }
    for (; i < n; ++i) dst[i] = to_bf16(src[i]);
  }
  // attention (cpu/attention_driver.h), fp32: its probabilities and score gradients read in
  // place, by rows (micro_inplace) or by slots lda apart
  static void micro_cols(int64_t S, const float* A, int64_t lda, const uint32_t* B, float* C,
                         int64_t ldc, int mr, int nr, bool acc, Store st = Store::f32,
                         float alpha = 1.0f, const float* init = nullptr, int64_t ldi = 0,
                         const char* const* pf = nullptr, int npf = 0) {
    cpu::micro<false, false, ASrc::cols>(S, reinterpret_cast<const uint32_t*>(A), B, C, ldc, mr, nr,
                                         acc, alpha, init, ldi, pf, npf, lda, st);
  }
  // GEMV (gemm_driver.h): A in place where its storage is the kind's (fp32 for the f32 kind,
  // bf16 for the bf16 kind), else converted row by row: the bf16 kind rounds fp32 rows as the
  // packs do (vcvtne2ps2bf16), the f32 kind widens bf16 rows.
  static constexpr int gemv_r(int M) { return cpu::gemv_r(M); }
  template <bool BF>
  static const void* gemv_a(const View& A, int M, int64_t K, int64_t& lda) {
    if (A.bf16 == BF) {
      lda = A.rs;
      return A.p;
    }
    lda = (K + 31) / 32 * 32;
    uint32_t* ws = workspace(BF ? M * lda / 2 : M * lda);
    for (int m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; k += 32) {
        const int64_t n = K - k;
        const __mmask16 m0 = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1),
                        m1 = n >= 32  ? __mmask16(0xffff)
                             : n > 16 ? __mmask16((1u << (n - 16)) - 1)
                                      : 0;
        if constexpr (BF) {
          const float* p = static_cast<const float*>(A.p) + m * A.rs + k;
          const __m512 x0 = _mm512_maskz_loadu_ps(m0, p), x1 = _mm512_maskz_loadu_ps(m1, p + 16);
          _mm512_store_si512(reinterpret_cast<uint16_t*>(ws) + m * lda + k,
                             __m512i(_mm512_cvtne2ps_pbh(x1, x0)));
        } else {
          const uint16_t* p = static_cast<const uint16_t*>(A.p) + m * A.rs + k;
          float* d = reinterpret_cast<float*>(ws) + m * lda + k;
          _mm512_store_ps(d, load_bf16(p, m0));
          _mm512_store_ps(d + 16, load_bf16(p + 16, m1));
        }
      }
    return ws;
  }
  template <bool BF>
  static void gemv_rows(int M, int64_t K, const void* a, int64_t lda, const void* const* w,
                        float* sums, int64_t lds) {
    with_gemv_rows(
        M, [&](auto rows) { cpu::gemv_rows<decltype(rows)::value, BF>(K, a, lda, w, sums, lds); });
  }
};

}  // namespace

namespace avx512 {
extern const GemmSet kernels = {
    "avx512_bf16",
    gemm<Kern, false>,
    gemm<Kern, true>,
    gemv<Kern, false>,
    gemv<Kern, true>,
    gemm_sgd16<Kern>,
    gemm_dx_sgd<gemm<Kern, false>, true>,
    gemm_dx_sgd16<gemm<Kern, true>, gemm_sgd16<Kern>, per_slot(Kern::kBf16Slot), true>,
    {attn_forward<Kern, false>, attn_forward<Kern, true>, attn_forward<Kern, true, true>},
    {attn_backward<Kern, false>, attn_backward<Kern, true>, attn_backward<Kern, true, true>}};
}  // namespace avx512

}  // namespace tq::cpu
