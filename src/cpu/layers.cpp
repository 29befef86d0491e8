#include "cpu/layers.h"

// (first: it includes <immintrin.h> under GCC 12's warning pragmas)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "cpu/bf16_avx512.h"
#endif

#include <cblas.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/common.h"
#include "cpu/gemm.h"
#include "cpu/vmath.h"

namespace tq::cpu {

float exp_for_tests(float x) {
  return vexp(x);
}
float lane_sum_for_tests(const float* x, int64_t n) {
  return lane_sum(n, [x](int64_t i) { return x[i]; });
}
float lane_max_for_tests(const float* x, int64_t n) {
  return lane_max(x, n);
}

static int g_threads = 1;

void set_threads(int n) {
  g_threads = std::max(1, n);
  omp_set_num_threads(g_threads);
  openblas_set_num_threads(g_threads);
}
int threads() {
  return g_threads;
}

int cpus_in_quota(const char* cpu_max, int n) {
  long long quota = 0, period = 0;
  if (std::sscanf(cpu_max, "%lld %lld", &quota, &period) == 2 && quota > 0 && period > 0)
    n = int(std::min<long long>(n, std::max<long long>(1, (quota + period - 1) / period)));
  return n;
}
int available_cpus() {
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (n <= 0) n = int(std::thread::hardware_concurrency());  // (over 1024 CPUs, say)
  if (n <= 0) n = 1;
  // The quotas of the process's cgroup v2 ("0::/path" in /proc/self/cgroup; "/" inside a
  // container) and of every cgroup above it: each limits it.
  std::string path;
  if (std::ifstream in("/proc/self/cgroup"); in)
    for (std::string line; std::getline(in, line);)
      if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path == "/") path.clear();
  for (;;) {
    if (std::ifstream in("/sys/fs/cgroup" + path + "/cpu.max"); in) {
      std::string line;
      std::getline(in, line);
      n = cpus_in_quota(line.c_str(), n);
    }
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos || path.empty()) break;
    path.resize(slash);
  }
  return n;
}

void embedding_forward(float* out, const int32_t* tokens, const float* E, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * C, E + tokens[n] * C, C * sizeof(float));
}
void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* E, int64_t N,
                            int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const uint16_t* row = E + tokens[n] * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = bf16_to_f32(row[c]);
  }
}
void embedding_backward(float* dE, const float* dout, const int32_t* tokens, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {  // serial: tokens may repeat
    float* row = dE + tokens[n] * C;
    const float* g = dout + n * C;
    for (int64_t c = 0; c < C; ++c) row[c] += g[c];
  }
}
void embedding_backward_bf16(uint16_t* dE, const float* dout, const int32_t* tokens, int64_t N,
                             int64_t C) {
  // the positions of each token, in order: groups of equal tokens, each summed by one thread
  std::vector<int64_t> at(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) at[size_t(n)] = n;
  std::stable_sort(at.begin(), at.end(),
                   [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  std::vector<int64_t> first;  // where each group starts in `at`, then N
  for (int64_t i = 0; i < N; ++i)
    if (i == 0 || tokens[at[size_t(i)]] != tokens[at[size_t(i - 1)]]) first.push_back(i);
  first.push_back(N);
  const int64_t groups = int64_t(first.size()) - 1;
#pragma omp parallel if (N * C > 65536)
  {
    std::vector<float> sum(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t u = 0; u < groups; ++u) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t i = first[size_t(u)]; i < first[size_t(u + 1)]; ++i) {
        const float* g = dout + at[size_t(i)] * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) sum[size_t(c)] += g[c];
      }
      uint16_t* row = dE + tokens[at[size_t(first[size_t(u)])]] * C;
      for (int64_t c = 0; c < C; ++c) row[c] = f32_to_bf16(bf16_to_f32(row[c]) + sum[size_t(c)]);
    }
  }
}

// An activation as fp32 (from bf16 storage: widened), and stored back (bf16 storage:
// rounded to nearest even; fp32 storage: rounded to a bf16 value where rnd).
static inline float load(float x) {
  return x;
}
static inline float load(uint16_t h) {
  return bf16_to_f32(h);
}
template <class E>
static inline E store_as(float x, bool rnd) {
  if constexpr (sizeof(E) == 2) return f32_to_bf16(x);
  return rnd ? round_bf16(x) : x;
}
// One row of RMSNorm: o = x rstd w, rstd returned (rmsnorm_forward and the fused QK-norm).
// (In two parts, so that the fused QK-norm can start the sums of a group's rows together.)
// (x in either storage: the fused QK-norm reads bf16 rows in place.)
template <class X = float>
static inline float rms_rstd(const X* xr, int64_t C, double eps) {
  const float ss = lane_sum(C, [xr](int64_t c) { return load(xr[c]) * load(xr[c]); });
  return 1.0f / std::sqrt(ss / C + float(eps));
}
template <class X = float>
static inline void rms_apply(float* o, const X* xr, float r, const float* w, int64_t C) {
  for (int64_t c = 0; c < C; ++c) o[c] = load(xr[c]) * r * w[c];
}
static inline float rms_row(float* o, const float* xr, const float* w, int64_t C, double eps) {
  const float r = rms_rstd(xr, C, eps);
  rms_apply(o, xr, r, w, C);
  return r;
}
// Its backward: d overwritten (stored as store_as), dw (a thread's partial sums) added into;
// x and d in either storage (the fused QK-norm reads and writes bf16 rows in place).
template <class X = float, class O = float>
static inline void rms_row_backward(O* d, float* dw, const float* g, const X* xr, float r,
                                    const float* w, int64_t C, bool rnd = false) {
  const float dot = lane_sum(C, [=](int64_t c) { return g[c] * w[c] * load(xr[c]); }) * r;
  for (int64_t c = 0; c < C; ++c) dw[c] += g[c] * load(xr[c]) * r;
  for (int64_t c = 0; c < C; ++c)
    d[c] = store_as<O>(r * (g[c] * w[c] - load(xr[c]) * r * dot / C), rnd);
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     double eps) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) rstd[n] = rms_row(out + n * C, x + n * C, w, C, eps);
}

// A norm weight's gradient sums over every row. Its partial sums are taken per chunk of
// kNormRows consecutive rows, each in row order, and the chunks' sums are added in chunk order,
// so its bits depend on the rows alone, not on the thread count nor on which thread took which
// chunk (threads take chunks as they come: one the scheduler keeps waiting delays only its
// own). The QK-norm pass sums its q and k rows' chunks the same way, so that it and the model's
// composition of RMSNorms give the same bits.
constexpr int64_t kNormRows = 32;
static int64_t norm_chunks(int64_t rows) {
  return std::max<int64_t>(1, (rows + kNormRows - 1) / kNormRows);
}
// dw[c] += the chunks' partial sums part[k * per + c] in chunk order, columns split among the
// threads.
static void add_chunk_sums(float* dw, const float* part, int64_t nc, size_t per, int64_t C) {
#pragma omp parallel for schedule(static) if (nc * C > 65536)
  for (int64_t c0 = 0; c0 < C; c0 += 64)
    for (int64_t c = c0; c < std::min(C, c0 + 64); ++c) {
      float s = dw[c];
      for (int64_t k = 0; k < nc; ++k) s += part[size_t(k) * per + size_t(c)];
      dw[c] = s;
    }
}

