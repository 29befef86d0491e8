// Fast CPU tier: fp32 storage and arithmetic, our packed products (or BLAS) for matmuls,
// OpenMP for the rest.
// Same functions, arguments and contract as the reference tier (src/ref/layers.h):
// backward overwrites activation gradients and adds into parameter gradients.
#pragma once
#include <cstdint>

#include "model/ops.h"  // Act

namespace tq::cpu {

void set_threads(int n);       // OpenMP and BLAS
float exp_for_tests(float x);  // the vectorizable exp the softmaxes and SwiGLU use
float lane_sum_for_tests(const float* x, int64_t n);  // lane_sum (cpu/vmath.h) of x[0..n)
float lane_max_for_tests(const float* x, int64_t n);  // lane_max (cpu/vmath.h) of x[0..n)
// One head's n QK-norm + RoPE rows at D = 128 as attention_qkn_* makes them and turns them
// back: by the AVX-512 row code (fast; false where this build has none) or by the generic one.
// Rows R elements apart in `in` and the gradient's `out` (bf16 bits where h16), contiguous in
// the rows' `out`; rstd computed (fresh) or read; cos, sin [n][64]; dw [128] added into.
bool qk_rows_for_tests(bool fast, bool h16, void* out, const void* in, int64_t R, float* rstd,
                       bool fresh, const float* w, const float* cos, const float* sin, int64_t n,
                       bool rnd);
bool qk_grads_for_tests(bool fast, bool h16, void* out, const void* in, int64_t R, const float* g,
                        const float* rstd, const float* w, const float* cos, const float* sin,
                        int64_t n, bool rnd, float* dw);
int threads();
// The CPUs this process may run on (the CLI's threads unless told): its affinity mask (taskset, a
// container's cpuset), capped by the cgroup v2 CPU quotas over it (docker --cpus). More threads
// than that take turns on the same cores, and each product waits for its slowest band.
int available_cpus();
// n capped by the quota of a cgroup v2 `cpu.max` line ("max 100000", "150000 100000": 2)
int cpus_in_quota(const char* cpu_max, int n);

void embedding_forward(float* out, const int32_t* tokens, const float* E, int64_t N, int64_t C);
void embedding_backward(float* dE, const float* dout, const int32_t* tokens, int64_t N, int64_t C);
// embedding_forward from a bf16 table E [V, C]: each gathered row widened exactly
void embedding_forward_bf16(float* out, const int32_t* tokens, const uint16_t* E, int64_t N,
                            int64_t C);
// embedding_backward into a bf16 gradient dE [V, C]: each row a token hits takes the fp32 sum
// of its dout rows (in token order) with one rounding; other rows are left as they are
void embedding_backward_bf16(uint16_t* dE, const float* dout, const int32_t* tokens, int64_t N,
                             int64_t C);
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     double eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* rstd,
                      const float* w, int64_t N, int64_t C);
void matmul_forward(float* out, const float* x, const float* W, int64_t N, int64_t IC, int64_t OC);
void matmul_backward(float* dx, float* dW, const float* dout, const float* x, const float* W,
                     int64_t N, int64_t IC, int64_t OC);
// bf16 weights (x, dout bf16 values), out and dx stored rounded to bf16 (bf16 runs' layer
// outputs), each activation in fp32 or bf16 storage as its Act says; only where own_kernels()
// (gemm.h)
void matmul_forward_bf16w(Act out, Act x, const uint16_t* W, int64_t N, int64_t IC, int64_t OC);
void matmul_backward_bf16w(Act dx, float* dW, Act dout, Act x, const uint16_t* W, int64_t N,
                           int64_t IC, int64_t OC);
// the same with dW a bf16 gradient, overwritten by the weight gradient rounded to bf16
void matmul_backward_bf16g(Act dx, uint16_t* dW, Act dout, Act x, const uint16_t* W, int64_t N,
                           int64_t IC, int64_t OC);
// matmul_backward with the SGD step of W fused into its weight-gradient product (no dW; the
// bf16w one stores dx rounded to bf16): only where own_kernels() (gemm.h)
void matmul_backward_sgd(float* dx, float* W, const float* dout, const float* x, int64_t N,
                         int64_t IC, int64_t OC, float lr);
void matmul_backward_sgd_bf16w(Act dx, uint16_t* W, Act dout, Act x, int64_t N, int64_t IC,
                               int64_t OC, float lr);
void qkv_split_forward(float* q, float* k, float* v, const float* qkv, int64_t N, int64_t H,
                       int64_t KVH, int64_t D);
void qkv_split_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t N,
                        int64_t H, int64_t KVH, int64_t D);
// doc (here and below): null for causal attention at positions t, or block-causal [B*T]
// (model/ops.h): the positions t - doc[t]
void rope_forward(float* out, const float* x, const float* cos, const float* sin, int64_t B,
                  int64_t T, int64_t NH, int64_t D, const int32_t* doc = nullptr);
void rope_backward(float* dx, const float* dout, const float* cos, const float* sin, int64_t B,
                   int64_t T, int64_t NH, int64_t D, const int32_t* doc = nullptr);
