// The Qwen3 training step, written once against a backend's Ops table.
// Arenas: params, grads (same layout as params; with sgd_only, just the parameters the fused
// step cannot take, one after another), activations (saved for backward) and scratch; all
// allocated in the constructor, so memory use is known before step 0.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/common.h"
#include "model/config.h"
#include "model/ops.h"

namespace tq {

// B independent sequences of T tokens; targets are the next tokens.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens;   // [B*T]
  std::vector<int32_t> targets;  // [B*T]
  // Empty: causal attention, token t of a row sees tokens 0..t at RoPE position t. Else
  // block-causal (packed documents): doc_start[b*T + t] is where t's document starts in its row,
  // t sees tokens doc_start..t and its RoPE position is t - doc_start. Each row's values start
  // at 0 and never decrease, and doc_start[t] <= t (Qwen3::forward checks).
  std::vector<int32_t> doc_start;
};
// The walkthrough's fixed batch, repeated B times: tokens[t] = t % V, targets[t] = (t+1) % V.
Batch fixed_batch(int64_t B, int64_t T, int64_t V);
// Marks b's documents for block-causal attention (b.doc_start), TorchTitan's rule for a stream
// of documents each followed by the end-of-text id `eos`: a document starts at each row's first
// token and after every eos; an eos belongs to the document it ends.
void mark_documents(Batch& b, int32_t eos);

// RoPE tables, spec §5: fp32 inv_freq, angle, cos, sin. cos/sin: [T, D/2].
void rope_tables(std::vector<float>& cos, std::vector<float>& sin, int64_t T, int64_t D,
                 double theta);

// How a Qwen3 is used, which decides its arenas:
//  train:    forward and backward, any optimizer;
//  sgd:      trained by backward_sgd alone (see the constructor);
//  eval:     forward only (eval, a loss over windows): no gradients, and one layer's activations
//            that every layer reuses; a forward may take fewer rows (B) or tokens (T) than built;
//  generate: prefill and decode over a KV cache of B sequences of up to T tokens, in the
//            activations' storage (bf16 in bf16 runs on backends with bf16 activations).
enum class Use { train, sgd, eval, generate };

struct MemoryPlan {
  size_t params, grads, activations, scratch;  // bytes
  size_t cache = 0;                            // the KV cache (Use::generate)
  size_t optimizer = 0;                        // the trainer's, beside the model (train/trainer.h)
  size_t total() const { return params + grads + activations + scratch + cache + optimizer; }
};
// Whether a run of this dtype on this backend keeps its large activations in bf16 storage:
// the feed-forward block's (SwiGLU's input and output), the attention block's (the fused
// projection qkv, q, k, v, the attention output) and their gradients. bf16 runs on backends
// with the bf16 products, SwiGLU, the fused QK-norm + RoPE and bf16 attention (Ops).
bool bf16_acts(const Ops& ops, DType dtype);
// The arenas of a Qwen3(cfg, dtype, B, T, ops, use).
MemoryPlan memory_plan(const Config& cfg, DType dtype, int64_t B, int64_t T, const Ops& ops,
                       Use use = Use::train);

class Qwen3 {
 public:
  // Use::sgd: trained by backward_sgd alone. Where the backend steps the matrices inside
  // backward, the gradient arena then holds only the other parameters' gradients (the
  // embedding or tied head and the norms: 0.6B bf16 311 MiB, not 1137), and backward(),
  // sgd_update() and get_grads() refuse. Use::eval and Use::generate keep no gradients.
  Qwen3(const Config& cfg, DType dtype, int64_t B, int64_t T, const Ops& ops, Use use = Use::train);
  ~Qwen3();
  Qwen3(const Qwen3&) = delete;
  Qwen3& operator=(const Qwen3&) = delete;