// RMSNorm's backward over the rows: the input gradient into d, or with ADD added into it (each
// rounded to bf16 first where rnd, and the sum); dw's partial sums per chunk of rows, as
// above, a line apart from the next chunk's: a line two cores write in turn moves between them
// with every row (the fused pass below, W2's rows on two threads: 1.6x slower with them
// adjacent).
template <bool ADD>
static void rms_backward(float* d, float* dw, const float* dout, const float* x, const float* rstd,
                         const float* w, int64_t N, int64_t C, bool rnd) {
  const int64_t nc = norm_chunks(N);
  const size_t per = size_t((C + 15) / 16 * 16) + 16;
  std::vector<float> part(size_t(nc) * per, 0.0f);  // per chunk: dw's sums
#pragma omp parallel if (N * C > 16384)
  {
    std::vector<float> row(ADD ? size_t(C) : 0);  // the thread's input gradient of a row
#pragma omp for schedule(dynamic)
    for (int64_t k = 0; k < nc; ++k) {
      float* const mydw = part.data() + size_t(k) * per;
      for (int64_t n = k * kNormRows; n < std::min(N, (k + 1) * kNormRows); ++n) {
        float* const dr = d + n * C;
        rms_row_backward(ADD ? row.data() : dr, mydw, dout + n * C, x + n * C, rstd[n], w, C);
        if constexpr (ADD) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c)
            dr[c] = rnd ? round_bf16(dr[c] + round_bf16(row[c])) : dr[c] + row[c];
        }
      }
    }
  }
  add_chunk_sums(dw, part.data(), nc, per, C);
}
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* rstd,
                      const float* w, int64_t N, int64_t C) {
  rms_backward<false>(dx, dw, dout, x, rstd, w, N, C, false);
}

// Row-major C[M, N] = alpha op(A) op(B) + beta C (beta 0 or 1): the linear layers, and
// the portable attention's blocks from inside its parallel loops (our products then run on
// the calling thread). Our packed products (gemm.h) where the CPU has AVX2 or AVX-512,
// OpenBLAS elsewhere or when TQ_CPU=generic asks for the portable path.
static void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (own_kernels())
    return gemm_f32(M, N, K, {A, false, ta ? 1 : lda, ta ? lda : 1},
                    {B, false, tb ? ldb : 1, tb ? 1 : ldb}, C, ldc, beta != 0.0f, alpha);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// out[N, OC] = x[N, IC] W[OC, IC]^T;  dx[N, IC] = dout[N, OC] W;  dW[OC, IC] += dout^T x
void matmul_forward(float* out, const float* x, const float* W, int64_t N, int64_t IC, int64_t OC) {
  sgemm(false, true, N, OC, IC, 1.0f, x, IC, W, IC, 0.0f, out, OC);
}
void matmul_backward(float* dx, float* dW, const float* dout, const float* x, const float* W,
                     int64_t N, int64_t IC, int64_t OC) {
  sgemm(false, false, N, IC, OC, 1.0f, dout, OC, W, IC, 0.0f, dx, IC);
  sgemm(true, false, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f, dW, IC);
}
void matmul_backward_sgd(float* dx, float* W, const float* dout, const float* x, int64_t N,
                         int64_t IC, int64_t OC, float lr) {
  gemm_f32_dx_sgd(N, OC, IC, dout, x, W, dx, lr);
}
// A bf16 activation as a product operand (row stride rs, k stride ks), and how an output is stored
static View view(Act a, int64_t rs, int64_t ks) {
  return {a.p, a.bf16, rs, ks};
}
static Store store(Act a) {
  return a.bf16 ? Store::bf16 : Store::round;
}
void matmul_forward_bf16w(Act out, Act x, const uint16_t* W, int64_t N, int64_t IC, int64_t OC) {
  gemm_bf16(N, OC, IC, view(x, IC, 1), {W, true, IC, 1}, out.p, OC, false, 1.0f, store(out));
}
void matmul_backward_bf16w(Act dx, float* dW, Act dout, Act x, const uint16_t* W, int64_t N,
                           int64_t IC, int64_t OC) {
  gemm_bf16(N, IC, OC, view(dout, OC, 1), {W, true, 1, IC}, dx.p, IC, false, 1.0f, store(dx));
  gemm_bf16(OC, IC, N, view(dout, 1, OC), view(x, 1, IC), dW, IC, true);
}
void matmul_backward_bf16g(Act dx, uint16_t* dW, Act dout, Act x, const uint16_t* W, int64_t N,
                           int64_t IC, int64_t OC) {
  gemm_bf16(N, IC, OC, view(dout, OC, 1), {W, true, 1, IC}, dx.p, IC, false, 1.0f, store(dx));
  gemm_bf16(OC, IC, N, view(dout, 1, OC), view(x, 1, IC), dW, IC, false, 1.0f, Store::bf16);
}
void matmul_backward_sgd_bf16w(Act dx, uint16_t* W, Act dout, Act x, int64_t N, int64_t IC,
                               int64_t OC, float lr) {
  gemm_bf16_dx_sgd(N, OC, IC, view(dout, OC, 1), view(dout, 1, OC), view(x, 1, IC), W, dx.p,
                   store(dx), lr);
}

void qkv_split_forward(float* q, float* k, float* v, const float* qkv, int64_t N, int64_t H,
                       int64_t KVH, int64_t D) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
#pragma omp parallel for schedule(static) if (N * R > 65536)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < KVH; ++g) {
      const float* src = qkv + n * R + g * (G + 2) * D;
      std::memcpy(q + (n * H + g * G) * D, src, G * D * sizeof(float));
      std::memcpy(k + (n * KVH + g) * D, src + G * D, D * sizeof(float));
      std::memcpy(v + (n * KVH + g) * D, src + (G + 1) * D, D * sizeof(float));
    }
}
void qkv_split_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t N,
                        int64_t H, int64_t KVH, int64_t D) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
#pragma omp parallel for schedule(static) if (N * R > 65536)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < KVH; ++g) {
      float* dst = dqkv + n * R + g * (G + 2) * D;
      std::memcpy(dst, dq + (n * H + g * G) * D, G * D * sizeof(float));
      std::memcpy(dst + G * D, dk + (n * KVH + g) * D, D * sizeof(float));
      std::memcpy(dst + (G + 1) * D, dv + (n * KVH + g) * D, D * sizeof(float));
    }
}

// One head row rotated: sign = +1 forward, -1 its transpose (backward); the row read in
// either storage. (Rounded as it stored, in one loop, the fused forward's fp32 rows came out
// in other bits than rope_forward and a rounding pass: GCC contracted them otherwise.)
template <class E = float>
static inline void rope_row(float* o, const E* xi, const float* c, const float* s, int64_t D2,
                            float sign) {
  for (int64_t e = 0; e < D2; ++e) {
    const float x1 = load(xi[e]), x2 = load(xi[e + D2]), se = sign * s[e];
    o[e] = x1 * c[e] - x2 * se;
    o[e + D2] = x2 * c[e] + x1 * se;
  }
}
// The RoPE position of token n = b T + t: t, or with block-causal attention t - doc[n] (its
// place in its document; model/ops.h).
static inline int64_t rope_pos(const int32_t* doc, int64_t n, int64_t T) {
  return doc ? n % T - doc[n] : n % T;
}
static void rope_apply(float* out, const float* x, const float* cos, const float* sin, int64_t B,
                       int64_t T, int64_t NH, int64_t D, float sign, const int32_t* doc) {
  const int64_t D2 = D / 2;
#pragma omp parallel for collapse(2) schedule(static) if (B * T * NH * D > 65536)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t base = ((b * T + t) * NH + h) * D, p = rope_pos(doc, b * T + t, T);
        rope_row(out + base, x + base, cos + p * D2, sin + p * D2, D2, sign);
      }
}
void rope_forward(float* out, const float* x, const float* cos, const float* sin, int64_t B,
                  int64_t T, int64_t NH, int64_t D, const int32_t* doc) {
  rope_apply(out, x, cos, sin, B, T, NH, D, 1.0f, doc);
}
void rope_backward(float* dx, const float* dout, const float* cos, const float* sin, int64_t B,
                   int64_t T, int64_t NH, int64_t D, const int32_t* doc) {
  rope_apply(dx, dout, cos, sin, B, T, NH, D, -1.0f, doc);
}

