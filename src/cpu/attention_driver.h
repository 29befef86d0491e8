// Causal and block-causal attention on one kernel set (contract: attention_forward/backward in
// cpu/layers.h), included after gemm_driver.h by the files that include it, so built for their
// instructions (the softmaxes too) and kept in their anonymous namespace.
//
// One task per (sequence, kv head): K and V are packed once for its G query heads, and it
// owns their dK, dV rows. A thread claims its next task when it starts one, and fetches that
// task's K and V rows (and each next block's query rows) between micro-tiles (RowFetch).
// Every product reads packed panels of the kernel set and runs its micro-kernel on whole
// tiles, in the orientation that needs no transposed copy of a result:
//   scores  Sᵀ[key][query] = K Qᵀ: K as A panels (MR keys), a block of queries as B panels
//           (NR queries), so the softmax runs down columns, vectorized across queries;
//   O = P V, dQ = dS K: P, dS as A panels of MR queries, each summed over just the keys its
//           queries see; V, K as B panels of NR dims;
//   dV += Pᵀ dO, dK += dSᵀ Q: Pᵀ, dSᵀ as A panels of MR keys, summed over the block's
//           queries from the first that sees them; dO, Q as B panels of NR dims.
// Score tiles the mask hides entirely are never computed: those after a panel's last query
// (causal), and block-causal (doc, model/ops.h) those before the first key its first query sees
// (the panel's least: document starts never decrease); the products then sum over just the keys
// and queries those tiles leave. Where P is small enough the forward saves it (AttnProbs in
// cpu/gemm.h) and the backward reads it, so that only dPᵀ = V dOᵀ is a score product there;
// else the backward recomputes Sᵀ and P = exp(S - lse).
// Each output element is summed by one task in a fixed order: results do not depend on the
// thread count. With a QkNorm (cpu/gemm.h; attention_qkn_*) the drivers read the fused
// projection instead of q, k, v: a task's keys and each block's queries are normalized and
// rotated into per-thread buffers as they are needed (rows D apart, which the packs read
// faster than token-major rows), and dQ (per block) and dK (per task) are turned back into its
// gradient while they are in cache.
#pragma once
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/gemm_driver.h"
#include "cpu/vmath.h"

namespace tq::cpu {
namespace {

inline int64_t round_up(int64_t a, int64_t m) {
  return (a + m - 1) / m * m;
}

// The rows the next query block (and the next task) will read, fetched a few lines at a
// time between this block's micro-tiles. A token's head row is 512 bytes and rows lie 4-8 KiB
// apart, where no hardware prefetcher follows: the packs of Q, K and V waited on each line in
// turn (in a W2 layer's fp32 forward ~30 % of the time, at ~5 GB/s a thread). Into L1, not
// L2: measured faster, as was leaving the outputs' lines alone.
class RowFetch {
 public:
  void clear() { n_ = cur_ = 0; }
  // rows [0, rows) of p, `stride` elements apart, their first n elements
  template <class E>
  void add(const E* p, int64_t stride, int64_t rows, int64_t n) {
    n_ += run_lines(lines_ + n_, int(kCap - n_), reinterpret_cast<const char*>(p), rows,
                    stride * int64_t(sizeof(E)), n * int64_t(sizeof(E)));
  }
  // spread what is queued over `calls` calls of step()
  void pace(int64_t calls) { per_ = (n_ - cur_ + calls - 1) / (calls > 0 ? calls : 1); }
  void step() { issue(per_); }
  void finish() { issue(n_); }

 private:
  // A list, walked by a plain loop: issued by a per-line walk of rows and lines instead, the
  // fetches cost about what they saved (~7 % of a W2 fp32 backward's samples).
  static constexpr int64_t kCap = 4096;  // a W2 backward block queues ~3,000 lines
  void issue(int64_t n) {
    for (const int64_t e = lo(n_, cur_ + n); cur_ < e; ++cur_)
      __builtin_prefetch(lines_[cur_], 0, 3);
  }
  const char* lines_[kCap];
  int64_t n_ = 0, cur_ = 0, per_ = 0;
};

// The first key of the block's queries: ds[c] is the first key query q0 + c sees (block-causal,
// from doc), never decreasing in c; null: 0 (causal). The rows of Sᵀ the block reads start at
// its first query's, rounded down to a key panel (an even key: a bf16 pair's first).
inline int64_t first_key(const int32_t* ds, int64_t c) {
  return ds ? ds[c] : 0;
}
template <class Kern>
int64_t first_row(const int32_t* ds) {
  static_assert(Kern::MR % 2 == 0);
  return first_key(ds, 0) / Kern::MR * Kern::MR;
}
// The queries c of a block of nq at q0 that see key j are [first(j), end(j)): from j on, and
// (block-causal, ds as above) before the first whose document starts after j. end() is asked
// for keys in increasing order.
class Seen {
 public:
  Seen(const int32_t* ds, int64_t q0, int64_t nq) : ds_(ds), q0_(q0), nq_(nq), end_(ds ? 0 : nq) {}
  int64_t first(int64_t j) const { return j > q0_ ? j - q0_ : 0; }
  int64_t end(int64_t j) {
    if (ds_)
      while (end_ < nq_ && ds_[end_] <= j) ++end_;
    return end_;
  }