  const Config& cfg() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  // Host fp32 copies of arena elements [off, off+n), or of the whole arena. In bf16 mode the
  // arenas hold bf16: set_params rounds to nearest even, the getters widen exactly.
  void set_params(const float* host, size_t off, size_t n);
  void get_params(float* host, size_t off, size_t n) const;
  void set_params(const float* host) { set_params(host, 0, layout_.total); }
  void get_params(float* host) const { get_params(host, 0, layout_.total); }
  void get_grads(float* host) const;
  // The same within the backend, for an optimizer that runs there (train/): the gradient
  // arena into fp32 dst (widened where bf16), and the parameter arena itself (fp32 or bf16 as
  // the dtype), which such an optimizer writes.
  void grads_into(float* dst) const { grads_into(dst, 0, layout_.total); }
  void grads_into(float* dst, size_t off, size_t n) const;  // elements [off, off+n) of both
  // Called by backward() as gradients become final, with `from` such that all of [from,
  // total) are (the final norm's and the head's first, then each layer's, last to first, then
  // the embedding's: from = 0): a data-parallel run starts their all-reduce while the rest of
  // the backward runs. Null: none.
  void on_grads_ready(std::function<void(size_t from)> f) { ready_ = std::move(f); }
  void* params_arena() { return params_; }
  // This model's parameters := those of `from` (the same config and dtype), within the backend.
  void copy_params(const Qwen3& from);

  // Mean loss; saves activations for backward (Use::eval: batch.B and batch.T may be smaller
  // than built; nothing is kept for a backward)
  double forward(const Batch& batch);
  // The last forward's logits of rows [n0, n0 + n) (of its B*T), as fp32 [n, V] on the host.
  void logits(float* host, int64_t n0, int64_t n) const;

  // Generation (Use::generate), over the KV cache of the built B sequences of up to T tokens.
  // prefill: tokens [n] start sequence `row` (its cache emptied first): the layers' forward
  // over them, their keys and values kept; the last token's logits into host [V], if given.
  // decode: one token for each of sequences 0..B-1 (B at most the built), each at the position
  // after its cached ones, attending to them and itself; their logits into host [B, V].
  void prefill(int64_t row, const int32_t* tokens, int64_t n, float* logits);
  void decode(const int32_t* tokens, int64_t B, float* logits);
  int64_t cached(int64_t row) const { return len_.at(size_t(row)); }  // tokens in its cache
  void backward();  // grads of the last forward (grads are zeroed first)
  void sgd_update(float lr);
  // backward + sgd_update(lr) in one pass where the backend can: each weight with a single
  // gradient contribution takes its step inside its weight-gradient product, so its gradient
  // never reaches the gradient arena (which then holds only the other parameters' grads).
  void backward_sgd(float lr);
  // argmax(logits[n]) == target[n] count for the last forward
  int64_t correct(const Batch& batch) const;

 private:
  float* rb(float* p, int64_t n);  // round to bf16 in bf16 mode; returns p
  // A layer's view of parameter `off` (n elements) as fp32, and where it adds its gradient.
  // fp32: the arenas themselves. bf16: wbuf_ holds the widened weight and gbuf_ collects
  // the gradient, which grad_done folds into the bf16 grads (bf16(g + dg), as PyTorch sums
  // a bf16 parameter's gradient contributions). Where the backend can, bf16 runs write the
  // matrices' and the embedding's gradients into the bf16 grads themselves, with those bits.
  const float* weight(size_t off, int64_t n);
  float* grad(size_t off, int64_t n);
  void grad_done(size_t off, int64_t n);
  void backward_pass();  // backward, or with fuse_lr_ > 0 backward_sgd's
  // where parameters [off, off+n) keep their gradient in grads_ (an element index)
  size_t gslot(size_t off, size_t n) const;
  struct GradSlot {
    size_t off, n, at;  // parameters [off, off+n) at grads_[at..]
  };
  std::vector<GradSlot> gslots_;
  bool compact_grads_ = false;  // gradient slots only for unfused_ (sgd_only)
  // matmul_forward / matmul_backward with weight `off` [OC, IC]; bf16 runs hand the bf16
  // weight to the backend's bf16 products where it has them. out and dx come back rounded to
  // bf16 in bf16 runs (by those products, else here).
  // Activations in bf16 storage only where the bf16w products run (bf16_acts_).
  void linear_forward(Act out, Act x, size_t off, int64_t IC, int64_t OC, int64_t N);
  void linear_forward(Act out, Act x, size_t off, int64_t IC, int64_t OC) {
    linear_forward(out, x, off, IC, OC, N_);  // the pass's rows
  }
  void linear_backward(Act dx, Act dout, Act x, size_t off, int64_t IC, int64_t OC);
  // y[N, C] = a + b, and out, rstd its RMSNorm with weight `off` (rounded to bf16 in bf16 runs)
  void add_norm_forward(float* y, float* out, float* rstd, const float* a, const float* b,
                        size_t off);
  // dres_ += the input gradient of the RMSNorm with weight `off` (x its input [N, C], rstd its
  // saved statistic) for its output gradient g; the weight's gradient collected
  void norm_backward_add(size_t off, const float* g, const float* x, const float* rstd);
  bool fused(size_t off) const;  // takes its SGD step in linear_backward (fuse_lr_ > 0)
  float fuse_lr_ = 0;
  std::function<void(size_t)> ready_;               // on_grads_ready's
  std::vector<std::pair<size_t, size_t>> unfused_;  // [offset, count) left to sgd_update
  struct LayerActs {
    float *res, *xn1, *rstd1, *qkv, *v, *qrstd, *krstd, *q, *k, *att, *lse, *mid, *xn2, *rstd2, *ab,
        *m;
  };
  // The layers' forward over tokens_ (N_ rows of B_ sequences of T_ tokens) from the embedding
  // to the final norm's output xnf_. Attention: training's (a causal or block-causal batch), or
  // over the KV cache: prefill (sequence gen_row_ from position 0) or decode (one token a row).
  enum class Attend { batch, prefill, decode };
  void layers_forward(Attend how);
  // q, k, v and the norms' rstd from the fused projection: qk_norm_rope_forward or its
  // composition; positions as `doc` says (ops.h)
  void qk_norm_rope(float* q, float* k, float* v, const LayerActs& a, const float* qkw,
                    const int32_t* doc);
  // attention_forward (bf16: *_bf16) over the pass's B_ sequences of T_ tokens into a.att,
  // rounded to bf16 in bf16 runs
  void attention(const LayerActs& a, const float* q, const float* k, const float* v,
                 const int32_t* doc);
  void attend_cached(const LayerActs& a, int64_t l, const float* qkw, Attend how);
  // the head over rows [n0, n0 + n) of xnf_ into logits_, downloaded into host [n, V]
  void head_logits(int64_t n0, int64_t n, float* host);

