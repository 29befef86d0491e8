// The CUDA backend: model/ops.h's kernel table on one GPU, same contract as src/ref/layers.h
// (backward overwrites activation gradients and adds into parameter gradients). Matmuls are
// cuBLAS sgemm with TF32 off (fp32 parity with the CPU); everything else is ours, one simple
// kernel per layer, deterministic (no atomics: every sum has a fixed order), all enqueued on
// the default stream. The optional bf16-weight and fused-SGD products are left out: the model
// then widens bf16 weights and steps after backward.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/common.h"
#include "cuda/ops.h"

namespace tq {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLAS: ") + what + ": status " + std::to_string(int(s)));
}
#define LAUNCHED(name) check(cudaGetLastError(), name)

constexpr int kThreads = 256;
inline int blocks(int64_t n, int per = kThreads) {
  const int64_t b = (n + per - 1) / per;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);  // grid-stride loops do the rest
}
#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t x;
    check(cublasCreate(&x), "create");
    check(cublasSetMathMode(x, CUBLAS_DEFAULT_MATH), "math mode");  // no TF32
    return x;
  }();
  return h;
}

// Grow-only device scratch for the kernels' own temporaries (reduction partials, per-row
// losses): sized on the first step, never inside later ones.
struct Scratch {
  void* p = nullptr;
  size_t cap = 0;
  template <typename T>
  T* get(size_t n) {
    if (n * sizeof(T) > cap) {
      check(cudaDeviceSynchronize(), "kernels");  // queued kernels may still read the old one
      if (p) check(cudaFree(p), "free scratch");
      cap = n * sizeof(T) + n * sizeof(T) / 4;
      check(cudaMalloc(&p, cap), "scratch");
    }
    return static_cast<T*>(p);
  }
};
Scratch& scratch(int which) {
  static Scratch s[3];
  return s[which];
}

// ---- bf16 (the CPU's rules: round to nearest even, NaN stays NaN) ----
__device__ inline uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ inline float from_bf16(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
__device__ inline float round_bf(float f) {
  return from_bf16(to_bf16(f));
}

// ---- block reductions (fixed order: deterministic) ----
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread gets the block's sum / max; `red` is 32 floats of shared memory.
template <bool MAX>
__device__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  __syncthreads();  // the previous reduction's readers are done with red
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = red[0];
  for (int w = 1; w < nw; ++w) t = MAX ? fmaxf(t, red[w]) : t + red[w];
  return t;
}
__device__ float block_sum(float v, float* red) {
  return block_reduce<false>(v, red);
}
__device__ float block_max(float v, float* red) {
  return block_reduce<true>(v, red);
}

// ---- memory ----
void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes ? bytes : 1), "allocate device memory");
  check(cudaMemset(p, 0, bytes ? bytes : 1), "zero device memory");
  return p;
}
void dev_release(void* p) {
  if (p) cudaFree(p);
}
void dev_zero(void* p, size_t bytes) {
  check(cudaMemsetAsync(p, 0, bytes), "memset");
}
void dev_copy(float* d, const float* s, int64_t n) {
  check(cudaMemcpyAsync(d, s, size_t(n) * 4, cudaMemcpyDeviceToDevice), "copy");
}
void dev_upload(void* d, const void* host, size_t bytes) {
  check(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), "upload");
}
void dev_download(void* host, const void* s, size_t bytes) {
  check(cudaMemcpy(host, s, bytes, cudaMemcpyDeviceToHost), "download");
}

// ---- elementwise ----
__global__ void k_widen(float* d, const uint16_t* s, int64_t n) {
  GRID_STRIDE(i, n) d[i] = from_bf16(s[i]);
}
void widen(float* d, const uint16_t* s, int64_t n) {
  k_widen<<<blocks(n), kThreads>>>(d, s, n);
  LAUNCHED("bf16_to_f32");
}
__global__ void k_acc_bf16(uint16_t* d, const float* s, int64_t n) {
  GRID_STRIDE(i, n) d[i] = to_bf16(from_bf16(d[i]) + s[i]);
}
void accumulate_bf16(uint16_t* d, const float* s, int64_t n) {
  k_acc_bf16<<<blocks(n), kThreads>>>(d, s, n);
  LAUNCHED("bf16_accumulate");
}
__global__ void k_add(float* y, const float* x, int64_t n) {
  GRID_STRIDE(i, n) y[i] += x[i];
}
void add_inplace(float* y, const float* x, int64_t n) {
  k_add<<<blocks(n), kThreads>>>(y, x, n);
  LAUNCHED("add_inplace");
}
__global__ void k_round(float* x, int64_t n) {
  GRID_STRIDE(i, n) x[i] = round_bf(x[i]);
}
void round_inplace(float* x, int64_t n) {
  k_round<<<blocks(n), kThreads>>>(x, n);
  LAUNCHED("round_bf16_inplace");
}
__global__ void k_sgd_f32(float* w, const float* g, int64_t n, float lr) {
  GRID_STRIDE(i, n) w[i] = fmaf(-lr, g[i], w[i]);  // as the CPU's contracted w -= lr * g
}
void sgd_f32(float* w, const float* g, int64_t n, float lr) {
  k_sgd_f32<<<blocks(n), kThreads>>>(w, g, n, lr);
  LAUNCHED("sgd_update_f32");
}
// optax: p + (-lr * g), every operand and result in bf16 (lr a weak-typed scalar)
__global__ void k_sgd_bf16(uint16_t* w, const uint16_t* g, int64_t n, float step) {
  GRID_STRIDE(i, n) w[i] = to_bf16(from_bf16(w[i]) + round_bf(__fmul_rn(step, from_bf16(g[i]))));
}
void sgd_bf16(uint16_t* w, const uint16_t* g, int64_t n, float lr) {
  const float step = round_bf16(-lr);
  k_sgd_bf16<<<blocks(n), kThreads>>>(w, g, n, step);
  LAUNCHED("sgd_update_bf16");
}