 private:
  const int32_t* ds_;
  int64_t q0_, nq_, end_;
};

// St[j][c] (row stride kAttnQB) = alpha sum_d X(j, d) Y(y0 + c, d) for the nq queries of a
// block and the keys j each NR panel of them can see (j <= its last query; block-causal from
// the key panel of the first key its first query sees, ds as in first_key); other entries
// are left as they were. X: packed A panels of MR keys over SD slots; Y: the queries (or
// their output gradients) of Yrows rows, query q0 at row y0 (q0 token-major, 0 in a block's
// buffer), packed here into Yp.
template <class Kern, Slot SL>
void score_tiles(float* St, const uint32_t* X, uint32_t* Yp, const View& Y, int64_t Yrows,
                 int64_t y0, int64_t T, int64_t D, int64_t SD, int64_t q0, int64_t nq, float alpha,
                 const int32_t* ds, RowFetch& pf) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  for (int64_t c = 0; c < nq; c += NR) {
    uint32_t* yp = Yp + c * SD;
    Kern::template pack<SL>(yp, Y, Yrows, D, y0 + c, NR, 0, SD);
    const int nr = int(lo(NR, nq - c));
    for (int64_t j = first_key(ds, c) / MR * MR; j < lo(T, q0 + c + nr); j += MR) {
      Kern::template micro<SL, false>(SD, X + j * SD, yp, St + j * kAttnQB + c, kAttnQB,
                                      int(lo(MR, T - j)), nr, false, alpha, nullptr, 0, nullptr, 0);
      pf.step();
    }
  }
}

// Packs all rows of a kv head, over its T keys and D dims: as A panels of MR keys over d
// (dst [T/MR][SD][MR]), or as B panels of NR dims over keys (dst [D/NR][ST][NR]).
template <class Kern, Slot SL>
void pack_keys_a(uint32_t* dst, const View& X, int64_t T, int64_t D, int64_t SD) {
  for (int64_t j = 0; j < T; j += Kern::MR)
    Kern::template pack<SL>(dst + j * SD, X, T, D, j, Kern::MR, 0, SD);
}
// (By 8 slots for all panels: X's rows lie a page or more apart, and a whole panel at a time
// would fetch each of their lines once per panel.) SK is the panel stride; only the slots of
// the K keys are packed, which is all the products read (a short last block: W1's 32 queries
// of a 96-slot block packed 3 times over, backward -7 % at T = 32).
template <class Kern, Slot SL>
void pack_dims_b(uint32_t* dst, const View& Xt, int64_t D, int64_t K, int64_t SK) {
  const int64_t S = lo(SK, (K + per_slot(SL) - 1) / per_slot(SL));
  for (int64_t s = 0; s < S; s += 8)
    for (int64_t d = 0; d < D; d += Kern::NR)
      Kern::template pack<SL>(dst + d * SK + s * Kern::NR, Xt, D, K, d, Kern::NR, s, lo(8, S - s));
}

// C[nq, D] (row stride ldc) = M[q][j] Y[j][d], M the block's probabilities or score
// gradients held transposed in St: each A panel of MR queries sums the keys they see (from the
// first key its first query sees, ds as in first_key).
// Yb: Y as B panels of NR dims over keys (pack_dims_b, ST slots each); Ap: one panel.
// C (E: float, or uint16_t for bf16 storage) stored as st says.
template <class Kern, Slot SL, class E>
void query_rows(E* C, int64_t ldc, const float* St, const uint32_t* Yb, uint32_t* Ap, int64_t D,
                int64_t ST, int64_t q0, int64_t nq, const int32_t* ds, Store st, RowFetch& pf) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  constexpr int64_t per = per_slot(SL);
  for (int64_t a = 0; a < nq; a += MR) {
    const int mr = int(lo(MR, nq - a));
    // keys s0 * per..e-1
    const int64_t e = q0 + a + mr, S = (e + per - 1) / per, s0 = first_key(ds, a) / per;
    pf.step();
    if constexpr (Kern::kInPlaceA && per == 1) {  // St's rows are the A slots
      for (int64_t d = 0; d < D; d += NR)
        Kern::micro_cols(S - s0, St + s0 * kAttnQB + a, kAttnQB, Yb + d * ST + s0 * NR,
                         reinterpret_cast<float*>(C + a * ldc + d), ldc, mr, int(lo(NR, D - d)),
                         false, st);
      continue;
    }
    Kern::template pack<SL>(Ap, View{St + a, false, 1, kAttnQB}, nq - a, e, 0, MR, s0, S - s0);
    for (int64_t d = 0; d < D; d += NR)
      Kern::template micro<SL, false>(S - s0, Ap, Yb + d * ST + s0 * NR,
                                      reinterpret_cast<float*>(C + a * ldc + d), ldc, mr,
                                      int(lo(NR, D - d)), false, 1.0f, nullptr, 0, nullptr, 0, st);
  }
}