  const Config& cfg_;
  ParamLayout layout_;
  DType dtype_;
  Use use_;
  int64_t Bmax_, Tmax_;  // as built
  int64_t B_, T_, N_;    // the current pass's sequences, tokens each, rows
  const Ops& ops_;
  bool can_fuse_ = false;  // the backend steps this dtype's matrices inside backward
  // qkv, q, k, v, att, ab, m and the gradients qkv_ (dqkv), dq_, dk_, dv_, datt_, dab_, dm_
  // hold bf16 bits (their float* views then point at uint16_t arrays)
  const bool bf16_acts_ = bf16_acts(ops_, dtype_);
  bool qkn_ = false;       // attention takes QK-norm and RoPE in: no q, k, v, dq, dk, dv, dqr, dkr
  void *params_, *grads_;  // float or uint16_t (bf16) [layout_.total]
  float *acts_, *scratch_;
  // bf16 mode: the fp32 view of a weight [wview_] and a gradient [gview_], each as large as
  // the largest parameter that needs one in this run
  float *wbuf_ = nullptr, *gbuf_ = nullptr;
  size_t wview_ = 0, gview_ = 0;
  std::vector<LayerActs> la_;
  float *res_final_, *xnf_, *rstdf_, *logits_, *lse_ce_;  // final norm + head
  float *qkv_, *tmp_, *dres_, *dtmp_, *dxn_, *dab_, *dm_, *datt_, *dq_, *dk_, *dv_, *dqr_, *dkr_;
  float *cos_, *sin_;
  int32_t *tokens_, *targets_;    // [N] of the last forward, in the backend's memory
  int32_t* docs_;                 // [N]: the last forward's doc_start, uploaded where it had one
  const int32_t* doc_ = nullptr;  // the kernels' doc argument (ops.h): docs_, or null (causal)
  // Use::generate: the cache [L][2][Bmax][Tmax][KVH D] (keys, then values, of each layer) in
  // the activations' storage; q [Tmax rows, H D], and a decode step's new keys and values
  // [Bmax, KVH D] before they are copied into their rows; lens_ [Bmax] what decode attends to
  void* cache_ = nullptr;
  float *q_ = nullptr, *knew_ = nullptr, *vnew_ = nullptr;
  int32_t* lens_ = nullptr;
  std::vector<int64_t> len_;  // each sequence's cached tokens
  int64_t gen_row_ = 0;       // the sequence a prefill fills
  char* cache_at(int64_t l, int64_t kv, int64_t b, int64_t t) const;  // kv 0: keys, 1: values
};

}  // namespace tq