// ---- the text trainer's optimizer (train/optimizer.h) ----
// A block per chunk of kNormChunk values, each thread's share in double, then the block's
// tree in a fixed order; the chunks summed in order on the host: the same bits every run.
__global__ void k_scale_sumsq(float* g, int64_t n, float s, double* part) {
  __shared__ double acc[256];
  const int64_t begin = int64_t(blockIdx.x) * kNormChunk;
  const int64_t end = begin + kNormChunk < n ? begin + kNormChunk : n;
  double sum = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float x = g[i];
    if (s != 1.f) g[i] = x = __fmul_rn(x, s);
    sum += double(x) * double(x);
  }
  acc[threadIdx.x] = sum;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) acc[threadIdx.x] += acc[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = acc[0];
}
double scale_sum_squares(float* g, int64_t n, float s) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  double* part = scratch(2).get<double>(size_t(chunks));
  k_scale_sumsq<<<unsigned(chunks), 256>>>(g, n, s, part);
  LAUNCHED("scale_sum_squares");
  std::vector<double> host(static_cast<size_t>(chunks));
  check(cudaMemcpy(host.data(), part, host.size() * sizeof(double), cudaMemcpyDeviceToHost),
        "scale_sum_squares");
  double total = 0;
  for (double x : host) total += x;
  return total;
}
__global__ void k_optimizer(float* p, float* m, float* v, const float* g, int64_t n,
                            OptimizerStep s, float* pf, uint16_t* ph) {
  GRID_STRIDE(i, n) {
    const float gi = __fmul_rn(g[i], s.gscale);
    float pi;
    if (s.adamw) {
      const float mi = m[i] + s.w1 * (gi - m[i]);
      const float vi = v[i] * s.b2 + s.w2 * gi * gi;
      const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
      m[i] = mi;
      v[i] = vi;
      pi = p[i] * s.decay - s.step_size * (mi / denom);
    } else {
      pi = p[i] - s.lr * gi;
    }
    p[i] = pi;
    if (pf) pf[i] = pi;
    if (ph) ph[i] = to_bf16(pi);
  }
}
void optimizer_step(float* p, float* m, float* v, const float* g, int64_t n, const OptimizerStep& s,
                    void* params, bool bf16) {
  k_optimizer<<<blocks(n), kThreads>>>(p, m, v, g, n, s,
                                       bf16 ? nullptr : static_cast<float*>(params),
                                       bf16 ? static_cast<uint16_t*>(params) : nullptr);
  LAUNCHED("optimizer_step");
}

// ---- embedding ----
__global__ void k_emb_fwd(float* out, const int32_t* tok, const float* E, int64_t N, int64_t C) {
  GRID_STRIDE(i, N * C) out[i] = E[int64_t(tok[i / C]) * C + i % C];
}
void embedding_forward(float* out, const int32_t* tok, const float* E, int64_t N, int64_t C) {
  k_emb_fwd<<<blocks(N * C), kThreads>>>(out, tok, E, N, C);
  LAUNCHED("embedding_forward");
}
// One thread per column, tokens in order (they may repeat): deterministic.
__global__ void k_emb_bwd(float* dE, const float* dout, const int32_t* tok, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t n = 0; n < N; ++n) dE[int64_t(tok[n]) * C + c] += dout[n * C + c];
}
void embedding_backward(float* dE, const float* dout, const int32_t* tok, int64_t N, int64_t C) {
  k_emb_bwd<<<int((C + 127) / 128), 128>>>(dE, dout, tok, N, C);
  LAUNCHED("embedding_backward");
}