constexpr int64_t kAhead = 256, kStep = 64;  // floats: fetch distance, and the run per fetch

static inline void round_row(float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

// Streaming passes fetch what they will read and write a little ahead, in software: on a Zen 5
// VM the hardware prefetchers left SwiGLU and QK-norm + RoPE at about half of DRAM speed
// (with this, two builds alternating in one process: SwiGLU forward -19 to -23 %, backward -8
// to -13 %; QK-norm + RoPE forward -8 to -30 %, backward -14 to -16 %). The output lines are
// fetched for writing: a store that misses waits on the line's read either way.
static inline void fetch(const float* p, int64_t n, bool write) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, write, 3);
}
static inline void fetch(const uint16_t* p, int64_t n, bool write) {
  for (int64_t i = 0; i < n; i += 32) __builtin_prefetch(p + i, write, 3);
}

// One head row of QK-norm + RoPE (the pass below, and attention_qkn_*): the projection's row
// `in` normalized by rstd r and rotated into oe (y, o: a row of scratch each).
template <class E, int DC>
static inline void qk_row(E* oe, const E* in, float r, const float* w, const float* c,
                          const float* s, int64_t Dr, bool rnd, float* y, float* o) {
  const int64_t D = DC ? DC : Dr, D2 = D / 2;
  rms_apply(y, in, r, w, D);
  if (rnd) round_row(y, D);
  if constexpr (std::is_same_v<E, float>) {  // rotated in place
    rope_row(oe, y, c, s, D2, 1.0f);
    if (rnd) round_row(oe, D);
  } else {  // rotated into o, rounded as stored
    rope_row(o, y, c, s, D2, 1.0f);
    for (int64_t e = 0; e < D; ++e) oe[e] = f32_to_bf16(o[e]);
  }
}
// Its backward: gi, the gradient of the rotated row (in either storage), into out; the norm
// weight's gradient added into dw. gr: a row of scratch.
template <class E, int DC, class GE>
static inline void qk_row_backward(E* out, float* dw, const GE* gi, const E* in, float r,
                                   const float* w, const float* c, const float* s, int64_t Dr,
                                   bool rnd, float* gr) {
  const int64_t D = DC ? DC : Dr, D2 = D / 2;
  rope_row(gr, gi, c, s, D2, -1.0f);
  if (rnd) round_row(gr, D);
  rms_row_backward(out, dw, gr, in, r, w, D, rnd);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// QK-norm + RoPE rows at D = 128 (every preset's head dimension) as attention_qkn_* asks for
// them, held in registers. qk_row and qk_row_backward take a row through scratch rows pass by
// pass, and one row at a time the chain of its sum of squares (or its backward's dot) did not
// overlap the next row's: their dependent work filled the scheduler. Here a batch's sums come
// first (rows, grads). The same operations in the same order (lane_sum's, the same FMAs): the
// same bits, which the tests check against the generic rows. W2 step, the two ways alternating
// by step in one process: bf16 -2.1 to -2.4 %, fp32 -0.4 to -1.7 % (docs/performance.md).
namespace qk512 {
using namespace bf16x16;  // round_bf16, load_bf16, store_bf16 (as the products use them)
// 16 activations as fp32, and stored back (as store_as: bf16 storage rounds, fp32 where rnd)
inline __m512 widen(const uint16_t* p) {
  return load_bf16(p, 0xffff);
}
inline __m512 widen(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void put(uint16_t* p, __m512 x, bool) {
  store_bf16(p, 0xffff, round_bf16(x));
}
inline void put(float* p, __m512 x, bool rnd) {
  _mm512_storeu_ps(p, rnd ? round_bf16(x) : x);
}
inline float hsum(__m512 acc) {  // lane_sum's adds across its 16 lanes
  return lanes8_sum(
      _mm256_add_ps(_mm512_castps512_ps256(acc),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
}
// rms_rstd of a row
template <class E>
inline float rstd(const E* in, double eps) {
  __m512 acc = _mm512_setzero_ps();
  for (int k = 0; k < 8; ++k) acc = _mm512_fmadd_ps(widen(in + 16 * k), widen(in + 16 * k), acc);
  return 1.0f / std::sqrt(hsum(acc) / 128.0f + float(eps));
}
// qk_row<E, 128> of row `in` (rstd r) into out
template <class E>
inline void row(E* out, const E* in, float r, const float* w, const float* c, const float* s,
                bool rnd) {
  const __m512 rv = _mm512_set1_ps(r);
  __m512 y[8];
  for (int k = 0; k < 8; ++k) {  // rms_apply, round_row
    y[k] = _mm512_mul_ps(_mm512_mul_ps(widen(in + 16 * k), rv), _mm512_loadu_ps(w + 16 * k));
    if (rnd) y[k] = round_bf16(y[k]);
  }
  for (int k = 0; k < 4; ++k) {  // rope_row (sign 1), stored
    const __m512 cv = _mm512_loadu_ps(c + 16 * k), sv = _mm512_loadu_ps(s + 16 * k);
    put(out + 16 * k, _mm512_fmsub_ps(y[k], cv, _mm512_mul_ps(y[k + 4], sv)), rnd);
    put(out + 64 + 16 * k, _mm512_fmadd_ps(y[k + 4], cv, _mm512_mul_ps(y[k], sv)), rnd);
  }
}
// qk_row_backward<E, 128, float> in two parts. First the gradient before the rotation
// into gr [128] and rms_row_backward's dot (times r): g the rotated row's gradient, in the row.
template <class E>
inline float grad_dot(float* gr, const float* g, const E* in, float r, const float* w,
                      const float* c, const float* s, bool rnd) {
  const __m512 neg = _mm512_set1_ps(-1.0f);
  __m512 acc = _mm512_setzero_ps();
  for (int k = 0; k < 4; ++k) {  // rope_row (sign -1), round_row, the dot's terms
    const __m512 cv = _mm512_loadu_ps(c + 16 * k),
                 se = _mm512_mul_ps(neg, _mm512_loadu_ps(s + 16 * k));
    const __m512 g1 = _mm512_loadu_ps(g + 16 * k), g2 = _mm512_loadu_ps(g + 64 + 16 * k);
    __m512 a = _mm512_fmsub_ps(g1, cv, _mm512_mul_ps(g2, se)),
           b = _mm512_fmadd_ps(g2, cv, _mm512_mul_ps(g1, se));
    if (rnd) a = round_bf16(a), b = round_bf16(b);
    _mm512_storeu_ps(gr + 16 * k, a);
    _mm512_storeu_ps(gr + 64 + 16 * k, b);
  }
  for (int k = 0; k < 8; ++k)  // (the lanes' sums in k order, as lane_sum)
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(gr + 16 * k), _mm512_loadu_ps(w + 16 * k)),
                          widen(in + 16 * k), acc);
  return hsum(acc) * r;
}
// Then the row's gradient into out and the norm weight's into dw (kept in registers across
// rows by the caller: the same adds in the same order as dw's row after row)
template <class E>
inline void grad_out(E* out, __m512 dw[8], const float* gr, const E* in, float r, float dot,
                     const float* w, bool rnd) {
  const __m512 rv = _mm512_set1_ps(r), dv = _mm512_set1_ps(dot), inv = _mm512_set1_ps(1.0f / 128);
  for (int k = 0; k < 8; ++k) {
    const __m512 x = widen(in + 16 * k), g = _mm512_loadu_ps(gr + 16 * k);
    dw[k] = _mm512_fmadd_ps(_mm512_mul_ps(g, x), rv, dw[k]);
    const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(x, rv), dv), inv);
    put(out + 16 * k, _mm512_mul_ps(rv, _mm512_fmsub_ps(g, _mm512_loadu_ps(w + 16 * k), t)), rnd);
  }
}
// A head's rows as qkn_rows and qkn_grads walk them, RB at a time: each part over the batch
// before the next (hot, a row's forward 43 -> 23 ns, its gradient 36 -> 28 ns in bf16 storage).
// Row t's tables at cos + p * 64: p = t, or t - ds[t] with block-causal positions (QknRows).
constexpr int64_t RB = 8;
template <class E>
inline void rows(E* out, const E* in, int64_t R, float* rs, int64_t rstride, bool fresh, double eps,
                 const float* w, const float* cos, const float* sin, const int32_t* ds, int64_t n,
                 bool rnd) {
  for (int64_t t0 = 0; t0 < n; t0 += RB) {
    const int64_t e = t0 + RB < n ? t0 + RB : n;
    if (fresh)
      for (int64_t t = t0; t < e; ++t) rs[t * rstride] = rstd(in + t * R, eps);
    for (int64_t t = t0; t < e; ++t) {
      const int64_t p = ds ? t - ds[t] : t;
      row(out + t * 128, in + t * R, rs[t * rstride], w, cos + p * 64, sin + p * 64, rnd);
    }
  }
}
template <class E>
inline void grads(E* out, const E* in, int64_t R, const float* g, const float* rs, int64_t rstride,
                  const float* w, const float* cos, const float* sin, const int32_t* ds, int64_t n,
                  bool rnd, float* dw) {
  alignas(64) float gr[RB][128];
  float dot[RB];
  __m512 dwv[8];
  for (int k = 0; k < 8; ++k) dwv[k] = _mm512_loadu_ps(dw + 16 * k);
  for (int64_t t0 = 0; t0 < n; t0 += RB) {
    const int64_t e = t0 + RB < n ? t0 + RB : n;
    for (int64_t t = t0; t < e; ++t) {
      const int64_t p = ds ? t - ds[t] : t;
      dot[t - t0] = grad_dot(gr[t - t0], g + t * 128, in + t * R, rs[t * rstride], w, cos + p * 64,
                             sin + p * 64, rnd);
    }
    for (int64_t t = t0; t < e; ++t)
      grad_out(out + t * R, dwv, gr[t - t0], in + t * R, rs[t * rstride], dot[t - t0], w, rnd);
  }
  for (int k = 0; k < 8; ++k) _mm512_storeu_ps(dw + 16 * k, dwv[k]);
}
}  // namespace qk512
constexpr bool kFastRows = true;
#else
namespace qk512 {  // (declared only: every use is under if constexpr (kFastRows))
template <class E>
void rows(E*, const E*, int64_t, float*, int64_t, bool, double, const float*, const float*,
          const float*, const int32_t*, int64_t, bool);
template <class E>
void grads(E*, const E*, int64_t, const float*, const float*, int64_t, const float*, const float*,
           const float*, const int32_t*, int64_t, bool, float*);
}  // namespace qk512
constexpr bool kFastRows = false;
#endif

