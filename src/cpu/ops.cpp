#include "model/ops.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "core/common.h"
#include "cpu/gemm.h"
#include "cpu/layers.h"

namespace tq {
namespace {

// calloc: fresh pages from the kernel are already zero, so large arenas are not written
// twice; those are aligned to 2 MiB and put on huge pages, since first-touch page faults
// otherwise dominate start-up (seconds for the 0.6B preset in a VM). The pointer calloc
// returned is kept just below the aligned one.
void* host_alloc(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  const size_t align = bytes >= (2u << 20) ? (2u << 20) : 64;
  void* raw = std::calloc(bytes + align + sizeof(void*), 1);
  if (!raw) throw std::bad_alloc();
  const uintptr_t p = (uintptr_t(raw) + sizeof(void*) + align - 1) & ~uintptr_t(align - 1);
  reinterpret_cast<void**>(p)[-1] = raw;
  if (align > 64) {
    madvise(reinterpret_cast<void*>(p), bytes, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE  // fault the pages in now, not inside the first step
    madvise(reinterpret_cast<void*>(p), bytes, MADV_POPULATE_WRITE);
#endif
  }
  return reinterpret_cast<void*>(p);
}
void host_release(void* p) {
  if (p) std::free(static_cast<void**>(p)[-1]);
}
// Large spans by all threads, a share of whole pages each: one core's memset wrote ~50 GB/s on the
// Zen 5 VM, two ~100 (a 0.6B fp32 step zeroes its 622 MB table gradient).
void host_zero(void* p, size_t bytes) {
  if (bytes < (size_t(4) << 20)) return void(std::memset(p, 0, bytes));
  char* const c = static_cast<char*>(p);
#pragma omp parallel
  {
    const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
    const size_t a = bytes / nt * t / 4096 * 4096,
                 b = t + 1 == nt ? bytes : bytes / nt * (t + 1) / 4096 * 4096;
    std::memset(c + a, 0, b - a);
  }
}
void host_copy(float* d, const float* s, int64_t n) {
  std::memcpy(d, s, n * sizeof(float));
}
void host_move(void* d, const void* s, size_t bytes) {
  std::memcpy(d, s, bytes);
}

void widen_bf16(float* dst, const uint16_t* src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void accumulate_bf16(uint16_t* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(bf16_to_f32(dst[i]) + src[i]);
}

void sgd_update_f32(float* w, const float* g, int64_t n, float lr) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
}
// optax: p + (-lr * g), every operand and result in bf16 (lr is a weak-typed scalar)
void sgd_update_bf16(uint16_t* w, const uint16_t* g, int64_t n, float lr) {
  const float step = round_bf16(-lr);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    w[i] = f32_to_bf16(bf16_to_f32(w[i]) + round_bf16(step * bf16_to_f32(g[i])));
}

double scale_sum_squares(float* g, int64_t n, float s) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double sum = 0;
    const int64_t end = std::min(n, (c + 1) * kNormChunk);
    for (int64_t i = c * kNormChunk; i < end; ++i) {
      if (s != 1.f) g[i] *= s;
      sum += double(g[i]) * double(g[i]);
    }
    part[size_t(c)] = sum;
  }
  double total = 0;
  for (double x : part) total += x;
  return total;
}

// The update of train/optimizer.h's adamw_step / sgd_step on g * gscale, in one pass that also
// writes the model's copy (a bf16 run's: rounded), so that neither the clipping nor the copy
// is a pass of its own over the arenas.
void optimizer_step(float* p, float* m, float* v, const float* g, int64_t n, const OptimizerStep& s,
                    void* params, bool bf16) {
  float* const pf = bf16 ? nullptr : static_cast<float*>(params);
  uint16_t* const ph = bf16 ? static_cast<uint16_t*>(params) : nullptr;
  const OptimizerStep st = s;
  if (st.adamw) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * st.gscale;
      const float mi = m[i] + st.w1 * (gi - m[i]);      // torch's lerp for a weight below 0.5
      const float vi = v[i] * st.b2 + st.w2 * gi * gi;  // addcmul: value * t1 * t2
      const float denom = std::sqrt(vi) / st.bc2_sqrt + st.eps;
      m[i] = mi;
      v[i] = vi;
      const float pi = p[i] * st.decay - st.step_size * (mi / denom);
      p[i] = pi;
      if (pf) pf[i] = pi;
      if (ph) ph[i] = f32_to_bf16(pi);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float pi = p[i] - st.lr * (g[i] * st.gscale);
      p[i] = pi;
      if (pf) pf[i] = pi;
      if (ph) ph[i] = f32_to_bf16(pi);
    }
  }
}

}  // namespace

const Ops& cpu_ops() {
  const bool own = cpu::own_kernels();  // else the OpenBLAS path: no bf16 or fused products
  static const Ops ops = {
      "cpu",
      host_alloc,
      host_release,
      host_zero,
      host_copy,
      host_move,
      host_move,
      widen_bf16,
      accumulate_bf16,
      cpu::embedding_forward,
      cpu::embedding_backward,
      cpu::embedding_forward_bf16,
      cpu::embedding_backward_bf16,
      cpu::rmsnorm_forward,
      cpu::rmsnorm_backward,
      cpu::matmul_forward,
      cpu::matmul_backward,
      own ? cpu::matmul_forward_bf16w : nullptr,
      own ? cpu::matmul_backward_bf16w : nullptr,
      own ? cpu::matmul_backward_bf16g : nullptr,
      own ? cpu::matmul_backward_sgd : nullptr,
      own ? cpu::matmul_backward_sgd_bf16w : nullptr,
      cpu::qkv_split_forward,
      cpu::qkv_split_backward,
      cpu::rope_forward,
      cpu::rope_backward,
      cpu::qk_norm_rope_forward,
      cpu::qk_norm_rope_backward,
      cpu::attention_forward,
      cpu::attention_backward,
      own ? cpu::attention_forward_bf16 : nullptr,
      own ? cpu::attention_backward_bf16 : nullptr,
      cpu::attention_stats,
      own ? cpu::attention_qkn_forward : nullptr,
      own ? cpu::attention_qkn_backward : nullptr,
      cpu::attention_decode,
      cpu::swiglu_forward,
      cpu::swiglu_backward,
      own ? cpu::swiglu_forward_bf16 : nullptr,  // with the bf16w products
      own ? cpu::swiglu_backward_bf16 : nullptr,
      cpu::crossentropy_forward,
      cpu::crossentropy_backward,
      cpu::add_inplace,
      cpu::round_bf16_inplace,
      cpu::add_rmsnorm_forward,
      cpu::rmsnorm_backward_add,
      sgd_update_f32,
      sgd_update_bf16,
      scale_sum_squares,
      optimizer_step,
      [] {},
  };
  return ops;
}

}  // namespace tq
