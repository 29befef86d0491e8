// Reference forward of the whole model (spec §2), built from the reference tier only:
// `check` uses it so a checkpoint is judged independently of the training code path.
#pragma once
#include <vector>

#include "model/config.h"
#include "model/qwen3.h"
#include "ref/layers.h"

namespace tq::ref {

// Mean cross-entropy of `batch` under params (fp32 arena, make_layout order); block-causal
// where the batch marks its documents (Batch::doc_start).
// Counts argmax hits into *correct and copies the logits [B*T, V] when asked.
inline double model_loss(const Config& c, const float* params, const Batch& batch,
                         int64_t* correct = nullptr, std::vector<float>* logits_out = nullptr) {
  const ParamLayout p = make_layout(c);
  const int64_t B = batch.B, T = batch.T, N = B * T, C = c.C, H = c.H, K = c.KVH, D = c.D;
  std::vector<float> h(N * C), x(N * C), r(N * H), qkv(N * c.qkv_rows()), q(N * H * D),
      k(N * K * D), v(N * K * D), att(N * H * D), lse(B * H * T), y(N * C), ab(N * 2 * c.F),
      m(N * c.F), logits(N * c.V), cs, sn;
  rope_tables(cs, sn, T, D, c.theta);
  const int32_t* doc = batch.doc_start.empty() ? nullptr : batch.doc_start.data();
  embedding_forward(h.data(), batch.tokens.data(), params + p.tok_emb, N, C);
  for (int64_t l = 0; l < c.L; ++l) {
    const ParamLayout::Layer& w = p.layers[l];
    rmsnorm_forward(x.data(), r.data(), h.data(), params + w.attn_norm, N, C, c.eps);
    matmul_forward(qkv.data(), x.data(), params + w.wqkv, N, C, c.qkv_rows());
    qkv_split_forward(q.data(), k.data(), v.data(), qkv.data(), N, H, K, D);
    rmsnorm_forward(q.data(), r.data(), q.data(), params + w.q_norm, N * H, D, c.eps);
    rmsnorm_forward(k.data(), r.data(), k.data(), params + w.k_norm, N * K, D, c.eps);
    rope_forward(q.data(), q.data(), cs.data(), sn.data(), B, T, H, D, doc);
    rope_forward(k.data(), k.data(), cs.data(), sn.data(), B, T, K, D, doc);
    attention_forward(att.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, K, D, doc);
    matmul_forward(y.data(), att.data(), params + w.wo, N, H * D, C);
    for (int64_t i = 0; i < N * C; ++i) h[i] += y[i];
    rmsnorm_forward(x.data(), r.data(), h.data(), params + w.ffn_norm, N, C, c.eps);
    // w1 and w3 are adjacent in the arena: one [2F, C] matrix
    matmul_forward(ab.data(), x.data(), params + w.w1, N, C, 2 * c.F);
    swiglu_forward(m.data(), ab.data(), N, c.F);
    matmul_forward(y.data(), m.data(), params + w.w2, N, c.F, C);
    for (int64_t i = 0; i < N * C; ++i) h[i] += y[i];
  }
  rmsnorm_forward(x.data(), r.data(), h.data(), params + p.norm, N, C, c.eps);
  matmul_forward(logits.data(), x.data(), params + p.lm_head, N, C, c.V);
  if (correct) {
    *correct = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* row = logits.data() + n * c.V;
      int64_t best = 0;
      for (int64_t j = 1; j < c.V; ++j)
        if (row[j] > row[best]) best = j;
      *correct += best == batch.targets[n];
    }
  }
  if (logits_out) *logits_out = logits;
  return crossentropy_forward(r.data(), logits.data(), batch.targets.data(), N, c.V);
}

}  // namespace tq::ref
