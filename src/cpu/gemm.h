// Our own packed matrix products for AVX-512 CPUs (src/cpu/gemm_avx512.cpp):
//   C[M, N] (= or +=) alpha * sum_k A(m, k) * B(n, k)
// A and B are strided views; C is row-major with row stride ldc. Two arithmetic kinds:
//   f32:  fp32 products, fp32 sums (vfmadd231ps)
//   bf16: operands rounded to bf16 (exact for values that already are bf16), products of
//         pairs summed into fp32 (vdpbf16ps); k runs in pairs, an odd K is padded with 0.
// Every C element is summed in the same k order whatever the thread count, so results are
// bit-for-bit reproducible. Call only when the CPU has the instructions (has_avx512f /
// has_avx512bf16); the functions are compiled for them and would fault elsewhere.
#pragma once
#include <cstdint>

namespace tq::cpu {

struct View {
  const void* p;
  bool bf16;       // element storage: bf16 bits (uint16_t) or fp32
  int64_t rs, ks;  // element (row i, k) at p[i * rs + k * ks]
};

bool has_avx512f();
bool has_avx512bf16();

// With accumulate and alpha != 1, each C element is fma(sum, alpha, C): one rounding.
void gemm_f32(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
              bool accumulate, float alpha = 1.0f);
void gemm_bf16(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
               bool accumulate, float alpha = 1.0f);

// The optimizer step fused into the weight-gradient product (no gradient is kept):
// W[M, N] (bf16) <- bf16(W + bf16(bf16(-lr) * bf16(sum_k A B))), the optax bf16 SGD step of
// sgd_update_bf16. (fp32 SGD is gemm_f32(..., W, ldw, true, -lr): W = fma(sum, -lr, W).)
void gemm_bf16_sgd(int64_t M, int64_t N, int64_t K, View A, View B, uint16_t* W, int64_t ldw,
                   float lr);

}  // namespace tq::cpu