// C[j][d] (row stride ldc) += sum_q St[j][q] Y[q][d] for the keys 0..q0+nq-1 of a block
// (block-causal: from first_row(ds), ds as in first_key): each A panel of MR keys sums the
// queries that see them; rows from key `fresh` on (a multiple of MR) are stored, not added to
// (their first sum). Yb: Y as B panels of NR dims over the block's queries (SQ slots each); Ap:
// one panel.
template <class Kern, Slot SL>
void key_rows(float* C, int64_t ldc, const float* St, const uint32_t* Yb, uint32_t* Ap, int64_t D,
              int64_t SQ, int64_t q0, int64_t nq, int64_t fresh, const int32_t* ds, RowFetch& pf) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  constexpr int64_t per = per_slot(SL);
  const int64_t e = q0 + nq;
  Seen seen(ds, q0, nq);
  for (int64_t j = first_row<Kern>(ds); j < e; j += MR) {
    const int mr = int(lo(MR, e - j));
    // queries before j do not see it, nor (block-causal) those of later documents
    const int64_t s0 = seen.first(j) / per, s1 = (seen.end(j + mr - 1) + per - 1) / per;
    pf.step();
    if (s1 <= s0) continue;  // (a key before this block's own: added to, so nothing to add)
    if constexpr (Kern::kInPlaceA && per == 1) {  // St's rows are the A rows
      for (int64_t d = 0; d < D; d += NR)
        Kern::micro_inplace(s1 - s0, St + j * kAttnQB + s0, false, kAttnQB, Yb + d * SQ + s0 * NR,
                            C + j * ldc + d, ldc, mr, int(lo(NR, D - d)), j < fresh, nullptr, 0);
      continue;
    }
    Kern::template pack<SL>(Ap, View{St + j * kAttnQB, false, kAttnQB, 1}, e - j, nq, 0, MR, s0,
                            s1 - s0);
    for (int64_t d = 0; d < D; d += NR)
      Kern::template micro<SL, false>(s1 - s0, Ap, Yb + d * SQ + s0 * NR, C + j * ldc + d, ldc, mr,
                                      int(lo(NR, D - d)), j < fresh, 1.0f, nullptr, 0, nullptr, 0);
  }
}

