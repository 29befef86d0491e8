#include "model/profile.h"

#include <algorithm>
#include <chrono>

namespace tq {
namespace {

const Ops* g_inner = nullptr;
std::vector<KernelTime> g_times;

struct Cost {
  double flops, bytes;
};

// Wrap<&Ops::f>::call has f's signature: time the inner backend's f into slot `index`, and
// add what cost(its arguments) counts.
template <auto M>
struct Wrap;
template <typename R, typename... A, R (*Ops::*M)(A...)>
struct Wrap<M> {
  using CostOf = Cost (*)(A...);
  static inline size_t index = 0;
  static inline CostOf cost = nullptr;
  static R call(A... a) {
    const Cost c = cost(a...);
    g_times[index].flops += c.flops, g_times[index].bytes += c.bytes;
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
void wrap(Ops& o, const char* name, typename Wrap<M>::CostOf cost) {
  if (!(g_inner->*M)) return;  // optional kernel the backend lacks stays null
  Wrap<M>::index = g_times.size();
  Wrap<M>::cost = cost;
  g_times.push_back({name, 0.0, 0});
  o.*M = Wrap<M>::call;
}

// The costs, by argument lists as in model/ops.h (I64: a size). Sizes: N rows (tokens), C, IC,
// OC, F widths, V the vocabulary; attention's B, T, H, KVH, D.
using I64 = int64_t;
using Pf = float*;
using CPf = const float*;
using Ph = uint16_t*;  // bf16
using CPh = const uint16_t*;
using Tok = const int32_t*;
double es(Act a) {  // bytes of an element in its storage
  return a.bf16 ? 2.0 : 4.0;
}
Cost bytes(double b) {
  return {0.0, b};
}
Cost product(double N, double IC, double OC, double passes, double b) {  // passes: 1 fwd, 2 bwd
  return {2.0 * passes * N * IC * OC, b};
}
// attention over B sequences: 4 D flops a visible query-key pair forward (S and P V), 8 backward
// (dP, dV, dQ, dK); e: bytes of q, k, v, out, their gradients; rows: head rows read and written.
// The pairs a head sees: causal, each token's t + 1; block-causal (doc, model/ops.h), its
// t - doc[t] + 1 (doc read back from the backend)
Cost attention(I64 B, I64 T, I64 H, I64 D, double passes, double e, double rows, Tok doc) {
  double pairs = double(B) * double(T) * double(T + 1) / 2;
  if (doc) {
    std::vector<int32_t> d(size_t(B * T));
    g_inner->download(d.data(), doc, d.size() * 4);
    pairs = 0;
    for (size_t n = 0; n < d.size(); ++n) pairs += double(I64(n) % T - d[n] + 1);
  }
  return {4.0 * passes * pairs * double(H) * double(D), e * double(B * T * D) * rows};
}

}  // namespace

const Ops& profiled(const Ops& inner) {
  static Ops o = [&] {
    g_inner = &inner;
    Ops p = inner;
    p.name = inner.name + "+profile";
#define TQ_WRAP(f, ...) wrap<&Ops::f>(p, #f, __VA_ARGS__)  // (the cost lambda has commas)
    TQ_WRAP(zero, [](void*, size_t n) { return bytes(double(n)); });
    TQ_WRAP(copy, [](Pf, CPf, I64 n) { return bytes(8.0 * n); });
    TQ_WRAP(bf16_to_f32, [](Pf, CPh, I64 n) { return bytes(6.0 * n); });
    TQ_WRAP(bf16_accumulate, [](Ph, CPf, I64 n) { return bytes(8.0 * n); });
    // the rows the tokens pick: read (and added into, backward)
    TQ_WRAP(embedding_forward, [](Pf, Tok, CPf, I64 N, I64 C) { return bytes(N * (8.0 * C + 4)); });
    TQ_WRAP(embedding_backward,
            [](Pf, CPf, Tok, I64 N, I64 C) { return bytes(N * (12.0 * C + 4)); });
    TQ_WRAP(embedding_forward_bf16,
            [](Pf, Tok, CPh, I64 N, I64 C) { return bytes(N * (6.0 * C + 4)); });
    TQ_WRAP(embedding_backward_bf16,
            [](Ph, CPf, Tok, I64 N, I64 C) { return bytes(N * (8.0 * C + 4)); });
    TQ_WRAP(rmsnorm_forward, [](Pf, Pf, CPf, CPf, I64 N, I64 C, double) {
      return bytes(8.0 * N * C + 4.0 * (N + C));
    });
    TQ_WRAP(rmsnorm_backward, [](Pf, Pf, CPf, CPf, CPf, CPf, I64 N, I64 C) {
      return bytes(12.0 * N * C + 4.0 * N + 12.0 * C);
    });
    // out = x Wᵀ; dx = dout W and dW (+)= doutᵀ x (the SGD ones: W read and written instead)
    TQ_WRAP(matmul_forward, [](Pf, CPf, CPf, I64 N, I64 IC, I64 OC) {
      return product(N, IC, OC, 1, 4.0 * (N * IC + IC * OC + N * OC));
    });
    TQ_WRAP(matmul_backward, [](Pf, Pf, CPf, CPf, CPf, I64 N, I64 IC, I64 OC) {
      return product(N, IC, OC, 2, 4.0 * (N * OC + 2 * N * IC) + 12.0 * IC * OC);
    });
    TQ_WRAP(matmul_forward_bf16w, [](Act out, Act x, CPh, I64 N, I64 IC, I64 OC) {
      return product(N, IC, OC, 1, es(x) * N * IC + 2.0 * IC * OC + es(out) * N * OC);
    });
    TQ_WRAP(matmul_backward_bf16w, [](Act dx, Pf, Act dout, Act x, CPh, I64 N, I64 IC, I64 OC) {
      return product(N, IC, OC, 2, es(dout) * N * OC + (es(x) + es(dx)) * N * IC + 10.0 * IC * OC);
    });
    TQ_WRAP(matmul_backward_bf16g, [](Act dx, Ph, Act dout, Act x, CPh, I64 N, I64 IC, I64 OC) {
      return product(N, IC, OC, 2, es(dout) * N * OC + (es(x) + es(dx)) * N * IC + 4.0 * IC * OC);
    });
    TQ_WRAP(matmul_backward_sgd, [](Pf, Pf, CPf, CPf, I64 N, I64 IC, I64 OC, float) {
      return product(N, IC, OC, 2, 4.0 * (N * OC + 2 * N * IC) + 8.0 * IC * OC);
    });
    TQ_WRAP(matmul_backward_sgd_bf16w, [](Act dx, Ph, Act dout, Act x, I64 N, I64 IC, I64 OC,
                                          float) {
      return product(N, IC, OC, 2, es(dout) * N * OC + (es(x) + es(dx)) * N * IC + 4.0 * IC * OC);
    });
    // the composition attention_qkn_* fuses: qkv [N, (H + 2 KVH) D] into q, k, v and back
    TQ_WRAP(qkv_split_forward, [](Pf, Pf, Pf, CPf, I64 N, I64 H, I64 KVH, I64 D) {
      return bytes(8.0 * N * (H + 2 * KVH) * D);
    });
    TQ_WRAP(qkv_split_backward, [](Pf, CPf, CPf, CPf, I64 N, I64 H, I64 KVH, I64 D) {
      return bytes(8.0 * N * (H + 2 * KVH) * D);
    });
    TQ_WRAP(rope_forward, [](Pf, CPf, CPf, CPf, I64 B, I64 T, I64 NH, I64 D, Tok) {
      return bytes(8.0 * B * T * NH * D);
    });
    TQ_WRAP(rope_backward, [](Pf, CPf, CPf, CPf, I64 B, I64 T, I64 NH, I64 D, Tok) {
      return bytes(8.0 * B * T * NH * D);
    });
    TQ_WRAP(qk_norm_rope_forward, [](Pf, Pf, Pf, Pf, Pf, CPf, CPf, CPf, CPf, CPf, I64 B, I64 T,
                                     I64 H, I64 KVH, I64 D, double, bool, bool h16, Tok) {
      return bytes((h16 ? 4.0 : 8.0) * B * T * (H + 2 * KVH) * D);
    });
    TQ_WRAP(qk_norm_rope_backward, [](Pf, Pf, Pf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, CPf,
                                      I64 B, I64 T, I64 H, I64 KVH, I64 D, bool, bool h16, Tok) {
      return bytes((h16 ? 6.0 : 12.0) * B * T * (H + 2 * KVH) * D);
    });
    // head rows: q, k, v and out (forward); those, dout and the gradients of q, k, v (backward)
    TQ_WRAP(attention_forward,
            [](Pf, Pf, CPf, CPf, CPf, I64 B, I64 T, I64 H, I64 KVH, I64 D, Tok doc) {
              return attention(B, T, H, D, 1, 4, 2 * (H + KVH), doc);
            });
    TQ_WRAP(attention_backward,
            [](Pf, Pf, Pf, CPf, CPf, CPf, CPf, CPf, CPf, I64 B, I64 T, I64 H, I64 KVH, I64 D,
               Tok doc) { return attention(B, T, H, D, 2, 4, 4 * (H + KVH), doc); });
    TQ_WRAP(attention_forward_bf16,
            [](Pf, Pf, CPf, CPf, CPf, I64 B, I64 T, I64 H, I64 KVH, I64 D, bool h16, Tok doc) {
              return attention(B, T, H, D, 1, h16 ? 2 : 4, 2 * (H + KVH), doc);
            });
    TQ_WRAP(attention_backward_bf16, [](Pf, Pf, Pf, CPf, CPf, CPf, CPf, CPf, CPf, I64 B, I64 T,
                                        I64 H, I64 KVH, I64 D, bool h16, Tok doc) {
      return attention(B, T, H, D, 2, h16 ? 2 : 4, 4 * (H + KVH), doc);
    });
    TQ_WRAP(attention_qkn_forward, [](Pf, Pf, Pf, Pf, CPf, CPf, CPf, CPf, CPf, I64 B, I64 T, I64 H,
                                      I64 KVH, I64 D, double, bool, bool h16, Tok doc) {
      return attention(B, T, H, D, 1, h16 ? 2 : 4, 2 * (H + KVH), doc);
    });
    TQ_WRAP(attention_qkn_backward,
            [](Pf, Pf, Pf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, CPf, I64 B, I64 T, I64 H,
               I64 KVH, I64 D, bool, bool h16,
               Tok doc) { return attention(B, T, H, D, 2, h16 ? 2 : 4, 4 * (H + KVH), doc); });
    // q and out rows, and the len[b] cached key and value rows each sequence reads
    TQ_WRAP(attention_decode, [](Pf, CPf, CPf, CPf, Tok len, I64 B, I64 H, I64 KVH, I64 D, I64,
                                 bool, bool h16) {
      std::vector<int32_t> n(static_cast<size_t>(B));
      g_inner->download(n.data(), len, n.size() * 4);
      double keys = 0;
      for (int32_t x : n) keys += x;
      return Cost{4.0 * double(H * D) * keys,
                  (h16 ? 2.0 : 4.0) * double(D) * (2.0 * double(B * H) + 2.0 * double(KVH) * keys)};
    });
    // in [N, 2F] and out [N, F], their gradients backward
    TQ_WRAP(swiglu_forward, [](Pf, CPf, I64 N, I64 F, bool) { return bytes(12.0 * N * F); });
    TQ_WRAP(swiglu_backward, [](Pf, CPf, CPf, I64 N, I64 F, bool) { return bytes(20.0 * N * F); });
    TQ_WRAP(swiglu_forward_bf16, [](Ph, CPh, I64 N, I64 F) { return bytes(6.0 * N * F); });
    TQ_WRAP(swiglu_backward_bf16, [](Ph, CPh, CPh, I64 N, I64 F) { return bytes(10.0 * N * F); });
    TQ_WRAP(crossentropy_forward, [](Pf, CPf, Tok, I64 N, I64 V) { return bytes(4.0 * N * V); });
    TQ_WRAP(crossentropy_backward,
            [](Pf, CPf, CPf, Tok, I64 N, I64 V, double) { return bytes(8.0 * N * V); });
    TQ_WRAP(add_inplace, [](Pf, CPf, I64 n) { return bytes(12.0 * n); });
    TQ_WRAP(round_bf16_inplace, [](Pf, I64 n) { return bytes(8.0 * n); });
    TQ_WRAP(add_rmsnorm_forward, [](Pf, Pf, Pf, CPf, CPf, CPf, I64 N, I64 C, double, bool) {
      return bytes(16.0 * N * C + 4.0 * (N + C));
    });
    TQ_WRAP(rmsnorm_backward_add, [](Pf, Pf, CPf, CPf, CPf, CPf, I64 N, I64 C, bool) {
      return bytes(16.0 * N * C + 4.0 * N + 12.0 * C);
    });
    TQ_WRAP(sgd_update_f32, [](Pf, CPf, I64 n, float) { return bytes(12.0 * n); });
    TQ_WRAP(sgd_update_bf16, [](Ph, CPh, I64 n, float) { return bytes(6.0 * n); });
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
  for (KernelTime& k : g_times) k.seconds = 0, k.calls = 0, k.flops = 0, k.bytes = 0;
}

}  // namespace tq
