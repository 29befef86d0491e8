// Our own packed matrix products (src/cpu/gemm_driver.h, one instance per instruction set):
//   C[M, N] (= or +=) alpha * sum_k A(m, k) * B(n, k)
// A and B are strided views; C is row-major with row stride ldc. Two arithmetic kinds:
//   f32:  fp32 products, fp32 sums (FMA)
//   bf16: operands rounded to bf16 (exact for values that already are bf16), their exact
//         products summed into fp32: in pairs by vdpbf16ps on AVX-512 BF16 CPUs (k runs in
//         pairs, an odd K padded with 0), else one FMA per product.
// Every C element is summed in the same k order whatever the thread count, so results are
// bit-for-bit reproducible on a given CPU (but see library_dx below). The products run on the best
// kernel set the CPU has (avx512 > avx2), checked at run time; TQ_CPU=avx2 caps it at AVX2,
// TQ_CPU=generic turns them off (then own_kernels() is false and callers take OpenBLAS).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tq::cpu {

struct View {
  const void* p;
  bool bf16;       // element storage: bf16 bits (uint16_t) or fp32
  int64_t rs, ks;  // element (row i, k) at p[i * rs + k * ks]
};

// How C is stored: fp32; fp32 rounded to bf16 (to nearest even), as round_bf16_inplace after the
// product would leave it (bf16 runs' layer outputs held in fp32); or as bf16 bits (C is then a
// uint16_t array, ldc in its elements; the bf16 kind only, without accumulate or alpha).
enum class Store { f32, round, bf16 };

using GemmFn = void (*)(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
                        bool accumulate, float alpha, Store store);
using GemmSgdFn = void (*)(int64_t M, int64_t N, int64_t K, View A, View B, uint16_t* W,
                           int64_t ldw, float lr);
using GemmDxSgdFn = void (*)(int64_t M, int64_t OC, int64_t IC, const float* dout, const float* x,
                             float* W, float* dx, float lr);
using GemmDxSgd16Fn = void (*)(int64_t M, int64_t OC, int64_t IC, View dout, View doutT, View x,
                               uint16_t* W, void* dx, Store st, float lr);
// QK-norm and RoPE taken into attention (attention_qkn_* in cpu/layers.h). The drivers then
// read the fused projection in place of q, k and v (and write its gradient in place of dq, dk
// and dv), and ask layers.cpp for each head's rows: normalized and rotated as they are needed,
// into the task's buffer, by the row code of qk_norm_rope_* (so the same values).
struct QkNorm {
  const void* qkv;  // [B*T, (H + 2 KVH) D]; per kv head g of a row [G query heads | key | value]
  void* dqkv;       // backward: its gradient, overwritten (both in the activations' storage)
  const float *qw, *kw, *cos, *sin;
  const int32_t* doc;    // null, or block-causal: [B*T], rows at positions t - doc (ops.h)
  float *qrstd, *krstd;  // [B*T, H], [B*T, KVH]: the forward stores them, the backward reads
  float* dw;             // backward: [B * KVH][2 D] per task (q_norm's, then k_norm's) added into
  int64_t T, H, KVH, D;
  double eps;
  bool rnd;  // bf16 runs: rounded where qk_norm_rope_* round
  // Rows t0..t0+n-1 of sequence b's head h (h < H: query head h; H + g: kv head g's key),
  // into dst [n][D] in the activations' storage (rstd computed and stored when `fresh`, else
  // read)
  void (*rows)(const QkNorm&, void* dst, int64_t b, int64_t h, int64_t t0, int64_t n, bool fresh);
  // Their backward: g [n][D], the values attention's dq or dk rows would hold, into dqkv's rows;
  // the norm weight's gradient added into dw [D], row after row
  void (*grads)(const QkNorm&, const float* g, int64_t b, int64_t h, int64_t t0, int64_t n,
                float* dw);
  int64_t R() const { return (H + 2 * KVH) * D; }  // elements of a qkv row
  // Where row t of sequence b's head h lies in qkv: h < H a query head, H + g kv head g's key,
  // H + KVH + g its value
  int64_t at(int64_t b, int64_t h, int64_t t) const {
    const int64_t G = H / KVH;
    int64_t g = h / G, i = h % G;                                // a query head
    if (h >= H) g = (h - H) % KVH, i = h < H + KVH ? G : G + 1;  // a key, a value
    return (b * T + t) * R() + (g * (G + 2) + i) * D;
  }
};

// qn null: q, k, v (dq, dk, dv) as given; else they are null and qn says where the rows are.
// doc: null (causal), or block-causal: query t of a row sees keys doc[t]..t (model/ops.h).
using AttnFwdFn = void (*)(float* out, float* lse, const float* q, const float* k, const float* v,
                           int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                           const int32_t* doc, const QkNorm* qn);
using AttnBwdFn = void (*)(float* dq, float* dk, float* dv, const float* dout, const float* out,
                           const float* lse, const float* q, const float* k, const float* v,
                           int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                           const int32_t* doc, const QkNorm* qn);