// ---- RMSNorm: a block per row ----
__global__ void k_rms_fwd(float* out, float* rstd, const float* x, const float* w, int64_t C,
                          float eps) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / float(C) + eps);
  if (threadIdx.x == 0) rstd[n] = r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = xr[c] * r * w[c];
}
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     double eps) {
  k_rms_fwd<<<int(N), C >= 256 ? 256 : 128>>>(out, rstd, x, w, C, float(eps));
  LAUNCHED("rmsnorm_forward");
}
__global__ void k_rms_bwd_dx(float* dx, const float* dout, const float* x, const float* rstd,
                             const float* w, int64_t C) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  const float *xr = x + n * C, *g = dout + n * C;
  const float r = rstd[n];
  float dot = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += g[c] * w[c] * xr[c];
  dot = block_sum(dot, red) * r;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dx[n * C + c] = r * (g[c] * w[c] - xr[c] * r * dot / float(C));
}
// dw in two fixed-order stages: partial sums over blocks of kRows rows, then over blocks.
constexpr int64_t kRows = 256;
__global__ void k_rms_bwd_dw_part(float* part, const float* dout, const float* x, const float* rstd,
                                  int64_t N, int64_t C) {
  const int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x, r0 = blockIdx.x * kRows;
  if (c >= C) return;
  float s = 0;
  for (int64_t n = r0; n < N && n < r0 + kRows; ++n) s += dout[n * C + c] * x[n * C + c] * rstd[n];
  part[blockIdx.x * C + c] = s;
}
__global__ void k_rms_bwd_dw_sum(float* dw, const float* part, int64_t nb, int64_t C) {
  GRID_STRIDE(c, C) {
    float s = 0;
    for (int64_t b = 0; b < nb; ++b) s += part[b * C + c];
    dw[c] += s;
  }
}
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* rstd,
                      const float* w, int64_t N, int64_t C) {
  k_rms_bwd_dx<<<int(N), C >= 256 ? 256 : 128>>>(dx, dout, x, rstd, w, C);
  LAUNCHED("rmsnorm_backward dx");
  const int64_t nb = (N + kRows - 1) / kRows;
  float* part = scratch(0).get<float>(size_t(nb * C));
  k_rms_bwd_dw_part<<<dim3(unsigned(nb), unsigned((C + 127) / 128)), 128>>>(part, dout, x, rstd, N,
                                                                            C);
  LAUNCHED("rmsnorm_backward dw");
  k_rms_bwd_dw_sum<<<blocks(C), kThreads>>>(dw, part, nb, C);
  LAUNCHED("rmsnorm_backward dw sum");
}

// ---- matmuls (row-major views of cuBLAS's column-major) ----
// out[N, OC] = x[N, IC] W[OC, IC]^T
void matmul_forward(float* out, const float* x, const float* W, int64_t N, int64_t IC, int64_t OC) {
  const float one = 1, zero = 0;
  check(cublasSgemm(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(OC), int(N), int(IC), &one, W, int(IC), x,
                    int(IC), &zero, out, int(OC)),
        "matmul_forward");
}
// dx[N, IC] = dout[N, OC] W;  dW[OC, IC] += dout^T x
void matmul_backward(float* dx, float* dW, const float* dout, const float* x, const float* W,
                     int64_t N, int64_t IC, int64_t OC) {
  const float one = 1, zero = 0;
  check(cublasSgemm(blas(), CUBLAS_OP_N, CUBLAS_OP_N, int(IC), int(N), int(OC), &one, W, int(IC),
                    dout, int(OC), &zero, dx, int(IC)),
        "matmul_backward dx");
  check(cublasSgemm(blas(), CUBLAS_OP_N, CUBLAS_OP_T, int(IC), int(OC), int(N), &one, x, int(IC),
                    dout, int(OC), &one, dW, int(IC)),
        "matmul_backward dW");
}

// ---- fused qkv rows <-> head-major q, k, v ----
__global__ void k_qkv(float* q, float* k, float* v, float* qkv, int64_t N, int64_t H, int64_t KVH,
                      int64_t D, bool back) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
  GRID_STRIDE(i, N * R) {
    const int64_t n = i / R, r = i % R, e = r % D, slot = r / D, g = slot / (G + 2),
                  s = slot % (G + 2);
    float* p =
        s < G ? q + ((n * H + g * G + s) * D + e) : (s == G ? k : v) + ((n * KVH + g) * D + e);
    if (back)
      qkv[i] = *p;
    else
      *p = qkv[i];
  }
}
void qkv_split_forward(float* q, float* k, float* v, const float* qkv, int64_t N, int64_t H,
                       int64_t KVH, int64_t D) {
  k_qkv<<<blocks(N * (H + 2 * KVH) * D), kThreads>>>(q, k, v, const_cast<float*>(qkv), N, H, KVH, D,
                                                     false);
  LAUNCHED("qkv_split_forward");
}
void qkv_split_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t N,
                        int64_t H, int64_t KVH, int64_t D) {
  k_qkv<<<blocks(N * (H + 2 * KVH) * D), kThreads>>>(const_cast<float*>(dq), const_cast<float*>(dk),
                                                     const_cast<float*>(dv), dqkv, N, H, KVH, D,
                                                     true);
  LAUNCHED("qkv_split_backward");
}

