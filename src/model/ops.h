// A backend is this table of kernels plus memory functions. The model code (qwen3.cpp) is
// written once against it; pointers are the backend's own (host for the CPU backend).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tq {

// An activation of a bf16 run as the bf16 products and kernels take it: bf16 values held as
// fp32 (bf16 false), or bf16 bits (bf16 storage, half the bytes). Inputs are only read.
struct Act {
  void* p;
  bool bf16 = false;
};

// One optimizer step's scalars, computed once a step in double and used as fp32
// (train/optimizer.h: optimizer_scalars).
struct OptimizerStep {
  bool adamw;    // else SGD: p -= lr * g
  float gscale;  // the gradient is scaled by this first (clipping; 1: unclipped)
  float lr;      // SGD's
  float decay, w1, b2, w2, step_size, bc2_sqrt, eps;  // AdamW's (train/optimizer.h)
};

struct Ops {
  std::string name;
  // memory (bytes)
  void* (*alloc)(size_t bytes);  // zeroed
  void (*release)(void* p);
  void (*zero)(void* p, size_t bytes);
  void (*copy)(float* dst, const float* src, int64_t n);        // within the backend
  void (*upload)(void* dst, const void* host, size_t bytes);    // host -> backend
  void (*download)(void* host, const void* src, size_t bytes);  // backend -> host
  // bf16 storage: dst = float(src); dst += src with the sum rounded to bf16
  void (*bf16_to_f32)(float* dst, const uint16_t* src, int64_t n);
  void (*bf16_accumulate)(uint16_t* dst, const float* src, int64_t n);
  // layers: see src/ref/layers.h for the contract
  void (*embedding_forward)(float*, const int32_t*, const float*, int64_t, int64_t);
  void (*embedding_backward)(float*, const float*, const int32_t*, int64_t, int64_t);
  // Optional (null: the model widens the whole table with bf16_to_f32 first): embedding_forward
  // from a bf16 table, widening just the rows it gathers (a 0.6B table is 155M entries).
  void (*embedding_forward_bf16)(float*, const int32_t*, const uint16_t*, int64_t, int64_t);
  // Optional (null: embedding_backward into a zeroed fp32 table, then bf16_accumulate):
  // embedding_backward into a bf16 gradient (dE, dout, tokens, N, C), touching only the rows of
  // the tokens: each takes the fp32 sum of its rows of dout in token order, added with one
  // rounding -- that composition's bits (on the other rows it adds +0, which could change
  // only a -0 entry, and gradients are never -0: sums start from +0).
  void (*embedding_backward_bf16)(uint16_t*, const float*, const int32_t*, int64_t, int64_t);
  void (*rmsnorm_forward)(float*, float*, const float*, const float*, int64_t, int64_t, double);
  void (*rmsnorm_backward)(float*, float*, const float*, const float*, const float*, const float*,
                           int64_t, int64_t);
  void (*matmul_forward)(float*, const float*, const float*, int64_t, int64_t, int64_t);
  void (*matmul_backward)(float*, float*, const float*, const float*, const float*, int64_t,
                          int64_t, int64_t);
  // Optional (null: widen the weight with bf16_to_f32 and use matmul_*): the same products
  // with the weight in bf16 storage, for bf16 runs; x and dout hold bf16 values, and out and
  // dx are stored rounded to bf16 (the model rounds them itself after the fallback), each in
  // the storage its Act says.
  void (*matmul_forward_bf16w)(Act, Act, const uint16_t*, int64_t, int64_t, int64_t);
  void (*matmul_backward_bf16w)(Act, float*, Act, Act, const uint16_t*, int64_t, int64_t, int64_t);
  // Optional (null: matmul_backward_bf16w into a zeroed fp32 buffer, then bf16_accumulate):
  // matmul_backward_bf16w whose weight gradient is stored rounded to bf16 into a bf16
  // gradient, overwriting it: for a gradient's first contribution, with the bits of adding it
  // into a zeroed one. bf16 runs then hold no fp32 gradient as large as a weight (a tied 0.6B
  // table: 622 MB, zeroed and added twice a step).
  void (*matmul_backward_bf16g)(Act, uint16_t*, Act, Act, const uint16_t*, int64_t, int64_t,
                                int64_t);
  // Optional (null: matmul_backward + sgd_update_*): matmul_backward whose weight takes its
  // SGD step inside the weight-gradient product, for weights with one gradient contribution.
  // dx uses the weight before the step (the bf16w one stores it rounded to bf16); no gradient
  // is written.
  void (*matmul_backward_sgd)(float*, float*, const float*, const float*, int64_t, int64_t, int64_t,
                              float);
  void (*matmul_backward_sgd_bf16w)(Act, uint16_t*, Act, Act, int64_t, int64_t, int64_t, float);
  void (*qkv_split_forward)(float*, float*, float*, const float*, int64_t, int64_t, int64_t,
                            int64_t);
  void (*qkv_split_backward)(float*, const float*, const float*, const float*, int64_t, int64_t,
                             int64_t, int64_t);
  // Attention's mask and RoPE's positions: the last argument of rope_*, qk_norm_rope_* and
  // attention_*, doc [B*T] in the backend's memory, is null for causal attention (query t sees
  // keys 0..t of its row, at position t), or block-causal (Batch::doc_start, model/qwen3.h):
  // query t sees keys doc[t]..t, the start of its document on, and its position is t - doc[t].
  void (*rope_forward)(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                       int64_t, const int32_t*);
  void (*rope_backward)(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                        int64_t, const int32_t*);
  // Optional (null: the model runs qkv_split, rmsnorm with q_norm / k_norm and rope, rounding
  // to bf16 after each in bf16 runs): all of that in one pass over the fused projection
  // qkv [N, QKV], rnd doing those roundings, h16 (bf16 runs, see swiglu_forward_bf16) with
  // every activation (qkv, q, k, v and their gradients) in bf16 storage:
  // forward (q, k, v, qrstd, krstd, qkv, qw, kw, cos, sin, B, T, H, KVH, D, eps, rnd, h16, doc);
  // backward (dqkv, dqw, dkw, dq, dk, dv, qkv, qrstd, krstd, qw, kw, cos, sin, B, T, H, KVH, D,
  // rnd, h16, doc) overwrites dqkv and adds into dqw, dkw.
  void (*qk_norm_rope_forward)(float*, float*, float*, float*, float*, const float*, const float*,
                               const float*, const float*, const float*, int64_t, int64_t, int64_t,
                               int64_t, int64_t, double, bool, bool, const int32_t*);
  void (*qk_norm_rope_backward)(float*, float*, float*, const float*, const float*, const float*,
                                const float*, const float*, const float*, const float*,
                                const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, bool, bool, const int32_t*);
  // (out, stats, q, k, v, B, T, H, KVH, D, doc) and (dq, dk, dv, dout, out, stats, q, k, v, ...):
  // stats holds what the forward saves for the backward, attention_stats floats (below).
  void (*attention_forward)(float*, float*, const float*, const float*, const float*, int64_t,
                            int64_t, int64_t, int64_t, int64_t, const int32_t*);
  void (*attention_backward)(float*, float*, float*, const float*, const float*, const float*,
                             const float*, const float*, const float*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, const int32_t*);
  // Optional (null: attention_*): attention with bf16 products, for bf16 runs; out, dq, dk, dv
  // stored rounded to bf16; the last flag (h16): q, k, v, out and their gradients in bf16
  // storage
  void (*attention_forward_bf16)(float*, float*, const float*, const float*, const float*, int64_t,
                                 int64_t, int64_t, int64_t, int64_t, bool, const int32_t*);
  void (*attention_backward_bf16)(float*, float*, float*, const float*, const float*, const float*,
                                  const float*, const float*, const float*, int64_t, int64_t,
                                  int64_t, int64_t, int64_t, bool, const int32_t*);
  // Optional (null: B * H * T, each query's log-sum-exp): floats of attention's stats at (B, T,
  // H, KVH, D), for attention_*_bf16 where the flag is set, else attention_* (the CPU's also
  // keeps the probabilities where they are small enough, so that the backward need not
  // recompute them)
  int64_t (*attention_stats)(int64_t, int64_t, int64_t, int64_t, int64_t, bool);
  // Optional (null: qk_norm_rope_* or the model's composition, then attention_*): the two in
  // one, attention reading the fused projection in place of q, k, v and writing its gradient
  // in place of dq, dk, dv, so that no q, k, v or gradients of them are kept:
  // forward (out, stats, qrstd, krstd, qkv, qw, kw, cos, sin, B, T, H, KVH, D, eps, bf16, h16,
  // doc); backward (dqkv, dqw, dkw, dout, out, stats, qkv, qrstd, krstd, qw, kw, cos, sin, B, T,
  // H, KVH, D, bf16, h16, doc), adding into dqw, dkw. bf16: a bf16 run's (attention_*_bf16, and the
  // roundings of qk_norm_rope_*); h16 as there.
  void (*attention_qkn_forward)(float*, float*, float*, float*, const float*, const float*,
                                const float*, const float*, const float*, int64_t, int64_t, int64_t,
                                int64_t, int64_t, double, bool, bool, const int32_t*);
  void (*attention_qkn_backward)(float*, float*, float*, const float*, const float*, const float*,
                                 const float*, const float*, const float*, const float*,
                                 const float*, const float*, const float*, int64_t, int64_t,
                                 int64_t, int64_t, int64_t, bool, bool, const int32_t*);
  // Generation's attention over a KV cache (model/qwen3.h: Qwen3::decode), one query per
  // sequence: (out, q, kc, vc, len, B, H, KVH, D, Tc, bf16, h16). q [B, H, D]; kc, vc
  // [B, Tc, KVH, D] the cache, of which query b sees rows 0..len[b]-1 (len [B] in the backend's
  // memory, 1 <= len[b] <= Tc); out [B, H, D]. Scores, softmax and sums in fp32; bf16: out
  // stored rounded to bf16; h16: q, kc, vc and out in bf16 storage.
  void (*attention_decode)(float*, const float*, const float*, const float*, const int32_t*,
                           int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool);
  // the last flag: store the output rounded to bf16 (bf16 runs)
  void (*swiglu_forward)(float*, const float*, int64_t, int64_t, bool);
  void (*swiglu_backward)(float*, const float*, const float*, int64_t, int64_t, bool);
  // Optional (null: the model keeps SwiGLU's input and output in fp32 storage): the same for
  // bf16 runs with them in bf16 storage (so are their gradients); results rounded to bf16.
  // With these, the bf16w products, qk_norm_rope_* and attention_*_bf16, a bf16 run keeps its
  // activations in bf16 storage: the feed-forward block's (ab, m and their gradients, the
  // largest) and the attention block's (qkv, q, k, v, the attention output and their
  // gradients); the norms and the residual stream stay fp32 storage.
  void (*swiglu_forward_bf16)(uint16_t*, const uint16_t*, int64_t, int64_t);
  void (*swiglu_backward_bf16)(uint16_t*, const uint16_t*, const uint16_t*, int64_t, int64_t);
  double (*crossentropy_forward)(float*, const float*, const int32_t*, int64_t, int64_t);
  void (*crossentropy_backward)(float*, const float*, const float*, const int32_t*, int64_t,
                                int64_t, double);
  void (*add_inplace)(float*, const float*, int64_t);
  void (*round_bf16_inplace)(float*, int64_t);
  // Optional (null: copy, add_inplace and rmsnorm_forward; rmsnorm_backward and add_inplace;
  // with round_bf16_inplace after each where rnd): the residual add and the RMSNorm after it
  // in one pass over each row, with those bits:
  // forward (y, out, rstd, a, b, w, N, C, eps, rnd): y = a + b, out = RMSNorm(y);
  // backward (dy, dw, dout, x, rstd, w, N, C, rnd): dy += RMSNorm's input gradient, adding
  // into dw as rmsnorm_backward does.
  void (*add_rmsnorm_forward)(float*, float*, float*, const float*, const float*, const float*,
                              int64_t, int64_t, double, bool);
  void (*rmsnorm_backward_add)(float*, float*, const float*, const float*, const float*,
                               const float*, int64_t, int64_t, bool);
  // w -= lr * g over fp32 arrays, or, for bf16 arrays, as optax computes it in bf16
  void (*sgd_update_f32)(float* w, const float* g, int64_t n, float lr);
  void (*sgd_update_bf16)(uint16_t* w, const uint16_t* g, int64_t n, float lr);
  // The text trainer's optimizer over fp32 arrays of n (train/optimizer.h has the math):
  // scale_sum_squares(g, n, s): g *= s (skipped when s is 1), then the sum of g's squares in
  // double, over chunks of kNormChunk values summed in chunk order (the same bits at any
  // thread count);
  // optimizer_step(p, m, v, g, n, step, params, bf16): p (and AdamW's m, v) take the step,
  // and the new p is also written to the model's parameter arena `params`, rounded to bf16
  // (round to nearest even) where bf16.
  double (*scale_sum_squares)(float* g, int64_t n, float s);
  void (*optimizer_step)(float* p, float* m, float* v, const float* g, int64_t n,
                         const OptimizerStep& step, void* params, bool bf16);
  // Waits for the work queued so far (a device backend runs kernels asynchronously) and
  // reports its errors; a no-op on the CPU. Step timings and the profiler call it.
  void (*sync)();
};

constexpr int64_t kNormChunk = 65536;

const Ops& cpu_ops();

}  // namespace tq