// The qkv split, QK-norm and RoPE in one pass over each token's fused projection row: per
// kv group g of a row, [G query heads | key | value] (spec §3). Row by row the arithmetic
// (and, for a fixed thread count dividing N, the order of the norm weights' gradient sums)
// is that of the unfused ops. Activations in fp32 or (h16) bf16 storage (E: float or
// uint16_t), read and written in place: bf16 widened as read, rounded as stored.
// DC: the head dimension known at compile time (0: D at run time). Every Qwen3 preset has
// D = 128; with it constant the row loops compile without remainders or run-time trip
// counts, the same bits (W2 bf16 storage: forward -20 to -25 %, backward -10 to -18 %).
template <class E, int DC>
static void qk_fwd(E* q, E* k, E* v, float* qrstd, float* krstd, const E* qkv, const float* qw,
                   const float* kw, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t H, int64_t KVH, int64_t Dr, double eps, bool rnd, const int32_t* doc) {
  const int64_t D = DC ? DC : Dr;
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D, D2 = D / 2, N = B * T;
#pragma omp parallel if (N * R > 16384)
  {
    // the normalized row before its rotation, the rotated row (bf16 storage)
    std::vector<float> y(static_cast<size_t>(D)), o(static_cast<size_t>(D));
    std::vector<float> rs(static_cast<size_t>(G + 1));  // the group's rstd
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float *c = cos + rope_pos(doc, n, T) * D2, *s = sin + rope_pos(doc, n, T) * D2;
      for (int64_t g = 0; g < KVH; ++g) {
        const E* in = qkv + n * R + g * (G + 2) * D;
        if (n + 1 < N) {  // this group's rows of the next token
          fetch(in + R, (G + 2) * D, false);
          fetch(q + ((n + 1) * H + g * G) * D, G * D, true);
          fetch(k + ((n + 1) * KVH + g) * D, D, true);
          fetch(v + ((n + 1) * KVH + g) * D, D, true);
        }
        // the rows' sums first: each is a chain of dependent adds, and side by side they overlap
        for (int64_t i = 0; i <= G; ++i) rs[size_t(i)] = rms_rstd(in + i * D, D, eps);
        for (int64_t i = 0; i <= G; ++i) {  // G query heads, then the key
          const bool key = i == G;
          const int64_t row = key ? n * KVH + g : n * H + g * G + i;
          (key ? krstd : qrstd)[row] = rs[size_t(i)];
          qk_row<E, DC>((key ? k : q) + row * D, in + i * D, rs[size_t(i)], key ? kw : qw, c, s, D,
                        rnd, y.data(), o.data());
        }
        std::memcpy(v + (n * KVH + g) * D, in + (G + 1) * D, size_t(D) * sizeof(E));
      }
    }
  }
}
void qk_norm_rope_forward(float* q, float* k, float* v, float* qrstd, float* krstd,
                          const float* qkv, const float* qw, const float* kw, const float* cos,
                          const float* sin, int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                          double eps, bool rnd, bool h16, const int32_t* doc) {
  const auto b16 = [](auto* p) { return reinterpret_cast<uint16_t*>(p); };
  const auto run = [&](auto f32, auto f16) {
    if (!h16)
      return f32(q, k, v, qrstd, krstd, qkv, qw, kw, cos, sin, B, T, H, KVH, D, eps, rnd, doc);
    f16(b16(q), b16(k), b16(v), qrstd, krstd, reinterpret_cast<const uint16_t*>(qkv), qw, kw, cos,
        sin, B, T, H, KVH, D, eps, rnd, doc);
  };
  if (D == 128) return run(qk_fwd<float, 128>, qk_fwd<uint16_t, 128>);
  run(qk_fwd<float, 0>, qk_fwd<uint16_t, 0>);
}
template <class E, int DC>  // (DC as in qk_fwd)
static void qk_bwd(E* dqkv, float* dqw, float* dkw, const E* dq, const E* dk, const E* dv,
                   const E* qkv, const float* qrstd, const float* krstd, const float* qw,
                   const float* kw, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t H, int64_t KVH, int64_t Dr, bool rnd, const int32_t* doc) {
  const int64_t D = DC ? DC : Dr;
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D, D2 = D / 2, N = B * T;
  // dqw and dkw summed per chunk of kNormRows q rows (k rows), as RMSNorm's dw sums the model's
  // composition: blocks of kNormRows tokens hold whole chunks of both, H and KVH of them
  const int64_t nb = norm_chunks(N), per = D + 16;
  std::vector<float> pq(size_t(norm_chunks(N * H) * per), 0.0f),
      pk(size_t(norm_chunks(N * KVH) * per), 0.0f);
#pragma omp parallel if (N * R > 16384)
  {
    std::vector<float> gr(static_cast<size_t>(D));  // the row's gradient before the rotation
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t n = b * kNormRows; n < std::min(N, (b + 1) * kNormRows); ++n) {
        const float *c = cos + rope_pos(doc, n, T) * D2, *s = sin + rope_pos(doc, n, T) * D2;
        for (int64_t g = 0; g < KVH; ++g) {
          const E* in = qkv + n * R + g * (G + 2) * D;
          E* out = dqkv + n * R + g * (G + 2) * D;
          if (n + 1 < N) {  // this group's rows of the next token
            fetch(in + R, (G + 2) * D, false);
            fetch(out + R, (G + 2) * D, true);
            fetch(dq + ((n + 1) * H + g * G) * D, G * D, false);
            fetch(dk + ((n + 1) * KVH + g) * D, D, false);
            fetch(dv + ((n + 1) * KVH + g) * D, D, false);
          }
          // each row read and written in its storage, not through widened copies of the group
          // (W2 layer, old and new alternating in one process: bf16 storage -34 %, fp32 -20 %;
          // the forward likewise, bf16 -25 %)
          for (int64_t i = 0; i <= G; ++i) {
            const bool key = i == G;
            const int64_t row = key ? n * KVH + g : n * H + g * G + i;
            float* const part = (key ? pk : pq).data() + size_t(row / kNormRows * per);
            qk_row_backward<E, DC>(out + i * D, part, (key ? dk : dq) + row * D, in + i * D,
                                   (key ? krstd : qrstd)[row], key ? kw : qw, c, s, D, rnd,
                                   gr.data());
          }
          std::memcpy(out + (G + 1) * D, dv + (n * KVH + g) * D, size_t(D) * sizeof(E));
        }
      }
    }
  }
  add_chunk_sums(dqw, pq.data(), norm_chunks(N * H), size_t(per), D);
  add_chunk_sums(dkw, pk.data(), norm_chunks(N * KVH), size_t(per), D);
}
void qk_norm_rope_backward(float* dqkv, float* dqw, float* dkw, const float* dq, const float* dk,
                           const float* dv, const float* qkv, const float* qrstd,
                           const float* krstd, const float* qw, const float* kw, const float* cos,
                           const float* sin, int64_t B, int64_t T, int64_t H, int64_t KVH,
                           int64_t D, bool rnd, bool h16, const int32_t* doc) {
  const auto b16 = [](const float* p) { return reinterpret_cast<const uint16_t*>(p); };
  const auto run = [&](auto f32, auto f16) {
    if (!h16)
      return f32(dqkv, dqw, dkw, dq, dk, dv, qkv, qrstd, krstd, qw, kw, cos, sin, B, T, H, KVH, D,
                 rnd, doc);
    f16(reinterpret_cast<uint16_t*>(dqkv), dqw, dkw, b16(dq), b16(dk), b16(dv), b16(qkv), qrstd,
        krstd, qw, kw, cos, sin, B, T, H, KVH, D, rnd, doc);
  };
  if (D == 128) return run(qk_bwd<float, 128>, qk_bwd<uint16_t, 128>);
  run(qk_bwd<float, 0>, qk_bwd<uint16_t, 0>);
}