// ---- RoPE (rotate half); sign -1 is the backward. out may alias x. Token n = b T + t is at
// position t, or block-causal (doc, model/ops.h) t - doc[n]. ----
__global__ void k_rope(float* out, const float* x, const float* cs, const float* sn, int64_t B,
                       int64_t T, int64_t NH, int64_t D, float sign, const int32_t* doc) {
  const int64_t D2 = D / 2;
  GRID_STRIDE(i, B * T * NH * D2) {
    const int64_t e = i % D2, row = i / D2, n = row / NH, base = row * D;
    const int64_t t = doc ? n % T - doc[n] : n % T;
    const float c = cs[t * D2 + e], s = sign * sn[t * D2 + e];
    const float x1 = x[base + e], x2 = x[base + e + D2];
    out[base + e] = x1 * c - x2 * s;
    out[base + e + D2] = x2 * c + x1 * s;
  }
}
void rope_forward(float* out, const float* x, const float* c, const float* s, int64_t B, int64_t T,
                  int64_t NH, int64_t D, const int32_t* doc) {
  k_rope<<<blocks(B * T * NH * D / 2), kThreads>>>(out, x, c, s, B, T, NH, D, 1.0f, doc);
  LAUNCHED("rope_forward");
}
void rope_backward(float* dx, const float* dout, const float* c, const float* s, int64_t B,
                   int64_t T, int64_t NH, int64_t D, const int32_t* doc) {
  k_rope<<<blocks(B * T * NH * D / 2), kThreads>>>(dx, dout, c, s, B, T, NH, D, -1.0f, doc);
  LAUNCHED("rope_backward");
}

// ---- causal or block-causal GQA attention: the simple correct path ----
// A block per (query i, head h, sequence b) walks the visible keys in chunks of kKC: one warp
// per key for the dot products, then per-thread output columns (D <= 2 * 128). Online softmax
// forward; backward rebuilds P from the saved lse. dK/dV: a block per (key j, kv head g, b)
// over the queries that see it (no atomics). Query i sees keys first_key(doc, ...)..i: 0..i,
// or block-causal doc[b T + i]..i (model/ops.h).
constexpr int kAT = 128, kKC = 128, kMaxD = 2 * kAT;
__device__ inline const float* row(const float* x, int64_t b, int64_t t, int64_t T, int64_t NH,
                                   int64_t h, int64_t D) {
  return x + ((b * T + t) * NH + h) * D;
}
__device__ inline int64_t first_key(const int32_t* doc, int64_t b, int64_t i, int64_t T) {
  return doc ? doc[b * T + i] : 0;
}
__device__ inline float warp_dot(const float* a, const float* b, int64_t D) {
  float s = 0;
  for (int64_t e = threadIdx.x & 31; e < D; e += 32) s += a[e] * b[e];
  return warp_sum(s);
}

// One query row qi against keys j0..j1 of kv head rows kh, vh (key j at kh + j * rs): the
// output row into oi (rounded to bf16 where rnd); returns the log-sum-exp. Shared by training's
// attention and generation's over a KV cache, so the two make the same values.
__device__ float attend_row(float* oi, const float* qi, const float* kh, const float* vh,
                            int64_t rs, int64_t j0, int64_t j1, int64_t D, float scale, bool rnd) {
  __shared__ float p[kKC], red[32];
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float m = -INFINITY, l = 0, o[2] = {0, 0};
  for (; j0 <= j1; j0 += kKC) {
    const int64_t nj = (j1 - j0 + 1) < kKC ? (j1 - j0 + 1) : kKC;
    for (int64_t jj = warp; jj < nj; jj += nw) {
      const float s = warp_dot(qi, kh + (j0 + jj) * rs, D);
      if ((threadIdx.x & 31) == 0) p[jj] = s * scale;
    }
    __syncthreads();
    float cm = -INFINITY;
    for (int64_t jj = threadIdx.x; jj < nj; jj += blockDim.x) cm = fmaxf(cm, p[jj]);
    cm = block_max(cm, red);
    const float mn = fmaxf(m, cm), corr = expf(m - mn);  // m = -inf at first: corr = 0
    __syncthreads();
    for (int64_t jj = threadIdx.x; jj < nj; jj += blockDim.x) p[jj] = expf(p[jj] - mn);
    __syncthreads();
    float cs = 0;
    for (int64_t jj = threadIdx.x; jj < nj; jj += blockDim.x) cs += p[jj];
    l = l * corr + block_sum(cs, red);
    for (int r = 0; r < 2; ++r) {
      const int64_t e = threadIdx.x + r * kAT;
      if (e >= D) break;
      float acc = 0;
      for (int64_t jj = 0; jj < nj; ++jj) acc += p[jj] * vh[(j0 + jj) * rs + e];
      o[r] = o[r] * corr + acc;
    }
    m = mn;
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t e = threadIdx.x + r * kAT;
    if (e < D) oi[e] = rnd ? round_bf(o[r] / l) : o[r] / l;
  }
  return m + logf(l);
}