// Views of one sequence b: keys/values of kv head g, queries (and their gradients) of head h
// (E: fp32 or bf16 storage). qn: where QK-norm and RoPE are taken in, the fused projection
// (QkNorm::at says where a head's rows lie).
struct AttnShape {
  int64_t B, T, H, KVH, D;
  const QkNorm* qn = nullptr;
  template <class E>
  const E* proj(int64_t b, int64_t h, int64_t t) const {
    return static_cast<const E*>(qn->qkv) + qn->at(b, h, t);
  }
  template <class E>
  View kv(const E* x, int64_t b, int64_t g) const {  // (key j, dim d)
    return {x + (b * T * KVH + g) * D, sizeof(E) == 2, KVH * D, 1};
  }
  template <class E>
  View kv_t(const E* x, int64_t b, int64_t g) const {  // (dim d, key j)
    return {x + (b * T * KVH + g) * D, sizeof(E) == 2, 1, KVH * D};
  }
  template <class F>
  F* row(F* x, int64_t b, int64_t h, int64_t i) const {  // query i of head h
    return x + ((b * T + i) * H + h) * D;
  }
  // Queues what the block after (h, q0) of task t = b * KVH + g reads: the rows of its
  // queries in each of qs (up to 3 tensors), then slice `blk` of `nblk` of the keys and
  // values of task `next` (claimed, or >= B * KVH for none). After the task's last block the
  // next block is `next`'s first.
  // With qn, qs are the token-major inputs besides q, and the next block's query rows and
  // the next task's keys and values are fetched from qn's projection.
  template <class E>
  void plan(RowFetch& pf, const E* const* qs, int nqs, int64_t b, int64_t g, int64_t h, int64_t q0,
            int64_t QB, const E* k, const E* v, int64_t next, int64_t blk, int64_t nblk) const {
    const int64_t G = H / KVH;
    pf.clear();
    if (q0 + QB < T || h + 1 < (g + 1) * G) {
      const int64_t hn = q0 + QB < T ? h : h + 1, q1 = q0 + QB < T ? q0 + QB : 0;
      for (int i = 0; i < nqs; ++i) pf.add(row(qs[i], b, hn, q1), H * D, lo(QB, T - q1), D);
      if (qn) pf.add(proj<E>(b, hn, q1), qn->R(), lo(QB, T - q1), D);
    } else if (next < B * KVH) {
      const int64_t bn = next / KVH, gn = next % KVH;
      for (int i = 0; i < nqs; ++i) pf.add(row(qs[i], bn, gn * G, 0), H * D, lo(QB, T), D);
      if (qn) pf.add(proj<E>(bn, gn * G, 0), qn->R(), lo(QB, T), D);
    }
    if (next < B * KVH) {
      const int64_t bn = next / KVH, gn = next % KVH, j0 = blk * T / nblk,
                    j1 = (blk + 1) * T / nblk;
      if (qn) {
        pf.add(proj<E>(bn, H + gn, j0), qn->R(), j1 - j0, D);
        pf.add(proj<E>(bn, H + KVH + gn, j0), qn->R(), j1 - j0, D);
      } else {
        pf.add(k + ((bn * T + j0) * KVH + gn) * D, KVH * D, j1 - j0, D);
        pf.add(v + ((bn * T + j0) * KVH + gn) * D, KVH * D, j1 - j0, D);
      }
    }
  }
};