// QK-norm and RoPE inside attention (QkNorm in cpu/gemm.h): a head's rows by qk_row and back
// by qk_row_backward, so the values of qk_norm_rope_* (at D = 128 on AVX-512 builds by qk512,
// the same bits).
struct QknRows {  // where rows t0.. of sequence b's head h lie (h as in QkNorm::rows)
  int64_t at, R, rstride, D2;
  const float *w, *cos, *sin;
  // block-causal: ds[t] the document start of row t (at position t0 + t, which is t - ds[t]
  // rows of the tables after cos), else null (at t0 + t)
  const int32_t* ds;
  float* rstd;
  QknRows(const QkNorm& qn, int64_t b, int64_t h, int64_t t0) {
    const int64_t H = qn.H, KVH = qn.KVH, T = qn.T;
    const bool key = h >= H;
    R = qn.R(), D2 = qn.D / 2;
    at = qn.at(b, h, t0);
    rstride = key ? KVH : H;
    rstd = key ? qn.krstd + (b * T + t0) * KVH + (h - H) : qn.qrstd + (b * T + t0) * H + h;
    w = key ? qn.kw : qn.qw;
    cos = qn.cos + t0 * D2, sin = qn.sin + t0 * D2;
    ds = qn.doc ? qn.doc + b * T + t0 : nullptr;
  }
};
// A head's n rows, R elements apart in the projection (in, and out for the gradients), their
// rstd rstride apart, cos and sin rows D/2 apart (row t's at t, or t - ds[t]: QknRows): by the
// row code above, one row after another.
template <class E, int DC>
static void head_rows(E* out, const E* in, int64_t R, float* rs, int64_t rstride, bool fresh,
                      double eps, const float* w, const float* cos, const float* sin,
                      const int32_t* ds, int64_t Dr, int64_t n, bool rnd) {
  const int64_t D = DC ? DC : Dr, D2 = D / 2;
  std::vector<float> y(static_cast<size_t>(2 * D));
  for (int64_t t = 0; t < n; ++t) {
    const E* r = in + t * R;
    const int64_t p = ds ? t - ds[t] : t;
    if (fresh) rs[t * rstride] = rms_rstd(r, D, eps);
    qk_row<E, DC>(out + t * D, r, rs[t * rstride], w, cos + p * D2, sin + p * D2, D, rnd, y.data(),
                  y.data() + D);
  }
}
template <class E, int DC>
static void head_grads(E* out, const E* in, int64_t R, const float* g, const float* rs,
                       int64_t rstride, const float* w, const float* cos, const float* sin,
                       const int32_t* ds, int64_t Dr, int64_t n, bool rnd, float* dw) {
  const int64_t D = DC ? DC : Dr, D2 = D / 2;
  std::vector<float> gr(static_cast<size_t>(D));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = ds ? t - ds[t] : t;
    qk_row_backward<E, DC>(out + t * R, dw, g + t * D, in + t * R, rs[t * rstride], w, cos + p * D2,
                           sin + p * D2, D, rnd, gr.data());
  }
}
template <class E, int DC>
static void qkn_rows(const QkNorm& qn, void* dst, int64_t b, int64_t h, int64_t t0, int64_t n,
                     bool fresh) {
  const QknRows w(qn, b, h, t0);
  const E* in = static_cast<const E*>(qn.qkv) + w.at;
  E* out = static_cast<E*>(dst);
  if constexpr (kFastRows && DC == 128)
    return qk512::rows(out, in, w.R, w.rstd, w.rstride, fresh, qn.eps, w.w, w.cos, w.sin, w.ds, n,
                       qn.rnd);
  head_rows<E, DC>(out, in, w.R, w.rstd, w.rstride, fresh, qn.eps, w.w, w.cos, w.sin, w.ds, qn.D, n,
                   qn.rnd);
}
template <class E, int DC>
static void qkn_grads(const QkNorm& qn, const float* g, int64_t b, int64_t h, int64_t t0, int64_t n,
                      float* dw) {
  const QknRows w(qn, b, h, t0);
  const E* in = static_cast<const E*>(qn.qkv) + w.at;
  E* out = static_cast<E*>(qn.dqkv) + w.at;
  if constexpr (kFastRows && DC == 128)
    return qk512::grads(out, in, w.R, g, w.rstd, w.rstride, w.w, w.cos, w.sin, w.ds, n, qn.rnd, dw);
  head_grads<E, DC>(out, in, w.R, g, w.rstd, w.rstride, w.w, w.cos, w.sin, w.ds, qn.D, n, qn.rnd,
                    dw);
}
bool qk_rows_for_tests(bool fast, bool h16, void* out, const void* in, int64_t R, float* rstd,
                       bool fresh, const float* w, const float* cos, const float* sin, int64_t n,
                       bool rnd) {
  if (fast && !kFastRows) return false;
  const auto run = [&](auto* o, const auto* x) {
    if constexpr (kFastRows)
      if (fast) return qk512::rows(o, x, R, rstd, 1, fresh, 1e-6, w, cos, sin, nullptr, n, rnd);
    using E = std::remove_pointer_t<decltype(o)>;
    head_rows<E, 128>(o, x, R, rstd, 1, fresh, 1e-6, w, cos, sin, nullptr, 128, n, rnd);
  };
  if (h16)
    run(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in));
  else
    run(static_cast<float*>(out), static_cast<const float*>(in));
  return true;
}
bool qk_grads_for_tests(bool fast, bool h16, void* out, const void* in, int64_t R, const float* g,
                        const float* rstd, const float* w, const float* cos, const float* sin,
                        int64_t n, bool rnd, float* dw) {
  if (fast && !kFastRows) return false;
  const auto run = [&](auto* o, const auto* x) {
    if constexpr (kFastRows)
      if (fast) return qk512::grads(o, x, R, g, rstd, 1, w, cos, sin, nullptr, n, rnd, dw);
    using E = std::remove_pointer_t<decltype(o)>;
    head_grads<E, 128>(o, x, R, g, rstd, 1, w, cos, sin, nullptr, 128, n, rnd, dw);
  };
  if (h16)
    run(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in));
  else
    run(static_cast<float*>(out), static_cast<const float*>(in));
  return true;
}
static QkNorm qk_norm(const float* qkv, float* dqkv, const float* qw, const float* kw,
                      const float* cos, const float* sin, const int32_t* doc, float* qrstd,
                      float* krstd, float* dw, int64_t T, int64_t H, int64_t KVH, int64_t D,
                      double eps, bool rnd, bool h16) {
  QkNorm qn{qkv, dqkv, qw, kw,  cos, sin, doc, qrstd,   krstd,
            dw,  T,    H,  KVH, D,   eps, rnd, nullptr, nullptr};
  if (D == 128) {
    qn.rows = h16 ? qkn_rows<uint16_t, 128> : qkn_rows<float, 128>;
    qn.grads = h16 ? qkn_grads<uint16_t, 128> : qkn_grads<float, 128>;
  } else {
    qn.rows = h16 ? qkn_rows<uint16_t, 0> : qkn_rows<float, 0>;
    qn.grads = h16 ? qkn_grads<uint16_t, 0> : qkn_grads<float, 0>;
  }
  return qn;
}