__global__ void k_attn_fwd(float* out, float* lse, const float* q, const float* k, const float* v,
                           int64_t T, int64_t H, int64_t KVH, int64_t D, float scale,
                           const int32_t* doc) {
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (H / KVH);
  const float l = attend_row(out + ((b * T + i) * H + h) * D, row(q, b, i, T, H, h, D),
                             row(k, b, 0, T, KVH, g, D), row(v, b, 0, T, KVH, g, D), KVH * D,
                             first_key(doc, b, i, T), i, D, scale, false);
  if (threadIdx.x == 0) lse[(b * H + h) * T + i] = l;
}
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                       const int32_t* doc) {
  if (D > kMaxD) throw Error("CUDA attention: head dim " + std::to_string(D) + " > 256");
  k_attn_fwd<<<dim3(unsigned(T), unsigned(H), unsigned(B)), kAT>>>(out, lse, q, k, v, T, H, KVH, D,
                                                                   1.0f / sqrtf(float(D)), doc);
  LAUNCHED("attention_forward");
}

// Generation's attention over the KV cache (model/ops.h): a block per (head h, sequence b),
// keys 0..len[b]-1 of the cache [B, Tc, KVH, D].
__global__ void k_attn_decode(float* out, const float* q, const float* kc, const float* vc,
                              const int32_t* len, int64_t H, int64_t KVH, int64_t D, int64_t Tc,
                              float scale, bool rnd) {
  const int64_t h = blockIdx.x, b = blockIdx.y, g = h / (H / KVH);
  attend_row(out + (b * H + h) * D, q + (b * H + h) * D, row(kc, b, 0, Tc, KVH, g, D),
             row(vc, b, 0, Tc, KVH, g, D), KVH * D, 0, len[b] - 1, D, scale, rnd);
}
void attention_decode(float* out, const float* q, const float* kc, const float* vc,
                      const int32_t* len, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t Tc,
                      bool bf16, bool h16) {
  if (D > kMaxD) throw Error("CUDA attention: head dim " + std::to_string(D) + " > 256");
  if (h16) throw Error("CUDA attention_decode: no bf16 storage on this backend");
  k_attn_decode<<<dim3(unsigned(H), unsigned(B)), kAT>>>(out, q, kc, vc, len, H, KVH, D, Tc,
                                                         1.0f / sqrtf(float(D)), bf16);
  LAUNCHED("attention_decode");
}