// An activation as fp32 (from bf16 storage: the high half)
inline float f32_of(float x) {
  return x;
}
inline float f32_of(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// sum a[i] b[i] by lanes, in either storage (widened term by term: no row copies)
template <class E>
inline float row_dot(const E* a, const E* b, int64_t n) {
  return lane_sum(n, [=](int64_t i) { return f32_of(a[i]) * f32_of(b[i]); });
}

// H16: q, k, v, out in bf16 storage (bf16 kind only; the pointers hold uint16_t)
// doc: null (causal), or block-causal [B*T] (model/ops.h)
// qn: q, k, v are null, and the rows come from qn's projection (QkNorm in cpu/gemm.h)
template <class Kern, bool BF, bool H16 = false>
void attn_forward(float* out_, float* lse, const float* q_, const float* k_, const float* v_,
                  int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, const int32_t* doc,
                  const QkNorm* qn) {
  static_assert(BF || !H16);
  using E = std::conditional_t<H16, uint16_t, float>;
  E* out = reinterpret_cast<E*>(out_);
  const E *q = reinterpret_cast<const E*>(q_), *k = reinterpret_cast<const E*>(k_),
          *v = reinterpret_cast<const E*>(v_);
  using PE = std::conditional_t<BF, uint16_t, float>;  // P as saved
  constexpr Store st = H16 ? Store::bf16 : BF ? Store::round : Store::f32;
  constexpr Slot SL = BF ? Kern::kBf16Slot : Slot::f32;
  constexpr int64_t QB = kAttnQB, per = per_slot(SL);
  static_assert(QB % Kern::MR == 0 && QB % Kern::NR == 0);
  const AttnProbs pr(T);
  const bool save = pr.saves(H, KVH, D);
  PE* const P = static_cast<PE*>(AttnProbs::probs(lse, B, T, H));
  const AttnShape sh{B, T, H, KVH, D, qn};
  const int64_t G = H / KVH, ldq = H * D, SD = (D + per - 1) / per, ST = (T + per - 1) / per;
  const float scale = 1.0f / std::sqrt(float(D));
  // per thread, in words: K as A panels, V as B panels, a query block as B panels, Sᵀ of
  // the block, one A panel of P; with qn the task's keys [T][D] and a block's queries [QB][D]
  // as normalized and rotated
  const int64_t ntask = B * KVH, nblk = G * ((T + QB - 1) / QB);
  std::atomic<int64_t> claim{0};
  const int64_t wK = round_up(round_up(T, Kern::MR) * SD, 16),
                wV = round_up(round_up(D, Kern::NR) * ST, 16), wQ = round_up(QB * SD, 16),
                wS = round_up(T * QB, 16), wP = round_up(Kern::MR * ST, 16),
                wN = qn ? round_up(T * D * int64_t(sizeof(E)) / 4, 16) : 0,
                wM = qn ? round_up(QB * D * int64_t(sizeof(E)) / 4, 16) : 0;
#pragma omp parallel
  {
    uint32_t* KA = workspace(wK + wV + wQ + wS + wP + wN + wM);
    uint32_t *VB = KA + wK, *QP = VB + wV;
    float* St = reinterpret_cast<float*>(QP + wQ);
    uint32_t* PA = reinterpret_cast<uint32_t*>(St + wS);
    E* const Kn = reinterpret_cast<E*>(PA + wP);
    E* const Qn = reinterpret_cast<E*>(PA + wP + wN);
    alignas(64) float mx[QB], sum[QB];
    RowFetch pf;
    // tasks claimed one ahead, so that each can fetch the next one's rows
    for (int64_t t = claim.fetch_add(1), next; t < ntask; t = next) {
      next = claim.fetch_add(1);
      const int64_t b = t / KVH, g = t % KVH;
      int64_t blk = 0;
      if (qn) {
        qn->rows(*qn, Kn, b, H + g, 0, T, true);
        pack_keys_a<Kern, SL>(KA, View{Kn, H16, D, 1}, T, D, SD);
        pack_dims_b<Kern, SL>(VB, View{sh.proj<E>(b, H + KVH + g, 0), H16, 1, qn->R()}, D, T, ST);
      } else {
        pack_keys_a<Kern, SL>(KA, sh.kv(k, b, g), T, D, SD);
        pack_dims_b<Kern, SL>(VB, sh.kv_t(v, b, g), D, T, ST);
      }
      for (int64_t h = g * G; h < (g + 1) * G; ++h)
        for (int64_t q0 = 0; q0 < T; q0 += QB, ++blk) {
          const int64_t nq = lo(QB, T - q0), e = q0 + nq;
          const int32_t* const ds = doc ? doc + b * T + q0 : nullptr;  // (first_key)
          const int64_t j0 = first_row<Kern>(ds);  // the block's first row of Sᵀ
          sh.plan(pf, &q, qn ? 0 : 1, b, g, h, q0, QB, k, v, next, blk, nblk);
          pf.pace((nq + Kern::NR - 1) / Kern::NR * ((e - j0 + Kern::MR - 1) / Kern::MR) +
                  (nq + Kern::MR - 1) / Kern::MR);
          if (qn) {
            qn->rows(*qn, Qn, b, h, q0, nq, true);
            score_tiles<Kern, SL>(St, KA, QP, View{Qn, H16, D, 1}, nq, 0, T, D, SD, q0, nq, scale,
                                  ds, pf);
          } else {
            score_tiles<Kern, SL>(St, KA, QP, View{sh.row(q, b, h, 0), H16, ldq, 1}, T, q0, T, D,
                                  SD, q0, nq, scale, ds, pf);
          }
          // softmax down each column c (query q0 + c sees keys j <= q0 + c, block-causal from
          // its document's first); P = 0 where masked, over all keys j0..e-1 the block's panels
          // read
          for (int64_t c = 0; c < nq; ++c) mx[c] = -INFINITY, sum[c] = 0.0f;
          Seen seen(ds, q0, nq);
          for (int64_t j = j0; j < e; ++j) {
            const float* s = St + j * QB;
            const int64_t c1 = seen.end(j);
#pragma omp simd
            for (int64_t c = seen.first(j); c < c1; ++c) mx[c] = s[c] > mx[c] ? s[c] : mx[c];
          }
          seen = Seen(ds, q0, nq);
          for (int64_t j = j0; j < e; ++j) {
            float* s = St + j * QB;
            const int64_t c0 = seen.first(j), c1 = seen.end(j);
            for (int64_t c = 0; c < c0; ++c) s[c] = 0.0f;
            for (int64_t c = c1; c < nq; ++c) s[c] = 0.0f;
#pragma omp simd
            for (int64_t c = c0; c < c1; ++c) sum[c] += (s[c] = vexp(s[c] - mx[c]));
          }
          for (int64_t c = 0; c < nq; ++c) {
            lse[(b * H + h) * T + q0 + c] = mx[c] + std::log(sum[c]);
            sum[c] = 1.0f / sum[c];
          }
          seen = Seen(ds, q0, nq);
          for (int64_t j = j0; j < e; ++j) {
            float* s = St + j * QB;
            const int64_t c1 = seen.end(j);
#pragma omp simd
            for (int64_t c = seen.first(j); c < c1; ++c)
              s[c] = BF ? round_to_bf16(s[c] * sum[c]) : s[c] * sum[c];
          }
          if (save) {  // for the backward, past the caches (read only then)
            PE* const Ph = P + (b * H + h) * pr.per_head();
            for (int64_t j = j0; j < e; ++j) {
              const int64_t c0 = AttnProbs::first(j, q0);
              if constexpr (BF)
                Kern::store_nt_bf16(Ph + pr.row(q0, j), St + j * QB + c0, nq - c0);
              else
                Kern::store_nt(Ph + pr.row(q0, j), St + j * QB + c0, nq - c0, false);
            }
          }
          query_rows<Kern, SL>(sh.row(out, b, h, q0), ldq, St, VB, PA, D, ST, q0, nq, ds, st, pf);
          pf.finish();
        }
    }
    _mm_sfence();
  }
}

// H16: dq, dk, dv, dout, out, q, k, v in bf16 storage
// doc: null (causal), or block-causal [B*T] (model/ops.h), as the forward had it
// qn: q, k, v, dq, dk, dv are null; the rows come from qn's projection and their gradients go
// to its gradient (QkNorm in cpu/gemm.h)
template <class Kern, bool BF, bool H16 = false>
void attn_backward(float* dq_, float* dk_, float* dv_, const float* dout_, const float* out_,
                   const float* lse, const float* q_, const float* k_, const float* v_, int64_t B,
                   int64_t T, int64_t H, int64_t KVH, int64_t D, const int32_t* doc,
                   const QkNorm* qn) {
  static_assert(BF || !H16);
  using E = std::conditional_t<H16, uint16_t, float>;
  E *dq = reinterpret_cast<E*>(dq_), *dk = reinterpret_cast<E*>(dk_),
    *dv = reinterpret_cast<E*>(dv_);
  const E *dout = reinterpret_cast<const E*>(dout_), *out = reinterpret_cast<const E*>(out_),
          *q = reinterpret_cast<const E*>(q_), *k = reinterpret_cast<const E*>(k_),
          *v = reinterpret_cast<const E*>(v_);
  using PE = std::conditional_t<BF, uint16_t, float>;  // P as the forward saved it
  constexpr Store st = H16 ? Store::bf16 : BF ? Store::round : Store::f32;
  constexpr Slot SL = BF ? Kern::kBf16Slot : Slot::f32;
  constexpr int64_t QB = kAttnQB, per = per_slot(SL);
  const AttnShape sh{B, T, H, KVH, D, qn};
  const AttnProbs pr(T);
  const bool saved = pr.saves(H, KVH, D);
  const PE* const P = static_cast<const PE*>(AttnProbs::probs(lse, B, T, H));
  const int64_t G = H / KVH, ldq = H * D, ldk = KVH * D, SD = (D + per - 1) / per,
                ST = (T + per - 1) / per, SQ = QB / per;
  const float scale = 1.0f / std::sqrt(float(D));
  // per thread, in words: K (where P is not saved) and V as A panels, K as B panels over
  // keys, a block of queries (likewise) and one of output gradients as B panels over dims and
  // over queries, Sᵀ (then P) and dPᵀ (then dS) of the block, one A panel, and the task's dK,
  // dV sums [T][D]: summed there, not in dk, dv, whose rows lie KVH*D apart (a multiple of 4
  // KiB, so a tile's rows share L1 sets: their loads and stores measured half of key_rows'
  // time; -9 % backward)
  const int64_t wA = round_up(round_up(T, Kern::MR) * SD, 16),
                wB = round_up(round_up(D, Kern::NR) * ST, 16), wQ = round_up(QB * SD, 16),
                wQt = round_up(round_up(D, Kern::NR) * SQ, 16), wS = round_up(T * QB, 16),
                wX = round_up(Kern::MR * (ST > SQ ? ST : SQ), 16), wG = round_up(T * D, 16),
                wN = qn ? round_up(T * D * int64_t(sizeof(E)) / 4, 16) : 0,
                wM = qn ? round_up(QB * D * int64_t(sizeof(E)) / 4, 16) : 0,
                wdQ = qn ? round_up(QB * D, 16) : 0;
  const int64_t ntask = B * KVH, nblk = G * ((T + QB - 1) / QB);
  std::atomic<int64_t> claim{0};
#pragma omp parallel
  {
    // (with qn also the task's keys and a block's queries normalized and rotated, and the
    // block's dQ before they are turned back)
    uint32_t* KA = workspace(2 * wA + wB + 2 * wQ + 2 * wQt + 2 * wS + wX + 2 * wG + wN + wM + wdQ);
    uint32_t *VA = KA + wA, *KB = VA + wA, *QP = KB + wB, *OP = QP + wQ, *QT = OP + wQ,
             *OT = QT + wQt;
    float* St = reinterpret_cast<float*>(OT + wQt);
    float* dSt = St + wS;
    uint32_t* XA = reinterpret_cast<uint32_t*>(dSt + wS);
    float* dKs = reinterpret_cast<float*>(XA + wX);
    float* dVs = dKs + wG;
    E* const Kn = reinterpret_cast<E*>(dVs + wG);
    E* const Qn = reinterpret_cast<E*>(dVs + wG + wN);
    float* const dQn = dVs + wG + wN + wM;
    alignas(64) float rowdot[QB];
    RowFetch pf;
    const E* const reads[3] = {q, dout, out};
    for (int64_t t = claim.fetch_add(1), next; t < ntask; t = next) {
      next = claim.fetch_add(1);
      const int64_t b = t / KVH, g = t % KVH;
      int64_t blk = 0;
      View kv, kt, vv;  // K by keys and by dims, V by keys
      if (qn) {
        qn->rows(*qn, Kn, b, H + g, 0, T, false);
        kv = View{Kn, H16, D, 1}, kt = View{Kn, H16, 1, D};
        vv = View{sh.proj<E>(b, H + KVH + g, 0), H16, qn->R(), 1};
      } else {
        kv = sh.kv(k, b, g), kt = sh.kv_t(k, b, g), vv = sh.kv(v, b, g);
      }
      if (!saved) pack_keys_a<Kern, SL>(KA, kv, T, D, SD);
      pack_keys_a<Kern, SL>(VA, vv, T, D, SD);
      pack_dims_b<Kern, SL>(KB, kt, D, T, ST);
      float* const dw = qn ? qn->dw + t * 2 * D : nullptr;  // q_norm's, then k_norm's
      for (int64_t h = g * G; h < (g + 1) * G; ++h)
        for (int64_t q0 = 0; q0 < T; q0 += QB, ++blk) {
          const int64_t nq = lo(QB, T - q0), e = q0 + nq;
          const int32_t* const ds = doc ? doc + b * T + q0 : nullptr;  // (first_key)
          const int64_t j0 = first_row<Kern>(ds);  // the block's first row of Sᵀ
          const E *oh = sh.row(out, b, h, q0), *gh = sh.row(dout, b, h, q0);
          const E* qh = qn ? Qn : sh.row(q, b, h, q0);
          const int64_t ldqh = qn ? D : ldq;
          if (qn) qn->rows(*qn, Qn, b, h, q0, nq, false);
          sh.plan(pf, qn ? reads + 1 : reads, qn ? 2 : 3, b, g, h, q0, QB, k, v, next, blk, nblk);
          const int64_t kp = (e - j0 + Kern::MR - 1) / Kern::MR,
                        sp = (nq + Kern::NR - 1) / Kern::NR * kp;
          pf.pace((saved ? 1 : 2) * sp + 2 * kp + (nq + Kern::MR - 1) / Kern::MR);
          if (!saved)
            score_tiles<Kern, SL>(St, KA, QP, View{qh, H16, ldqh, 1}, nq, 0, T, D, SD, q0, nq,
                                  scale, ds, pf);
          score_tiles<Kern, SL>(dSt, VA, OP, View{gh, H16, ldq, 1}, nq, 0, T, D, SD, q0, nq, 1.0f,
                                ds, pf);
          for (int64_t c = 0; c < nq; ++c)  // rowsum(dO O)
            rowdot[c] = row_dot(gh + c * ldq, oh + c * ldq, D);
          // P as saved, or exp(S - lse); dS = P (dP - rowsum(dO O)) scale; 0 where masked.
          // The bf16 kind rounds both (the saved P is), so its products may read them in place
          // (packing would round them again, to the same values).
          Seen seen(ds, q0, nq);
          if (saved) {
            const PE* const Ph = P + (b * H + h) * pr.per_head();
            for (int64_t j = j0; j < e; ++j) {
              float *s = St + j * QB, *dsj = dSt + j * QB;
              const int64_t c0 = seen.first(j), c1 = seen.end(j);
              const PE* const pj = Ph + pr.row(q0, j) - AttnProbs::first(j, q0);
              for (int64_t c = 0; c < c0; ++c) s[c] = dsj[c] = 0.0f;
              for (int64_t c = c1; c < nq; ++c) s[c] = dsj[c] = 0.0f;
#pragma omp simd
              for (int64_t c = c0; c < c1; ++c) {
                const float p = f32_of(pj[c]), g = p * (dsj[c] - rowdot[c]) * scale;
                s[c] = p;
                dsj[c] = BF ? round_to_bf16(g) : g;
              }
            }
          } else {
            const float* l = lse + (b * H + h) * T + q0;
            for (int64_t j = j0; j < e; ++j) {
              float *s = St + j * QB, *dsj = dSt + j * QB;
              const int64_t c0 = seen.first(j), c1 = seen.end(j);
              for (int64_t c = 0; c < c0; ++c) s[c] = dsj[c] = 0.0f;
              for (int64_t c = c1; c < nq; ++c) s[c] = dsj[c] = 0.0f;
#pragma omp simd
              for (int64_t c = c0; c < c1; ++c) {
                const float p = vexp(s[c] - l[c]), g = p * (dsj[c] - rowdot[c]) * scale;
                s[c] = BF ? round_to_bf16(p) : p;
                dsj[c] = BF ? round_to_bf16(g) : g;
              }
            }
          }
          // dV += Pᵀ dO, dK += dSᵀ Q, dQ = dS K
          pack_dims_b<Kern, SL>(OT, View{gh, H16, 1, ldq}, D, nq, SQ);
          pack_dims_b<Kern, SL>(QT, View{qh, H16, 1, ldqh}, D, nq, SQ);
          // (the group's first head sums each key first in the block of its own query: stored
          // there, so that dK and dV need no zeroing)
          const int64_t fresh = h == g * G ? q0 : T;
          key_rows<Kern, SL>(dVs, D, St, OT, XA, D, SQ, q0, nq, fresh, ds, pf);
          key_rows<Kern, SL>(dKs, D, dSt, QT, XA, D, SQ, q0, nq, fresh, ds, pf);
          if (qn) {  // dQ as the values dq would hold, turned back into dqkv's rows
            query_rows<Kern, SL>(dQn, D, dSt, KB, XA, D, ST, q0, nq, ds,
                                 BF ? Store::round : Store::f32, pf);
            qn->grads(*qn, dQn, b, h, q0, nq, dw);
          } else {
            query_rows<Kern, SL>(sh.row(dq, b, h, q0), ldq, dSt, KB, XA, D, ST, q0, nq, ds, st, pf);
          }
          pf.finish();
        }
      // dK and dV are whole: stored (the bf16 kind rounded) past the caches, being read only
      // after the whole backward (layer backward -1.4 % at W2 fp32, layers alternating); in
      // bf16 storage as they are
      const auto store_rows = [&](E* dst, int64_t ld, const float* src) {  // [T][D] into dst
        if constexpr (H16) {
          store_rounded(dst, ld, src, D, int(T), int(D));
        } else {
          for (int64_t j = 0; j < T; ++j) Kern::store_nt(dst + j * ld, src + j * D, D, BF);
          _mm_sfence();
        }
      };
      if (qn) {  // dK as dk would hold it, turned back; dV into dqkv's value rows
        if constexpr (BF)
          for (int64_t i = 0; i < T * D; ++i) dKs[i] = round_to_bf16(dKs[i]);
        qn->grads(*qn, dKs, b, H + g, 0, T, dw + D);
        store_rows(static_cast<E*>(qn->dqkv) + qn->at(b, H + KVH + g, 0), qn->R(), dVs);
      } else {
        store_rows(dk + (b * T * KVH + g) * D, ldk, dKs);
        store_rows(dv + (b * T * KVH + g) * D, ldk, dVs);
      }
    }
  }
}

}  // namespace
}  // namespace tq::cpu