// What attention's forward saves for its backward besides each query's log-sum-exp: the
// probabilities P it made, which the backward then reads instead of recomputing the scores
// and their exps (a W2 layer's backward -17 %, forward +6 %). P grows with T^2, so it is
// saved only where it takes no more room than the layer's q, k, v and attention output
// (saves(): T up to 752 at H = 16, KVH = 8, D = 128; 17.0 MiB a W2 layer in fp32, 8.5 in
// bf16); longer sequences recompute it from the log-sum-exps. The stats buffer (the kernels'
// `lse`) holds lse [B, H, T], then from the next 64-byte boundary P: per (sequence, head) its
// blocks of kAttnQB queries one after another; in the block at q0 of nq queries, row j (each
// key j < q0 + nq) holds P(query q0 + c, key j) for c in [first(j, q0), nq) (0 where masked),
// with room for a multiple of 16: fp32, or bf16 bits for the bf16 kind. Block-causal attention
// writes (and its backward reads) only the rows from the block's first visible key on.
constexpr int64_t kAttnQB = 96;  // queries per block: a multiple of every kernel's MR and NR
class AttnProbs {
 public:
  explicit AttnProbs(int64_t T);
  static int64_t first(int64_t j, int64_t q0) { return j > q0 ? (j - q0) / 16 * 16 : 0; }
  // row j of the block at q0, in elements from the start of its head's P
  int64_t row(int64_t q0, int64_t j) const;
  int64_t per_head() const { return base_.back(); }
  bool saves(int64_t H, int64_t KVH, int64_t D) const;
  // floats of a stats buffer (bf16: the bf16 kind's), and where its P starts
  static int64_t stats_floats(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, bool bf16);
  static void* probs(const float* stats, int64_t B, int64_t T, int64_t H);

 private:
  int64_t T_;
  std::vector<int64_t> base_;  // each block's first element, then the total
};

struct GemmSet {
  const char* name;  // "avx512_bf16", "avx512", "avx2"
  GemmFn f32, bf16;
  GemmFn gemv_f32, gemv_bf16;  // the GEMV path (below): only where gemv_fits says so
  GemmSgdFn bf16_sgd;
  GemmDxSgdFn f32_dx_sgd;     // gemm_f32_dx_sgd
  GemmDxSgd16Fn bf16_dx_sgd;  // gemm_bf16_dx_sgd
  // causal or block-causal attention (cpu/attention_driver.h): [0] f32, [1] bf16 kind, [2] bf16
  // kind with its activations (q, k, v, out and their gradients) in bf16 storage (the pointers
  // hold uint16_t)
  AttnFwdFn attn_fwd[3];
  AttnBwdFn attn_bwd[3];
};
enum class Isa { avx2, avx512 };
// The set of one instruction set, or nullptr when this CPU cannot run it (tests run each
// that can). avx512 without BF16 does its bf16 kind with the avx2 kernels.
const GemmSet* gemm_set(Isa isa);

// Whether a product whose block of A serves at most 256 columns reads that A in place instead
// of packing it (gemm_driver.h). The tile's `rows` rows of A lie a multiple of 4 KiB apart, so
// their lines share one L1d set with the lines a B panel of `panel_bytes` leaves there: in
// place only where both fit the L1d's ways (from sysconf), else the rows evict each other.
// force_narrow_a_in_place(true) makes it always so (tests); false: by the L1d again.
bool narrow_a_in_place(int rows, int64_t panel_bytes);
void force_narrow_a_in_place(bool on);
// The rule itself, for an L1d of l1_bytes in l1_ways ways (either <= 0: unknown, so false).
bool narrow_fits_l1(int rows, int64_t panel_bytes, int64_t l1_bytes, int64_t l1_ways);

bool own_kernels();  // the products below may be called (some set is usable)
// Whether gemm_f32_dx_sgd takes dx = dout W of at least kLibraryDxRows tokens from oneDNN's
// sgemm: where the AVX-512 set is in use, oneDNN (libdnnl.so.2 or .3) is installed and TQ_DNNL
// is not "off". Its packing reads dout in place and measured 5-15 % faster than our kernels
// on the W2 dx shapes (a W2 fp32 step -2.7 %; docs/performance.md). Those dx are then
// reproducible bit for bit at a given thread count only (they sum by oneDNN's blocking); the
// SGD step after them stays ours.
constexpr int64_t kLibraryDxRows = 160;
bool library_dx();
// Row-major C = alpha op(A) op(B) + beta C, 0 on success: dnnl_sgemm's signature.
using Sgemm = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                      float* C, int64_t ldc);
// Tests: fn takes the library's place (nullptr: none); returns what was there. A failing fn
// feeds gemm_f32_dx_sgd's fallback (one warning, then dx and the step on our kernels).
Sgemm swap_library_sgemm(Sgemm fn);
const char* kernels_name();  // for the device line: "avx2 kernels", ..., "OpenBLAS kernels"

