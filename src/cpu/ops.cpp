#include "model/ops.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/common.h"
#include "cpu/layers.h"

namespace tq {
namespace {

// calloc: fresh pages from the kernel are already zero, so large arenas are not written
// twice; those are aligned to 2 MiB and put on huge pages, since first-touch page faults
// otherwise dominate start-up (seconds for the 0.6B preset in a VM). The pointer calloc
// returned is kept just below the aligned one.
float* host_alloc(size_t n) {
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
  const size_t align = bytes >= (2u << 20) ? (2u << 20) : 64;
  void* raw = std::calloc(bytes + align + sizeof(void*), 1);
  if (!raw) throw std::bad_alloc();
  const uintptr_t p = (uintptr_t(raw) + sizeof(void*) + align - 1) & ~uintptr_t(align - 1);
  reinterpret_cast<void**>(p)[-1] = raw;
  if (align > 64) madvise(reinterpret_cast<void*>(p), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<float*>(p);
}
void host_release(float* p) {
  if (p) std::free(reinterpret_cast<void**>(p)[-1]);
}
void host_zero(float* p, int64_t n) {
  std::memset(p, 0, n * sizeof(float));
}
void host_copy(float* d, const float* s, int64_t n) {
  std::memcpy(d, s, n * sizeof(float));
}

void sgd_update(float* w, const float* g, int64_t n, float lr, bool bf16) {
  if (!bf16) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] -= lr * g[i];
    return;
  }
  // optax: p + (-lr * g), every operand and result in bf16 (lr is a weak-typed scalar)
  const float step = round_bf16(-lr);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) w[i] = round_bf16(w[i] + round_bf16(step * g[i]));
}

}  // namespace

const Ops& cpu_ops() {
  static const Ops ops = {
      "cpu",
      host_alloc,
      host_release,
      host_zero,
      host_copy,
      host_copy,
      host_copy,
      cpu::embedding_forward,
      cpu::embedding_backward,
      cpu::rmsnorm_forward,
      cpu::rmsnorm_backward,
      cpu::matmul_forward,
      cpu::matmul_backward,
      cpu::qkv_split_forward,
      cpu::qkv_split_backward,
      cpu::rope_forward,
      cpu::rope_backward,
      cpu::attention_forward,
      cpu::attention_backward,
      cpu::swiglu_forward,
      cpu::swiglu_backward,
      cpu::crossentropy_forward,
      cpu::crossentropy_backward,
      cpu::add_inplace,
      cpu::round_bf16_inplace,
      sgd_update,
  };
  return ops;
}

}  // namespace tq