// dQ, and rowdot_i = dO_i . O_i (kept for dK/dV): a block per (i, h, b).
__global__ void k_attn_dq(float* dq, float* rowdot, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          int64_t T, int64_t H, int64_t KVH, int64_t D, float scale,
                          const int32_t* doc) {
  __shared__ float ds[kKC], red[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, g = h / (H / KVH);
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const float *qi = row(q, b, i, T, H, h, D), *doi = row(dout, b, i, T, H, h, D);
  float d = 0;
  for (int64_t e = threadIdx.x; e < D; e += blockDim.x) d += doi[e] * row(out, b, i, T, H, h, D)[e];
  d = block_sum(d, red);
  const float l = lse[(b * H + h) * T + i];
  if (threadIdx.x == 0) rowdot[(b * H + h) * T + i] = d;
  float acc[2] = {0, 0};
  for (int64_t j0 = first_key(doc, b, i, T); j0 <= i; j0 += kKC) {
    const int64_t nj = (i - j0 + 1) < kKC ? (i - j0 + 1) : kKC;
    for (int64_t jj = warp; jj < nj; jj += nw) {
      const float s = warp_dot(qi, row(k, b, j0 + jj, T, KVH, g, D), D);
      const float dp = warp_dot(doi, row(v, b, j0 + jj, T, KVH, g, D), D);
      if ((threadIdx.x & 31) == 0) ds[jj] = expf(s * scale - l) * (dp - d) * scale;
    }
    __syncthreads();
    for (int r = 0; r < 2; ++r) {
      const int64_t e = threadIdx.x + r * kAT;
      if (e >= D) break;
      for (int64_t jj = 0; jj < nj; ++jj) acc[r] += ds[jj] * row(k, b, j0 + jj, T, KVH, g, D)[e];
    }
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t e = threadIdx.x + r * kAT;
    if (e < D) dq[((b * T + i) * H + h) * D + e] = acc[r];
  }
}
// dK_j = sum over heads of the group and queries i >= j that see j of dS_ij Q_i; dV_j = sum
// P_ij dO_i. (Block-causal: those of j's document; the others' P and dS are 0.)
__global__ void k_attn_dkv(float* dk, float* dv, const float* rowdot, const float* dout,
                           const float* lse, const float* q, const float* k, const float* v,
                           int64_t T, int64_t H, int64_t KVH, int64_t D, float scale,
                           const int32_t* doc) {
  __shared__ float ps[kKC], ds[kKC];
  const int64_t j = blockIdx.x, g = blockIdx.y, b = blockIdx.z, G = H / KVH;
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const float *kj = row(k, b, j, T, KVH, g, D), *vj = row(v, b, j, T, KVH, g, D);
  float ak[2] = {0, 0}, av[2] = {0, 0};
  for (int64_t hh = 0; hh < G; ++hh) {
    const int64_t h = g * G + hh;
    for (int64_t i0 = j; i0 < T; i0 += kKC) {
      const int64_t ni = (T - i0) < kKC ? (T - i0) : kKC;
      for (int64_t ii = warp; ii < ni; ii += nw) {
        const int64_t i = i0 + ii;
        const float s = warp_dot(row(q, b, i, T, H, h, D), kj, D);
        const float dp = warp_dot(row(dout, b, i, T, H, h, D), vj, D);
        if ((threadIdx.x & 31) == 0) {
          const bool seen = first_key(doc, b, i, T) <= j;
          const float p = seen ? expf(s * scale - lse[(b * H + h) * T + i]) : 0.0f;
          ps[ii] = p;
          ds[ii] = p * (dp - rowdot[(b * H + h) * T + i]) * scale;
        }
      }
      __syncthreads();
      for (int r = 0; r < 2; ++r) {
        const int64_t e = threadIdx.x + r * kAT;
        if (e >= D) break;
        for (int64_t ii = 0; ii < ni; ++ii) {
          ak[r] += ds[ii] * row(q, b, i0 + ii, T, H, h, D)[e];
          av[r] += ps[ii] * row(dout, b, i0 + ii, T, H, h, D)[e];
        }
      }
      __syncthreads();
    }
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t e = threadIdx.x + r * kAT;
    if (e < D) {
      dk[((b * T + j) * KVH + g) * D + e] = ak[r];
      dv[((b * T + j) * KVH + g) * D + e] = av[r];
    }
  }
}
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t KVH, int64_t D, const int32_t* doc) {
  if (D > kMaxD) throw Error("CUDA attention: head dim " + std::to_string(D) + " > 256");
  const float scale = 1.0f / sqrtf(float(D));
  float* rowdot = scratch(1).get<float>(size_t(B * H * T));
  k_attn_dq<<<dim3(unsigned(T), unsigned(H), unsigned(B)), kAT>>>(dq, rowdot, dout, out, lse, q, k,
                                                                  v, T, H, KVH, D, scale, doc);
  LAUNCHED("attention_backward dq");
  k_attn_dkv<<<dim3(unsigned(T), unsigned(KVH), unsigned(B)), kAT>>>(
      dk, dv, rowdot, dout, lse, q, k, v, T, H, KVH, D, scale, doc);
  LAUNCHED("attention_backward dk dv");
}

// ---- SwiGLU on [N, 2F]: a = gate (w1), b = up (w3) ----
__global__ void k_swiglu_fwd(float* out, const float* ab, int64_t N, int64_t F, bool rnd) {
  GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const float a = ab[n * 2 * F + f], b = ab[n * 2 * F + F + f], y = a / (1.0f + expf(-a)) * b;
    out[i] = rnd ? round_bf(y) : y;
  }
}
void swiglu_forward(float* out, const float* ab, int64_t N, int64_t F, bool rnd) {
  k_swiglu_fwd<<<blocks(N * F), kThreads>>>(out, ab, N, F, rnd);
  LAUNCHED("swiglu_forward");
}
__global__ void k_swiglu_bwd(float* dab, const float* dout, const float* ab, int64_t N, int64_t F,
                             bool rnd) {
  GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i % F;
    const float a = ab[n * 2 * F + f], b = ab[n * 2 * F + F + f], g = dout[i];
    const float sg = 1.0f / (1.0f + expf(-a));
    const float da = g * b * sg * fmaf(a, 1.0f - sg, 1.0f), db = g * a * sg;  // (as the CPU's)
    dab[n * 2 * F + f] = rnd ? round_bf(da) : da;
    dab[n * 2 * F + F + f] = rnd ? round_bf(db) : db;
  }
}
void swiglu_backward(float* dab, const float* dout, const float* ab, int64_t N, int64_t F,
                     bool rnd) {
  k_swiglu_bwd<<<blocks(N * F), kThreads>>>(dab, dout, ab, N, F, rnd);
  LAUNCHED("swiglu_backward");
}