// qkv_split, rmsnorm (q_norm, k_norm) and rope in one pass (Ops::qk_norm_rope_*); h16: every
// activation (q, k, v, qkv; dqkv, dq, dk, dv) in bf16 storage (the pointers hold uint16_t)
void qk_norm_rope_forward(float* q, float* k, float* v, float* qrstd, float* krstd,
                          const float* qkv, const float* qw, const float* kw, const float* cos,
                          const float* sin, int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                          double eps, bool rnd, bool h16 = false, const int32_t* doc = nullptr);
void qk_norm_rope_backward(float* dqkv, float* dqw, float* dkw, const float* dq, const float* dk,
                           const float* dv, const float* qkv, const float* qrstd,
                           const float* krstd, const float* qw, const float* kw, const float* cos,
                           const float* sin, int64_t B, int64_t T, int64_t H, int64_t KVH,
                           int64_t D, bool rnd, bool h16 = false, const int32_t* doc = nullptr);
// lse: the stats the forward saves for the backward, attention_stats(B, T, H, KVH, D, bf16)
// floats: lse [B, H, T] first (each query's log-sum-exp), then, on our kernels where they are
// small enough, the probabilities (AttnProbs in cpu/gemm.h; bf16: for the *_bf16 functions)
int64_t attention_stats(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, bool bf16);
// (doc: the mask, query t seeing keys doc[t]..t of its row)
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                       const int32_t* doc = nullptr);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t KVH, int64_t D, const int32_t* doc = nullptr);
// The same with bf16 products (P and dS rounded to bf16 as a bf16 PyTorch model does; q, k,
// v, dout hold bf16 values; out, dq, dk, dv stored rounded to bf16; h16: all of them in bf16
// storage, the pointers holding uint16_t): only where own_kernels() (gemm.h)
void attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                            int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                            bool h16 = false, const int32_t* doc = nullptr);
void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                             const float* lse, const float* q, const float* k, const float* v,
                             int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                             bool h16 = false, const int32_t* doc = nullptr);
// qk_norm_rope_* and attention_* (bf16: the *_bf16 ones) in one: attention reads the fused
// projection qkv in place of q, k, v and writes dqkv in place of dq, dk, dv, normalizing and
// rotating each head's rows as it needs them (the values of the two ops, so the same outputs;
// the norm weights' gradients are summed in another order). Only where own_kernels() (gemm.h)
void attention_qkn_forward(float* out, float* stats, float* qrstd, float* krstd, const float* qkv,
                           const float* qw, const float* kw, const float* cos, const float* sin,
                           int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D, double eps,
                           bool bf16, bool h16 = false, const int32_t* doc = nullptr);
void attention_qkn_backward(float* dqkv, float* dqw, float* dkw, const float* dout,
                            const float* out, const float* stats, const float* qkv,
                            const float* qrstd, const float* krstd, const float* qw,
                            const float* kw, const float* cos, const float* sin, int64_t B,
                            int64_t T, int64_t H, int64_t KVH, int64_t D, bool bf16,
                            bool h16 = false, const int32_t* doc = nullptr);
// Generation's attention over a KV cache (Ops::attention_decode): q [B, H, D], the cache kc, vc
// [B, Tc, KVH, D] of which query b sees rows 0..len[b]-1, out [B, H, D] (rounded to bf16 where
// bf16); h16: all in bf16 storage (the pointers hold uint16_t)
void attention_decode(float* out, const float* q, const float* kc, const float* vc,
                      const int32_t* len, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t Tc,
                      bool bf16, bool h16);
// rnd: the output stored rounded to bf16 (bf16 runs)
void swiglu_forward(float* out, const float* ab, int64_t N, int64_t F, bool rnd);
void swiglu_backward(float* dab, const float* dout, const float* ab, int64_t N, int64_t F,
                     bool rnd);
// The same (rounded) in bf16 storage: out[N, F], ab[N, 2F], dab[N, 2F], dout[N, F]
void swiglu_forward_bf16(uint16_t* out, const uint16_t* ab, int64_t N, int64_t F);
void swiglu_backward_bf16(uint16_t* dab, const uint16_t* dout, const uint16_t* ab, int64_t N,
                          int64_t F);
double crossentropy_forward(float* lse, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V);
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V, double scale);

// Elementwise helpers used by the model.
void add_inplace(float* y, const float* x, int64_t n);  // y += x
void round_bf16_inplace(float* x, int64_t n);           // x = bf16(x), stored as fp32
// The residual add and the RMSNorm after it in one pass (model/ops.h): y[N, C] = a + b (y may
// be a), out[N, C] = RMSNorm(y), rstd[N]; and dy[N, C] += the norm's input gradient, dw[C]
// added into; each value rounded to bf16 where rnd, as the separate passes would.
void add_rmsnorm_forward(float* y, float* out, float* rstd, const float* a, const float* b,
                         const float* w, int64_t N, int64_t C, double eps, bool rnd);
void rmsnorm_backward_add(float* dy, float* dw, const float* dout, const float* x,
                          const float* rstd, const float* w, int64_t N, int64_t C, bool rnd);

}  // namespace tq::cpu
