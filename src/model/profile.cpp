#include "model/profile.h"

#include <algorithm>
#include <chrono>

namespace tq {
namespace {

const Ops* g_inner = nullptr;
std::vector<KernelTime> g_times;

// Wrap<&Ops::f>::call has f's signature: time the inner backend's f into slot `index`.
template <auto M>
struct Wrap;
template <typename R, typename... A, R (*Ops::*M)(A...)>
struct Wrap<M> {
  static inline size_t index = 0;
  static R call(A... a) {
    g_inner->sync();  // a device backend's kernels run asynchronously: time them whole
    const auto t0 = std::chrono::steady_clock::now();
    struct Done {  // also when R is void
      std::chrono::steady_clock::time_point t0;
      ~Done() {
        g_inner->sync();
        KernelTime& k = g_times[index];
        k.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++k.calls;
      }
    } done{t0};
    return (g_inner->*M)(a...);
  }
};

template <auto M>
void wrap(Ops& o, const char* name) {
  if (!(g_inner->*M)) return;  // optional kernel the backend lacks stays null
  Wrap<M>::index = g_times.size();
  g_times.push_back({name, 0.0, 0});
  o.*M = Wrap<M>::call;
}

}  // namespace

const Ops& profiled(const Ops& inner) {
  static Ops o = [&] {
    g_inner = &inner;
    Ops p = inner;
    p.name = inner.name + "+profile";
#define TQ_WRAP(f) wrap<&Ops::f>(p, #f)
    TQ_WRAP(zero), TQ_WRAP(copy), TQ_WRAP(bf16_to_f32), TQ_WRAP(bf16_accumulate);
    TQ_WRAP(embedding_forward), TQ_WRAP(embedding_backward), TQ_WRAP(embedding_forward_bf16);
    TQ_WRAP(embedding_backward_bf16);
    TQ_WRAP(rmsnorm_forward), TQ_WRAP(rmsnorm_backward);
    TQ_WRAP(matmul_forward), TQ_WRAP(matmul_backward);
    TQ_WRAP(matmul_forward_bf16w), TQ_WRAP(matmul_backward_bf16w);
    TQ_WRAP(matmul_backward_bf16g);
    TQ_WRAP(matmul_backward_sgd), TQ_WRAP(matmul_backward_sgd_bf16w);
    TQ_WRAP(qkv_split_forward), TQ_WRAP(qkv_split_backward);
    TQ_WRAP(rope_forward), TQ_WRAP(rope_backward);
    TQ_WRAP(qk_norm_rope_forward), TQ_WRAP(qk_norm_rope_backward);
    TQ_WRAP(attention_forward), TQ_WRAP(attention_backward);
    TQ_WRAP(attention_forward_bf16), TQ_WRAP(attention_backward_bf16);
    TQ_WRAP(attention_qkn_forward), TQ_WRAP(attention_qkn_backward);
    TQ_WRAP(swiglu_forward), TQ_WRAP(swiglu_backward);
    TQ_WRAP(swiglu_forward_bf16), TQ_WRAP(swiglu_backward_bf16);
    TQ_WRAP(crossentropy_forward), TQ_WRAP(crossentropy_backward);
    TQ_WRAP(add_inplace), TQ_WRAP(round_bf16_inplace);
    TQ_WRAP(sgd_update_f32), TQ_WRAP(sgd_update_bf16);
#undef TQ_WRAP
    return p;
  }();
  return o;
}

std::vector<KernelTime> kernel_times() {
  std::vector<KernelTime> t;
  for (const KernelTime& k : g_times)
    if (k.calls) t.push_back(k);
  std::sort(t.begin(), t.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return t;
}
void reset_kernel_times() {
  for (KernelTime& k : g_times) k.seconds = 0, k.calls = 0;
}

}  // namespace tq