// The GEMV path: products of at most kGemvRows rows of A (decoding: one new token per sequence)
// against weights B whose rows are contiguous (B.ks == 1; B = W [OC, IC] in the kind's storage:
// fp32 for the f32 kind, bf16 for the bf16 kind), A's rows contiguous (either storage). Such a
// product is bound by reading W once; the packed path (gemm_skinny at these rows) sums tiles of
// 32 (AVX-512) or 16 (AVX2) rows of A whatever rows A has. Here each W row is read once and summed
// against every row of A (in L1), the threads taking contiguous bands of W's rows. Each C element
// is one accumulator of vector lanes over k in order, its lanes then added in a fixed tree (the
// bf16 kind on AVX-512 BF16: vdpbf16ps pairs, as the packed kernels; else one FMA per product):
// the same bits whatever the thread count and whatever the other rows of A, but not the packed
// path's bits. gemm_f32 / gemm_bf16 take it where gemv_fits says so, the kernel sets' packed
// products (f32, bf16) everywhere else. Qwen3 0.6B's bf16 weights on the Zen 5 VM's 2 threads
// (bench/gemv.cpp): 1 row read W at 43-52 GB/s, 8 rows at 30-37, against a read bandwidth of
// 62-80 GB/s (tq_peak --read) and 12-21 GB/s for the packed path, whatever M up to 8 (the GEMV
// 2-4x faster). 8 rows: the most beside which the AVX-512 kernel keeps 3 rows of W in
// registers; the AVX2 set (16 ymm), FMA-bound from 3 rows, still read W 1.4x as fast as its
// packed path at 8.
constexpr int64_t kGemvRows = 8;
bool gemv_fits(bool bf16_kind, int64_t M, int64_t N, int64_t K, const View& A, const View& B);

// With accumulate and alpha != 1, each C element is fma(sum, alpha, C): one rounding.
void gemm_f32(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
              bool accumulate, float alpha = 1.0f, Store store = Store::f32);
void gemm_bf16(int64_t M, int64_t N, int64_t K, View A, View B, void* C, int64_t ldc,
               bool accumulate, float alpha = 1.0f, Store store = Store::f32);

// The optimizer step fused into the weight-gradient product (no gradient is kept):
// W[M, N] (bf16) <- bf16(W + bf16(bf16(-lr) * bf16(sum_k A B))), the optax bf16 SGD step of
// sgd_update_bf16. (fp32 SGD is gemm_f32(..., W, ldw, true, -lr): W = fma(sum, -lr, W).)
void gemm_bf16_sgd(int64_t M, int64_t N, int64_t K, View A, View B, uint16_t* W, int64_t ldw,
                   float lr);

// The backward of out = x Wᵀ (W[OC, IC], M tokens) with the SGD step fused, as two products
// (taken in one pass over W where that is faster, with the same bits):
//   fp32: dx[M, IC] = dout W, then W = fma(sum, -lr, W) over doutᵀ x (gemm_f32 for dx, then for
//         W with accumulate and alpha -lr);
//   bf16 kind: dx = dout W stored as st says (dx: uint16_t for Store::bf16), then
//         gemm_bf16_sgd(OC, IC, M, doutT, x, W, IC, lr). dout: [M, OC], doutT the same as
//         [OC, M]; x: [IC, M] (x's columns as rows).
void gemm_f32_dx_sgd(int64_t M, int64_t OC, int64_t IC, const float* dout, const float* x, float* W,
                     float* dx, float lr);
void gemm_bf16_dx_sgd(int64_t M, int64_t OC, int64_t IC, View dout, View doutT, View x, uint16_t* W,
                      void* dx, Store st, float lr);

// Attention of cpu/layers.h on these kernels (bf16: the bf16 kind's products, P and dS
// rounded to bf16 as they are made, and out, dq, dk, dv stored rounded to bf16; h16: with
// every activation in bf16 storage, GemmSet::attn_fwd[2]). lse: a stats buffer (AttnProbs).
// doc: null (causal) or block-causal (model/ops.h).
void attention_forward_kernels(bool bf16, bool h16, float* out, float* lse, const float* q,
                               const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                               int64_t KVH, int64_t D, const int32_t* doc = nullptr,
                               const QkNorm* qn = nullptr);
void attention_backward_kernels(bool bf16, bool h16, float* dq, float* dk, float* dv,
                                const float* dout, const float* out, const float* lse,
                                const float* q, const float* k, const float* v, int64_t B,
                                int64_t T, int64_t H, int64_t KVH, int64_t D,
                                const int32_t* doc = nullptr, const QkNorm* qn = nullptr);

// The per-instruction-set kernels behind gemm_set (gemm_avx512.cpp, gemm_avx2.cpp): compiled
// for those instructions, they fault on CPUs without them.
namespace avx512 {
extern const GemmSet kernels;
}
namespace avx2 {
extern const GemmSet kernels;
}

}  // namespace tq::cpu