// ---- cross-entropy: a block per row; the mean is summed on the host in row order ----
__global__ void k_ce_fwd(float* lse, double* rowloss, const float* logits, const int32_t* tgt,
                         int64_t V) {
  __shared__ float red[32];
  const int64_t n = blockIdx.x;
  const float* r = logits + n * V;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, r[j]);
  mx = block_max(mx, red);
  float s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) s += expf(r[j] - mx);
  s = block_sum(s, red);
  if (threadIdx.x == 0) {
    lse[n] = mx + logf(s);
    rowloss[n] = double(lse[n]) - double(r[tgt[n]]);
  }
}
double crossentropy_forward(float* lse, const float* logits, const int32_t* tgt, int64_t N,
                            int64_t V) {
  double* rows = scratch(2).get<double>(size_t(N));
  k_ce_fwd<<<int(N), 256>>>(lse, rows, logits, tgt, V);
  LAUNCHED("crossentropy_forward");
  std::vector<double> host(static_cast<size_t>(N));
  check(cudaMemcpy(host.data(), rows, size_t(N) * 8, cudaMemcpyDeviceToHost), "loss");
  double total = 0;
  for (double x : host) total += x;
  return total / double(N);
}
__global__ void k_ce_bwd(float* dlogits, const float* logits, const float* lse, const int32_t* tgt,
                         int64_t N, int64_t V, float scale) {
  GRID_STRIDE(i, N * V) {
    const int64_t n = i / V, j = i % V;
    dlogits[i] = (expf(logits[i] - lse[n]) - (j == tgt[n] ? 1.0f : 0.0f)) * scale;
  }
}
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* tgt, int64_t N, int64_t V, double scale) {
  k_ce_bwd<<<blocks(N * V), kThreads>>>(dlogits, logits, lse, tgt, N, V, float(scale));
  LAUNCHED("crossentropy_backward");
}

CudaDevice open_device(int id) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorInsufficientDriver)
    throw Error("no CUDA device: no NVIDIA driver for CUDA 13 on this machine (" +
                std::string(cudaGetErrorString(e)) + ")");
  if (e != cudaSuccess || n == 0)
    throw Error(std::string("no CUDA device: ") +
                (e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees no GPU"));
  if (id < 0 || id >= n)
    throw Error("--device " + std::to_string(id) + ": this machine has CUDA devices 0.." +
                std::to_string(n - 1));
  check(cudaSetDevice(id), "select device");
  cudaDeviceProp p;
  check(cudaGetDeviceProperties(&p, id), "device properties");
  CudaDevice d{id, p.name, p.major * 10 + p.minor, 0, 0};
  check(cudaMemGetInfo(&d.free, &d.total), "device memory");
  if (d.sm < 80)
    throw Error(d.describe() + ": this build runs on sm_80 and newer (A100, H100, ...)");
  return d;
}

const Ops& device_ops() {
  static const Ops ops = {
      "cuda",
      dev_alloc,
      dev_release,
      dev_zero,
      dev_copy,
      dev_upload,
      dev_download,
      widen,
      accumulate_bf16,
      embedding_forward,
      embedding_backward,
      nullptr,  // embedding_forward_bf16: the model widens the table (on the device)
      nullptr,  // embedding_backward_bf16: into the fp32 buffer, then accumulated
      rmsnorm_forward,
      rmsnorm_backward,
      matmul_forward,
      matmul_backward,
      nullptr,  // matmul_forward_bf16w: the model widens the weight
      nullptr,
      nullptr,  // matmul_backward_bf16g
      nullptr,  // matmul_backward_sgd: the model steps after backward
      nullptr,
      qkv_split_forward,
      qkv_split_backward,
      rope_forward,
      rope_backward,
      nullptr,  // qk_norm_rope_*: the model composes the split, norms and rotations
      nullptr,
      attention_forward,
      attention_backward,
      nullptr,  // attention_*_bf16: fp32 products
      nullptr,
      nullptr,  // attention_stats: lse only
      nullptr,  // attention_qkn_*: qk norms and rotations, then attention
      nullptr,
      attention_decode,
      swiglu_forward,
      swiglu_backward,
      nullptr,  // swiglu_*_bf16: activations in fp32 storage
      nullptr,
      crossentropy_forward,
      crossentropy_backward,
      add_inplace,
      round_inplace,
      nullptr,  // add_rmsnorm_forward, rmsnorm_backward_add: the model composes them
      nullptr,
      sgd_f32,
      sgd_bf16,
      scale_sum_squares,
      optimizer_step,
      [] { check(cudaDeviceSynchronize(), "kernels"); },
  };
  return ops;
}

// ---- NCCL's collectives (CudaCollectives, for src/dist/nccl.cpp) ----
// Enqueued on the legacy default stream, as the kernels above are: after the gradients they
// read, before the kernels that read their result, with no event between. A blocking
// communicator: each call returns once its work is enqueued.
static_assert(NCCL_UNIQUE_ID_BYTES == 128, "CudaCollectives passes NCCL's unique id as 128 bytes");
constexpr cudaStream_t kStream = 0;

void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string msg = std::string("NCCL: ") + what + ": " + ncclGetErrorString(r);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* last = ncclGetLastError(comm); last && *last)
    msg += std::string(" (") + last + ")";