void attention_qkn_forward(float* out, float* stats, float* qrstd, float* krstd, const float* qkv,
                           const float* qw, const float* kw, const float* cos, const float* sin,
                           int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, double eps,
                           bool bf16, bool h16, const int32_t* doc) {
  const QkNorm qn = qk_norm(qkv, nullptr, qw, kw, cos, sin, doc, qrstd, krstd, nullptr, T, H, KVH,
                            D, eps, bf16, h16);
  attention_forward_kernels(bf16, h16, out, stats, nullptr, nullptr, nullptr, B, T, H, KVH, D, doc,
                            &qn);
}
void attention_qkn_backward(float* dqkv, float* dqw, float* dkw, const float* dout,
                            const float* out, const float* stats, const float* qkv,
                            const float* qrstd, const float* krstd, const float* qw,
                            const float* kw, const float* cos, const float* sin, int64_t B,
                            int64_t T, int64_t H, int64_t KVH, int64_t D, bool bf16, bool h16,
                            const int32_t* doc) {
  // the norm weights' gradients per task, summed in task order: the same for any thread count
  std::vector<float> part(size_t(B * KVH * 2 * D), 0.0f);
  // (the rstd are only read: rows() is called with fresh false)
  const QkNorm qn = qk_norm(qkv, dqkv, qw, kw, cos, sin, doc, const_cast<float*>(qrstd),
                            const_cast<float*>(krstd), part.data(), T, H, KVH, D, 0.0, bf16, h16);
  attention_backward_kernels(bf16, h16, nullptr, nullptr, nullptr, dout, out, stats, nullptr,
                             nullptr, nullptr, B, T, H, KVH, D, doc, &qn);
  for (int64_t t = 0; t < B * KVH; ++t)
    for (int64_t e = 0; e < D; ++e)
      dqw[e] += part[size_t(t * 2 * D + e)], dkw[e] += part[size_t(t * 2 * D + D + e)];
}

static inline float dot(const float* a, const float* b, int64_t D) {
  return lane_sum(D, [=](int64_t e) { return a[e] * b[e]; });
}

// Causal and block-causal attention. With our kernels: cpu/attention_driver.h. The portable
// path (OpenBLAS): blocks of kQB query rows, with S = Q Kᵀ, O = P V and every backward product
// as one single-threaded product over just the keys the block can see: key blocks the mask
// hides entirely are never computed (about half of a dense T x T product; block-causal, also
// the keys before the block's first query's document). The G query heads that share a kv head
// are stacked into one block of G x m rows.
constexpr int64_t kQB = 64;

// Probabilities P = softmax(scale Q Kᵀ) of a stacked block over keys k0..k0+e-1 into
// s [G*m, e]: row g*m + r is head g's query i0 + r (its lse at lse[g*T + r]), zero where
// masked (block-causal: ds[r] the first key query i0 + r sees, k0 <= ds[r]). lse_new (forward)
// receives each row's log-sum-exp; lse_old (backward) is the saved one P is rebuilt from.
static void block_probs(float* s, const float* qs, const float* kp, int64_t i0, int64_t m,
                        int64_t G, int64_t e, int64_t ldk, int64_t D, int64_t T, float* lse_new,
                        const float* lse_old, int64_t k0, const int32_t* ds) {
  const float scale = 1.0f / std::sqrt(float(D));
  sgemm(false, true, G * m, e, D, scale, qs, D, kp, ldk, 0.0f, s, e);
  for (int64_t gr = 0; gr < G * m; ++gr) {
    const int64_t g = gr / m, r = gr % m;
    // keys j0..n-1 (of k0..) visible: from its document's start to itself
    const int64_t j0 = ds ? ds[r] - k0 : 0, n = i0 + r + 1 - k0;
    float* row = s + gr * e;
    float* vis = row + j0;
    if (lse_old) {
      const float l = lse_old[g * T + r];
#pragma omp simd
      for (int64_t j = 0; j < n - j0; ++j) vis[j] = vexp(vis[j] - l);
    } else {
      const float mx = lane_max(vis, n - j0);
#pragma omp simd
      for (int64_t j = 0; j < n - j0; ++j) vis[j] = vexp(vis[j] - mx);
      const float sum = lane_sum(n - j0, [vis](int64_t j) { return vis[j]; });
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n - j0; ++j) vis[j] *= inv;
      lse_new[g * T + r] = mx + std::log(sum);
    }
    std::fill(row, vis, 0.0f);
    std::fill(row + n, row + e, 0.0f);
  }
}

