// A backend is this table of kernels plus memory functions. The model code (qwen3.cpp) is
// written once against it; pointers are the backend's own (host for the CPU backend).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tq {

struct Ops {
  std::string name;
  // memory
  float* (*alloc)(size_t n);  // n floats, zeroed
  void (*release)(float* p);
  void (*zero)(float* p, int64_t n);
  void (*copy)(float* dst, const float* src, int64_t n);       // within the backend
  void (*upload)(float* dst, const float* host, int64_t n);    // host -> backend
  void (*download)(float* host, const float* src, int64_t n);  // backend -> host
  // layers: see src/ref/layers.h for the contract
  void (*embedding_forward)(float*, const int32_t*, const float*, int64_t, int64_t);
  void (*embedding_backward)(float*, const float*, const int32_t*, int64_t, int64_t);
  void (*rmsnorm_forward)(float*, float*, const float*, const float*, int64_t, int64_t, double);
  void (*rmsnorm_backward)(float*, float*, const float*, const float*, const float*, const float*,
                           int64_t, int64_t);
  void (*matmul_forward)(float*, const float*, const float*, int64_t, int64_t, int64_t);
  void (*matmul_backward)(float*, float*, const float*, const float*, const float*, int64_t,
                          int64_t, int64_t);
  void (*qkv_split_forward)(float*, float*, float*, const float*, int64_t, int64_t, int64_t,
                            int64_t);
  void (*qkv_split_backward)(float*, const float*, const float*, const float*, int64_t, int64_t,
                             int64_t, int64_t);
  void (*rope_forward)(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                       int64_t);
  void (*rope_backward)(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                        int64_t);
  void (*attention_forward)(float*, float*, const float*, const float*, const float*, int64_t,
                            int64_t, int64_t, int64_t, int64_t);
  void (*attention_backward)(float*, float*, float*, const float*, const float*, const float*,
                             const float*, const float*, const float*, int64_t, int64_t, int64_t,
                             int64_t, int64_t);
  void (*swiglu_forward)(float*, const float*, int64_t, int64_t);
  void (*swiglu_backward)(float*, const float*, const float*, int64_t, int64_t);
  double (*crossentropy_forward)(float*, const float*, const int32_t*, int64_t, int64_t);
  void (*crossentropy_backward)(float*, const float*, const float*, const int32_t*, int64_t,
                                int64_t, double);
  void (*add_inplace)(float*, const float*, int64_t);
  void (*round_bf16_inplace)(float*, int64_t);
  // w -= lr * g; with bf16 = true the update is computed and stored as bf16 would be
  void (*sgd_update)(float* w, const float* g, int64_t n, float lr, bool bf16);
};

const Ops& cpu_ops();

}  // namespace tq