#else
  (void)comm;
#endif
  throw Error(msg);
}

// What the void* of CudaCollectives points at: the communicator, and an event recorded after
// the last operation enqueued (stream order: once it has happened, everything before has).
struct NcclComm {
  ncclComm_t comm = nullptr;
  cudaEvent_t last = nullptr;
  ~NcclComm() {
    if (last) cudaEventDestroy(last);
  }
};
NcclComm& as_comm(void* c) {
  return *static_cast<NcclComm*>(c);
}
void enqueued(NcclComm& c, const char* what) {
  check(cudaGetLastError(), what);
  check(cudaEventRecord(c.last, kStream), what);
}

void nccl_unique_id(char id[128]) {
  ncclUniqueId u;
  nccl_check(ncclGetUniqueId(&u), "unique id");
  std::memcpy(id, u.internal, NCCL_UNIQUE_ID_BYTES);
}
void* nccl_init(const char* id, int rank, int size) {
  ncclUniqueId u;
  std::memcpy(u.internal, id, NCCL_UNIQUE_ID_BYTES);
  auto c = std::make_unique<NcclComm>();
  check(cudaEventCreateWithFlags(&c->last, cudaEventDisableTiming), "NCCL's event");
  nccl_check(
      ncclCommInitRank(&c->comm, size, u, rank),
      ("communicator of " + std::to_string(size) + " ranks (rank " + std::to_string(rank) + ")")
          .c_str());
  return c.release();
}
void nccl_allreduce_sum(void* comm, float* p, size_t n) {
  NcclComm& c = as_comm(comm);
  if (n == 0) return;
  nccl_check(ncclAllReduce(p, p, n, ncclFloat32, ncclSum, c.comm, kStream), "all-reduce", c.comm);
  enqueued(c, "all-reduce");
}
void nccl_allgather(void* comm, void* p, const size_t* off, int size) {
  NcclComm& c = as_comm(comm);
  char* base = static_cast<char*>(p);
  // every rank has the same off[], so each skips the same empty ranges
  nccl_check(ncclGroupStart(), "group start", c.comm);
  for (int r = 0; r < size; ++r) {
    const size_t n = off[r + 1] - off[r];
    if (n == 0) continue;
    const ncclResult_t e =
        ncclBroadcast(base + off[r], base + off[r], n, ncclUint8, r, c.comm, kStream);
    if (e != ncclSuccess) {
      ncclGroupEnd();  // the group closed before the error
      nccl_check(e, "all-gather's broadcast", c.comm);
    }
  }
  nccl_check(ncclGroupEnd(), "all-gather", c.comm);
  enqueued(c, "all-gather");
}
int nccl_done(void* comm) {
  NcclComm& c = as_comm(comm);
  if (!c.comm) throw Error("NCCL: the communicator was aborted");
  ncclResult_t async = ncclSuccess;
  nccl_check(ncclCommGetAsyncError(c.comm, &async), "communicator state", c.comm);
  nccl_check(async, "a collective failed", c.comm);
  const cudaError_t e = cudaEventQuery(c.last);
  if (e == cudaErrorNotReady) return 0;
  check(e, "NCCL's collectives");
  return 1;
}
void nccl_abort(void* comm) {
  NcclComm& c = as_comm(comm);
  if (c.comm) ncclCommAbort(c.comm);  // the job ends next: its result does not matter
  c.comm = nullptr;
}
void nccl_destroy(void* comm) {
  std::unique_ptr<NcclComm> c(static_cast<NcclComm*>(comm));
  // (ncclCommDestroy finalizes first: it waits for the enqueued work.) A failure only leaks:
  // this runs from a destructor.
  if (c && c->comm) ncclCommDestroy(c->comm);
}

const CudaCollectives& collectives() {
  static const CudaCollectives t = {nccl_unique_id, nccl_init,  nccl_allreduce_sum, nccl_allgather,
                                    nccl_done,      nccl_abort, nccl_destroy};
  return t;
}
const CudaCollectives* collectives_table() {
  return &collectives();
}

}  // namespace
}  // namespace tq

// The plugin's one exported symbol (the rest is hidden: built with -fvisibility=hidden).
extern "C" __attribute__((visibility("default"))) const tq::CudaPlugin* tq_cuda_plugin() {
  static const tq::CudaPlugin p = {tq::kCudaPluginVersion, tq::open_device, tq::device_ops,
                                   tq::collectives_table};
  return &p;
}