// dst [G*m, D] <- rows i0.. of the G heads of kv head g (x: [B, T, H, D]), or back.
static void stack_heads(float* dst, const float* x, int64_t m, int64_t G, int64_t H, int64_t D) {
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(dst + (g * m + r) * D, x + (r * H + g) * D, D * sizeof(float));
}
static void unstack_heads(float* x, const float* src, int64_t m, int64_t G, int64_t H, int64_t D) {
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(x + (r * H + g) * D, src + (g * m + r) * D, D * sizeof(float));
}

static void attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v,
                          int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                          const int32_t* doc) {
  const int64_t G = H / KVH, nqb = (T + kQB - 1) / kQB;
#pragma omp parallel
  {
    std::vector<float> s(G * kQB * T), qs(G * kQB * D), os(G * kQB * D);
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KVH; ++g)
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t i0 = qb * kQB, m = std::min(kQB, T - i0);
          // keys k0..k0+e-1: to the last query's, from the first query's document's start
          const int32_t* ds = doc ? doc + b * T + i0 : nullptr;
          const int64_t k0 = ds ? ds[0] : 0, e = i0 + m - k0;
          const float* kp = k + ((b * T + k0) * KVH + g) * D;  // key row k0 + j at kp + j*KVH*D
          const float* vp = v + ((b * T + k0) * KVH + g) * D;
          const int64_t row0 = ((b * T + i0) * H + g * G) * D;  // head g*G's query i0
          stack_heads(qs.data(), q + row0, m, G, H, D);
          block_probs(s.data(), qs.data(), kp, i0, m, G, e, KVH * D, D, T,
                      lse + (b * H + g * G) * T + i0, nullptr, k0, ds);
          sgemm(false, false, G * m, D, e, 1.0f, s.data(), e, vp, KVH * D, 0.0f, os.data(), D);
          unstack_heads(out + row0, os.data(), m, G, H, D);
        }
  }
}

static void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                          const int32_t* doc) {
  const int64_t G = H / KVH, nqb = (T + kQB - 1) / kQB;
  const float scale = 1.0f / std::sqrt(float(D));
  // One task per (sequence, kv head): it owns that head's dk/dv rows, so no races.
#pragma omp parallel
  {
    std::vector<float> p(G * kQB * T), ds(G * kQB * T), qs(G * kQB * D), dos(G * kQB * D),
        dqs(G * kQB * D), rowdot(G * kQB);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t g = 0; g < KVH; ++g) {
        const int64_t kv0 = (b * T * KVH + g) * D, ldk = KVH * D;
        for (int64_t j = 0; j < T; ++j) {
          std::fill_n(dk + kv0 + j * ldk, D, 0.0f);
          std::fill_n(dv + kv0 + j * ldk, D, 0.0f);
        }
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t i0 = qb * kQB, m = std::min(kQB, T - i0), M = G * m;
          // keys k0..k0+e-1 (as in attention_fwd), their rows from kj
          const int32_t* dst = doc ? doc + b * T + i0 : nullptr;
          const int64_t k0 = dst ? dst[0] : 0, e = i0 + m - k0, kj = kv0 + k0 * ldk;
          const int64_t row0 = ((b * T + i0) * H + g * G) * D;
          stack_heads(qs.data(), q + row0, m, G, H, D);
          stack_heads(dos.data(), dout + row0, m, G, H, D);
          for (int64_t gr = 0; gr < M; ++gr)  // rowsum(dO O) per stacked row
            rowdot[gr] = dot(dos.data() + gr * D, out + row0 + ((gr % m) * H + gr / m) * D, D);
          block_probs(p.data(), qs.data(), k + kj, i0, m, G, e, ldk, D, T, nullptr,
                      lse + (b * H + g * G) * T + i0, k0, dst);
          // dV += Pᵀ dO;  dP = dO Vᵀ
          sgemm(true, false, e, D, M, 1.0f, p.data(), e, dos.data(), D, 1.0f, dv + kj, ldk);
          sgemm(false, true, M, e, D, 1.0f, dos.data(), D, v + kj, ldk, 0.0f, ds.data(), e);
          // dS = P (dP - rowsum(dO O)) scale; masked entries have P = 0
          for (int64_t gr = 0; gr < M; ++gr) {
            const float d = rowdot[gr];
            float *dsr = ds.data() + gr * e, *pr = p.data() + gr * e;
#pragma omp simd
            for (int64_t j = 0; j < e; ++j) dsr[j] = pr[j] * (dsr[j] - d) * scale;
          }
          // dQ = dS K;  dK += dSᵀ Q
          sgemm(false, false, M, D, e, 1.0f, ds.data(), e, k + kj, ldk, 0.0f, dqs.data(), D);
          unstack_heads(dq + row0, dqs.data(), m, G, H, D);
          sgemm(true, false, e, D, M, 1.0f, ds.data(), e, qs.data(), D, 1.0f, dk + kj, ldk);
        }
      }
  }
}

int64_t attention_stats(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, bool bf16) {
  return own_kernels() ? AttnProbs::stats_floats(B, T, H, KVH, D, bf16) : B * H * T;
}
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                       const int32_t* doc) {
  if (own_kernels())
    return attention_forward_kernels(false, false, out, lse, q, k, v, B, T, H, KVH, D, doc);
  attention_fwd(out, lse, q, k, v, B, T, H, KVH, D, doc);
}
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t KVH, int64_t D, const int32_t* doc) {
  if (own_kernels())
    return attention_backward_kernels(false, false, dq, dk, dv, dout, out, lse, q, k, v, B, T, H,
                                      KVH, D, doc);
  attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D, doc);
}
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, bool h16,
                            const int32_t* doc) {
  attention_forward_kernels(true, h16, out, lse, q, k, v, B, T, H, KVH, D, doc);
}
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const float* q, const float* k, const float* v,
                             int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, bool h16,
                             const int32_t* doc) {
  attention_backward_kernels(true, h16, dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D, doc);
}

// Generation's attention over a KV cache (model/ops.h), E the storage. A task per (sequence,
// kv head): its G query heads share each key and value row as it is read, so the cache is read
// once a step, which is what bounds it at long contexts (the products are 2 D flops a byte of
// bf16 cache). Scores into s [G][len], softmax, then the rows of v summed into the outputs.
template <class E>
static void attn_decode(E* out, const E* q, const E* kc, const E* vc, const int32_t* len, int64_t B,
                        int64_t H, int64_t KVH, int64_t D, int64_t Tc, bool rnd) {
  const int64_t G = H / KVH;
  const float scale = 1.0f / std::sqrt(float(D));
  int64_t keys = 0;
  for (int64_t b = 0; b < B; ++b) keys += len[b];
    // A team only for work that repays waking it: a short context's step is microseconds of
    // arithmetic, and a parallel region costs more than that on a loaded machine.
#pragma omp parallel if (keys * H * D > (int64_t(1) << 18))
  {
    std::vector<float> qf(size_t(G * D)), acc(size_t(G * D)), s;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * KVH; ++task) {
      const int64_t b = task / KVH, g = task % KVH, n = len[b];
      s.resize(size_t(G * n));
      for (int64_t i = 0; i < G * D; ++i) qf[size_t(i)] = load(q[(b * H + g * G) * D + i]);
      for (int64_t j = 0; j < n; ++j) {
        const E* kj = kc + ((b * Tc + j) * KVH + g) * D;
        for (int64_t i = 0; i < G; ++i) {
          const float* qi = qf.data() + i * D;
          float d = 0;
#pragma omp simd reduction(+ : d)
          for (int64_t e = 0; e < D; ++e) d += qi[e] * load(kj[e]);
          s[size_t(i * n + j)] = d * scale;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::vector<float> sum(static_cast<size_t>(G));
      for (int64_t i = 0; i < G; ++i) {
        float* si = s.data() + i * n;
        const float m = lane_max(si, n);
        float t = 0;
#pragma omp simd reduction(+ : t)
        for (int64_t j = 0; j < n; ++j) t += si[j] = vexp(si[j] - m);
        sum[size_t(i)] = t;
      }
      for (int64_t j = 0; j < n; ++j) {
        const E* vj = vc + ((b * Tc + j) * KVH + g) * D;
        for (int64_t i = 0; i < G; ++i) {
          float* ai = acc.data() + i * D;
          const float p = s[size_t(i * n + j)];
#pragma omp simd
          for (int64_t e = 0; e < D; ++e) ai[e] += p * load(vj[e]);
        }
      }
      for (int64_t i = 0; i < G; ++i)
        for (int64_t e = 0; e < D; ++e)
          out[(b * H + g * G + i) * D + e] =
              store_as<E>(acc[size_t(i * D + e)] / sum[size_t(i)], rnd);
    }
  }
}
void attention_decode(float* out, const float* q, const float* kc, const float* vc,
                      const int32_t* len, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t Tc,
                      bool bf16, bool h16) {
  if (!h16) return attn_decode(out, q, kc, vc, len, B, H, KVH, D, Tc, bf16);
  const auto u = [](const float* p) { return reinterpret_cast<const uint16_t*>(p); };
  attn_decode(reinterpret_cast<uint16_t*>(out), u(q), u(kc), u(vc), len, B, H, KVH, D, Tc, true);
}

// SwiGLU on fp32 or (E = uint16_t) bf16 storage, fetching as far ahead in bytes; results
// rounded to bf16 where rnd (always, in bf16 storage). One template for both storages: written
// as two loops, an -O2 build fused `1 + x (1 - sg)` into an fma in one and not the other (a
// different bf16 near x = -1 / (1 - sg)). So that fma is written out: left to GCC, whether it
// fuses depends on the code around it (a change to vexp's selects flipped it), and the two
// forms differ in ~10 % of the fp32 da values by up to 78 ulp (where x (1 - sg) is near -1),
// which moves the walkthrough's losses.
template <class E, bool RND>
static void swiglu_fwd(E* out, const E* ab, int64_t N, int64_t F) {
  constexpr int64_t step = kStep * 4 / sizeof(E), ahead = kAhead * 4 / sizeof(E);
#pragma omp parallel for schedule(static) if (N * F > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const E *a = ab + n * 2 * F, *b = a + F;
    E* o = out + n * F;
    for (int64_t f0 = 0; f0 < F; f0 += step) {
      fetch(a + f0 + ahead, step, false);
      fetch(b + f0 + ahead, step, false);
      fetch(o + f0 + ahead, step, true);
      const int64_t f1 = std::min(F, f0 + step);
#pragma omp simd
      for (int64_t f = f0; f < f1; ++f) {
        const float x = load(a[f]);
        o[f] = store_as<E>(x / (1.0f + vexp(-x)) * load(b[f]), RND);
      }
    }
  }
}
template <class E, bool RND>
static void swiglu_bwd(E* dab, const E* dout, const E* ab, int64_t N, int64_t F) {
  constexpr int64_t step = kStep * 4 / sizeof(E), ahead = kAhead * 4 / sizeof(E);
#pragma omp parallel for schedule(static) if (N * F > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const E *a = ab + n * 2 * F, *b = a + F, *g = dout + n * F;
    E *da = dab + n * 2 * F, *db = da + F;
    for (int64_t f0 = 0; f0 < F; f0 += step) {
      fetch(a + f0 + ahead, step, false);
      fetch(b + f0 + ahead, step, false);
      fetch(g + f0 + ahead, step, false);
      fetch(da + f0 + ahead, step, true);
      fetch(db + f0 + ahead, step, true);
      const int64_t f1 = std::min(F, f0 + step);
#pragma omp simd
      for (int64_t f = f0; f < f1; ++f) {
        const float x = load(a[f]), y = load(b[f]), gf = load(g[f]);
        const float sg = 1.0f / (1.0f + vexp(-x));
        da[f] = store_as<E>(gf * y * sg * std::fma(x, 1.0f - sg, 1.0f), RND);
        db[f] = store_as<E>(gf * x * sg, RND);
      }
    }
  }
}
void swiglu_forward(float* out, const float* ab, int64_t N, int64_t F, bool rnd) {
  (rnd ? swiglu_fwd<float, true> : swiglu_fwd<float, false>)(out, ab, N, F);
}
void swiglu_backward(float* dab, const float* dout, const float* ab, int64_t N, int64_t F,
                     bool rnd) {
  (rnd ? swiglu_bwd<float, true> : swiglu_bwd<float, false>)(dab, dout, ab, N, F);
}
void swiglu_forward_bf16(uint16_t* out, const uint16_t* ab, int64_t N, int64_t F) {
  swiglu_fwd<uint16_t, true>(out, ab, N, F);
}
void swiglu_backward_bf16(uint16_t* dab, const uint16_t* dout, const uint16_t* ab, int64_t N,
                          int64_t F) {
  swiglu_bwd<uint16_t, true>(dab, dout, ab, N, F);
}

double crossentropy_forward(float* lse, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V) {
  std::vector<double> per_row(N);
#pragma omp parallel for schedule(static) if (N * V > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    const float mx = lane_max(row, V);
    const float sum = lane_sum(V, [row, mx](int64_t j) { return vexp(row[j] - mx); });
    lse[n] = mx + std::log(sum);
    per_row[n] = double(lse[n]) - double(row[targets[n]]);
  }
  double total = 0;  // fixed order: reproducible for any thread count
  for (int64_t n = 0; n < N; ++n) total += per_row[n];
  return total / N;
}
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V, double scale) {
  const float s = float(scale);
#pragma omp parallel for schedule(static) if (N * V > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float* d = dlogits + n * V;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = vexp(row[j] - lse[n]) * s;
    d[targets[n]] -= s;
  }
}

// The residual stream's add and the norm after it, each row while it is in cache (model/ops.h):
// the row functions of rmsnorm_* and the same roundings, so the same bits (backward: dw's
// partial sums over the same threads' rows, so in the same order).
void add_rmsnorm_forward(float* y, float* out, float* rstd, const float* a, const float* b,
                         const float* w, int64_t N, int64_t C, double eps, bool rnd) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    float *yr = y + n * C, *o = out + n * C;
    const float *ar = a + n * C, *br = b + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = rnd ? round_bf16(ar[c] + br[c]) : ar[c] + br[c];
    rstd[n] = rms_row(o, yr, w, C, eps);
    if (rnd) round_row(o, C);
  }
}
void rmsnorm_backward_add(float* dy, float* dw, const float* dout, const float* x,
                          const float* rstd, const float* w, int64_t N, int64_t C, bool rnd) {
  rms_backward<true>(dy, dw, dout, x, rstd, w, N, C, rnd);
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void round_bf16_inplace(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace tq::cpu
