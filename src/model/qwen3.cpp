#include "model/qwen3.h"

#include <algorithm>
#include <cmath>

namespace tq {

Batch fixed_batch(int64_t B, int64_t T, int64_t V) {
  Batch b;
  b.B = B;
  b.T = T;
  for (int64_t s = 0; s < B; ++s)
    for (int64_t t = 0; t < T; ++t) {
      b.tokens.push_back(static_cast<int32_t>(t % V));
      b.targets.push_back(static_cast<int32_t>((t + 1) % V));
    }
  return b;
}

void mark_documents(Batch& b, int32_t eos) {
  b.doc_start.resize(b.tokens.size());
  for (int64_t r = 0; r < b.B; ++r) {
    int32_t start = 0;
    for (int64_t t = 0; t < b.T; ++t) {
      if (t > 0 && b.tokens[size_t(r * b.T + t - 1)] == eos) start = int32_t(t);
      b.doc_start[size_t(r * b.T + t)] = start;
    }
  }
}

void rope_tables(std::vector<float>& cos, std::vector<float>& sin, int64_t T, int64_t D,
                 double theta) {
  const int64_t D2 = D / 2;
  std::vector<float> inv_freq(D2);
  for (int64_t i = 0; i < D2; ++i)
    inv_freq[i] = 1.0f / std::pow(float(theta), float(2 * i) / float(D));
  cos.resize(T * D2);
  sin.resize(T * D2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D2; ++i) {
      const float a = float(t) * inv_freq[i];
      cos[t * D2 + i] = std::cos(a);
      sin[t * D2 + i] = std::sin(a);
    }
}

bool bf16_acts(const Ops& o, DType dtype) {
  return dtype == DType::bf16 && o.swiglu_forward_bf16 && o.swiglu_backward_bf16 &&
         o.matmul_forward_bf16w && o.matmul_backward_bf16w && o.matmul_backward_sgd_bf16w &&
         o.qk_norm_rope_forward && o.qk_norm_rope_backward && o.attention_forward_bf16 &&
         o.attention_backward_bf16;
}
// Floats that hold n elements: fp32, or bf16 (h16)
static int64_t floats(int64_t n, bool h16) {
  return h16 ? (n + 1) / 2 : n;
}

// Floats of attention's stats (ops.h) for the attention this run calls.
static int64_t attn_stats(const Config& c, DType dtype, int64_t B, int64_t T, const Ops& o) {
  const bool bf = dtype == DType::bf16 && o.attention_forward_bf16;
  return o.attention_stats ? o.attention_stats(B, T, c.H, c.KVH, c.D, bf) : B * c.H * T;
}

// Whether attention takes QK-norm and RoPE in (Ops::attention_qkn_*): then no q, k, v nor their
// gradients are kept.
static bool attn_qkn(const Ops& o, DType dtype) {
  return o.attention_qkn_forward && o.attention_qkn_backward &&
         (dtype == DType::f32 || o.attention_forward_bf16);
}

// Sizes (floats) of the per-layer saved activations, in LayerActs order (stats: attention's).
static std::vector<int64_t> layer_act_sizes(const Config& c, int64_t B, int64_t T, bool h16,
                                            int64_t stats, bool qkn) {
  const int64_t N = B * T;
  const int64_t HD = c.H * c.D, QD = qkn ? 0 : HD, KD = qkn ? 0 : c.KVH * c.D;  // (q; k and v)
  const auto f = [h16](int64_t n) { return floats(n, h16); };  // those stored as bf16 in h16
  // res, xn1, rstd1, qkv, v, qrstd, krstd, q, k, att, lse, mid, xn2, rstd2, ab, m
  // clang-format off
  return {N * c.C,        N * c.C,   N,         f(N * c.qkv_rows()), f(N * KD), N * c.H, N * c.KVH,
          f(N * QD),      f(N * KD), f(N * HD), stats,               N * c.C,   N * c.C, N,
          f(N * 2 * c.F), f(N * c.F)};
  // clang-format on
}
static int64_t final_act_size(const Config& c, int64_t N) {
  return N * c.C + N * c.C + N + N * c.V + N;  // res_final, xnf, rstdf, logits, lse_ce
}
static std::vector<int64_t> scratch_sizes(const Config& c, int64_t B, int64_t T, bool h16,
                                          bool qkn) {
  const int64_t N = B * T, HD = c.H * c.D, KD = qkn ? 0 : c.KVH * c.D;
  const auto f = [h16](int64_t n) { return floats(n, h16); };  // those stored as bf16 in h16
  // qkv, tmp, dres, dtmp, dxn, dab, dm, datt, dq, dk, dv, dqr, dkr, tokens, targets, cos, sin,
  // docs (with qkn no dq, dk, dv, dqr, dkr: KD 0 and QD for dq, dqr)
  const int64_t QD = qkn ? 0 : HD;
  return {f(N * c.qkv_rows()), N * c.C,     N * c.C,   N * c.C,   N * c.C,
          f(N * 2 * c.F),      f(N * c.F),  f(N * HD), f(N * QD), f(N * KD),
          f(N * KD),           N * QD,      N * KD,    N,         N,
          T * c.D / 2,         T * c.D / 2, N};
}
static int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

static uint16_t* u16(float* p) {  // a view holding bf16 bits
  return reinterpret_cast<uint16_t*>(p);
}

static size_t largest_param(const ParamLayout& p) {
  size_t n = 0;
  for (const ParamView& v : p.params) n = std::max(n, v.numel);
  if (!p.layers.empty()) n = std::max(n, p.layers[0].w2 - p.layers[0].w1);  // w1|w3 as one
  return n;
}

static bool can_fuse(const Ops& o, DType dtype) {
  return dtype == DType::f32 ? o.matmul_backward_sgd != nullptr
                             : o.matmul_backward_sgd_bf16w != nullptr;
}

// The parameters the fused step cannot take (embedding, tied head, norms; with no fused step,
// all of them) as [offset, count) ranges, adjacent ones merged.
static std::vector<std::pair<size_t, size_t>> unfused_ranges(const ParamLayout& p, bool fuse) {
  std::vector<std::pair<size_t, size_t>> r;
  for (const ParamView& v : p.params) {
    bool matrix = v.offset == p.lm_head && p.lm_head != p.tok_emb;
    for (const ParamLayout::Layer& w : p.layers)
      matrix |= v.offset == w.wqkv || v.offset == w.wo || v.offset == w.w1 || v.offset == w.w3 ||
                v.offset == w.w2;
    if (matrix && fuse) continue;
    if (!r.empty() && r.back().first + r.back().second == v.offset)
      r.back().second += v.numel;
    else
      r.push_back({v.offset, v.numel});
  }
  return r;
}

namespace {
// What a run's arenas hold besides parameters and activations, from its backend and how it
// trains (sgd_only: by backward_sgd alone).
struct Needs {
  bool h16;      // bf16_acts
  bool compact;  // sgd_only, and the backend steps the matrices inside backward: gradient
                 // slots only for the unfused ranges
  std::vector<std::pair<size_t, size_t>> unfused;  // ranges sgd_update steps after backward
  size_t grads = 0;                                // elements of the gradient arena
  size_t wview = 0, gview = 0;  // bf16: fp32 elements of the weight view and gradient buffer
};
Needs needs(const Config& c, const ParamLayout& p, DType dtype, const Ops& o, bool sgd_only) {
  Needs n;
  n.h16 = bf16_acts(o, dtype);
  n.unfused = unfused_ranges(p, can_fuse(o, dtype));
  n.compact = sgd_only && can_fuse(o, dtype);
  n.grads = p.total;
  if (n.compact) {
    n.grads = 0;
    for (const auto& r : n.unfused) n.grads += r.second;
  }
  if (dtype == DType::bf16) {
    // weight() widens the norms (q_norm and k_norm together), the embedding table where the
    // backend cannot gather from bf16, and the matrices where it has no bf16 products;
    // grad() collects the gradient of the norms, the embedding's where the backend cannot add
    // it into bf16 itself, and the matrices' where it cannot store theirs (with the fused step
    // only a tied head's)
    const size_t small = size_t(std::max(c.C, 2 * c.D)), table = size_t(c.V * c.C);
    const bool mats16 = o.matmul_forward_bf16w && o.matmul_backward_bf16w;
    n.wview =
        std::max({small, o.embedding_forward_bf16 ? 0 : table, mats16 ? 0 : largest_param(p)});
    const size_t mats = o.matmul_backward_bf16g ? 0
                        : n.compact             ? (p.lm_head == p.tok_emb ? table : 0)
                                                : largest_param(p);
    n.gview = std::max({small, o.embedding_backward_bf16 ? 0 : table, mats});
  }
  return n;
}
}  // namespace

MemoryPlan memory_plan(const Config& c, DType dtype, int64_t B, int64_t T, const Ops& ops,
                       bool sgd_only) {
  const ParamLayout p = make_layout(c);
  const Needs n = needs(c, p, dtype, ops, sgd_only);
  const int64_t acts = c.L * sum(layer_act_sizes(c, B, T, n.h16, attn_stats(c, dtype, B, T, ops),
                                                 attn_qkn(ops, dtype)));
  return {p.total * dtype_size(dtype), n.grads * dtype_size(dtype),
          size_t(acts + final_act_size(c, B * T)) * 4,
          size_t(sum(scratch_sizes(c, B, T, n.h16, attn_qkn(ops, dtype)))) * 4 +
              (n.wview + n.gview) * 4};
}

Qwen3::Qwen3(const Config& cfg, DType dtype, int64_t B, int64_t T, const Ops& ops, bool sgd_only)
    : cfg_(cfg), layout_(make_layout(cfg)), dtype_(dtype), B_(B), T_(T), N_(B * T), ops_(ops) {
  const Needs need = needs(cfg, layout_, dtype, ops, sgd_only);
  const MemoryPlan plan = memory_plan(cfg, dtype, B, T, ops, sgd_only);
  unfused_ = need.unfused;
  can_fuse_ = can_fuse(ops, dtype);
  qkn_ = attn_qkn(ops, dtype);
  compact_grads_ = need.compact;
  size_t g = 0;  // gradient slots: the whole layout, or the unfused ranges one after another
  if (compact_grads_)
    for (const auto& [off, n] : unfused_) gslots_.push_back({off, n, g}), g += n;
  else
    gslots_.push_back({0, layout_.total, 0});
  params_ = ops.alloc(plan.params);
  grads_ = ops.alloc(plan.grads);
  acts_ = static_cast<float*>(ops.alloc(plan.activations));
  scratch_ = static_cast<float*>(ops.alloc(plan.scratch));
  float* p = acts_;
  const std::vector<int64_t> ls =
      layer_act_sizes(cfg, B, T, bf16_acts_, attn_stats(cfg, dtype, B, T, ops), qkn_);
  for (int64_t l = 0; l < cfg.L; ++l) {
    LayerActs a;
    float** views[] = {&a.res, &a.xn1, &a.rstd1, &a.qkv, &a.v,   &a.qrstd, &a.krstd, &a.q,
                       &a.k,   &a.att, &a.lse,   &a.mid, &a.xn2, &a.rstd2, &a.ab,    &a.m};
    for (size_t i = 0; i < ls.size(); ++i) *views[i] = p, p += ls[i];
    la_.push_back(a);
  }
  res_final_ = p, p += N_ * cfg.C;
  xnf_ = p, p += N_ * cfg.C;
  rstdf_ = p, p += N_;
  logits_ = p, p += N_ * cfg.V;
  lse_ce_ = p;
  float* ids[3];  // tokens, targets, docs: int32 in the backend's memory, as the kernels read them
  float** sviews[] = {&qkv_, &tmp_, &dres_, &dtmp_, &dxn_,   &dab_,   &dm_,  &datt_, &dq_,
                      &dk_,  &dv_,  &dqr_,  &dkr_,  &ids[0], &ids[1], &cos_, &sin_,  &ids[2]};
  const std::vector<int64_t> ss = scratch_sizes(cfg, B, T, bf16_acts_, qkn_);
  p = scratch_;
  for (size_t i = 0; i < ss.size(); ++i) *sviews[i] = p, p += ss[i];
  tokens_ = reinterpret_cast<int32_t*>(ids[0]);
  targets_ = reinterpret_cast<int32_t*>(ids[1]);
  docs_ = reinterpret_cast<int32_t*>(ids[2]);
  if (dtype == DType::bf16) {
    wbuf_ = p;
    gbuf_ = p + need.wview;
    wview_ = need.wview, gview_ = need.gview;
  }
  std::vector<float> c, s;
  rope_tables(c, s, T, cfg.D, cfg.theta);
  ops.upload(cos_, c.data(), c.size() * 4);
  ops.upload(sin_, s.data(), s.size() * 4);
}

Qwen3::~Qwen3() {
  for (void* p : {params_, grads_, static_cast<void*>(acts_), static_cast<void*>(scratch_)})
    ops_.release(p);
}

void Qwen3::set_params(const float* host, size_t off, size_t n) {
  if (dtype_ == DType::f32) return ops_.upload(static_cast<float*>(params_) + off, host, n * 4);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(host[i]);
  ops_.upload(static_cast<uint16_t*>(params_) + off, b.data(), n * 2);
}

static void download_arena(const Ops& ops, float* host, const void* arena, size_t off, size_t n,
                           DType dt) {
  if (dt == DType::f32) return ops.download(host, static_cast<const float*>(arena) + off, n * 4);
  std::vector<uint16_t> b(n);
  ops.download(b.data(), static_cast<const uint16_t*>(arena) + off, n * 2);
  for (size_t i = 0; i < n; ++i) host[i] = bf16_to_f32(b[i]);
}
void Qwen3::get_params(float* host, size_t off, size_t n) const {
  download_arena(ops_, host, params_, off, n, dtype_);
}
void Qwen3::get_grads(float* host) const {
  if (compact_grads_) throw Error("get_grads: this model keeps gradients only for the fused step");
  download_arena(ops_, host, grads_, 0, layout_.total, dtype_);
}

void Qwen3::grads_into(float* dst) const {
  if (compact_grads_) throw Error("grads_into: this model keeps gradients only for the fused step");
  if (dtype_ == DType::f32) return ops_.copy(dst, static_cast<const float*>(grads_), layout_.total);
  ops_.bf16_to_f32(dst, static_cast<const uint16_t*>(grads_), int64_t(layout_.total));
}

size_t Qwen3::gslot(size_t off, size_t n) const {
  for (const GradSlot& s : gslots_)
    if (off >= s.off && off + n <= s.off + s.n) return s.at + (off - s.off);
  throw Error("no gradient slot for parameters [" + std::to_string(off) + ", " +
              std::to_string(off + n) + ")");  // (a model bug: see needs())
}

float* Qwen3::rb(float* p, int64_t n) {
  if (dtype_ == DType::bf16) ops_.round_bf16_inplace(p, n);
  return p;
}

const float* Qwen3::weight(size_t off, int64_t n) {
  if (dtype_ == DType::f32) return static_cast<const float*>(params_) + off;
  if (size_t(n) > wview_) throw Error("weight view too small (a model bug: see needs())");
  ops_.bf16_to_f32(wbuf_, static_cast<const uint16_t*>(params_) + off, n);
  return wbuf_;
}
float* Qwen3::grad(size_t off, int64_t n) {
  if (dtype_ == DType::f32) return static_cast<float*>(grads_) + gslot(off, size_t(n));
  if (size_t(n) > gview_) throw Error("gradient buffer too small (a model bug: see needs())");
  ops_.zero(gbuf_, n * 4);
  return gbuf_;
}
void Qwen3::grad_done(size_t off, int64_t n) {
  if (dtype_ == DType::bf16)
    ops_.bf16_accumulate(static_cast<uint16_t*>(grads_) + gslot(off, size_t(n)), gbuf_, n);
}

static float* f32(Act a) {  // (fp32 storage: the only kind outside the bf16w products)
  return static_cast<float*>(a.p);
}
void Qwen3::linear_forward(Act out, Act x, size_t off, int64_t IC, int64_t OC) {
  if (dtype_ == DType::bf16 && ops_.matmul_forward_bf16w)
    return ops_.matmul_forward_bf16w(out, x, static_cast<const uint16_t*>(params_) + off, N_, IC,
                                     OC);  // out rounded to bf16 by the op
  ops_.matmul_forward(f32(out), f32(x), weight(off, IC * OC), N_, IC, OC);
  rb(f32(out), N_ * OC);
}
bool Qwen3::fused(size_t off) const {
  return can_fuse_ && fuse_lr_ > 0 && off != layout_.tok_emb;  // a tied head: two contributions
}
void Qwen3::add_norm_forward(float* y, float* out, float* rstd, const float* a, const float* b,
                             size_t off) {
  const Ops& o = ops_;
  const int64_t N = N_, C = cfg_.C;
  if (o.add_rmsnorm_forward) {
    o.add_rmsnorm_forward(y, out, rstd, a, b, weight(off, C), N, C, cfg_.eps,
                          dtype_ == DType::bf16);
    return;
  }
  o.copy(y, a, N * C);
  o.add_inplace(y, b, N * C);
  rb(y, N * C);
  o.rmsnorm_forward(out, rstd, y, weight(off, C), N, C, cfg_.eps);
  rb(out, N * C);
}
void Qwen3::norm_backward_add(size_t off, const float* g, const float* x, const float* rstd) {
  const Ops& o = ops_;
  const int64_t N = N_, C = cfg_.C;
  if (o.rmsnorm_backward_add) {
    o.rmsnorm_backward_add(dres_, grad(off, C), g, x, rstd, weight(off, C), N, C,
                           dtype_ == DType::bf16);
  } else {
    o.rmsnorm_backward(dtmp_, grad(off, C), g, x, rstd, weight(off, C), N, C);
    o.add_inplace(dres_, rb(dtmp_, N * C), N * C);
    rb(dres_, N * C);
  }
  grad_done(off, C);
}

void Qwen3::linear_backward(Act dx, Act dout, Act x, size_t off, int64_t IC, int64_t OC) {
  if (fused(off)) {
    if (dtype_ == DType::f32)
      return ops_.matmul_backward_sgd(f32(dx), static_cast<float*>(params_) + off, f32(dout),
                                      f32(x), N_, IC, OC, fuse_lr_);
    return ops_.matmul_backward_sgd_bf16w(dx, static_cast<uint16_t*>(params_) + off, dout, x, N_,
                                          IC, OC, fuse_lr_);
  }
  // Stored, not added: every matrix's gradient has this one contribution, and a tied head's
  // comes before the embedding's
  if (dtype_ == DType::bf16 && ops_.matmul_backward_bf16g)
    return ops_.matmul_backward_bf16g(dx, static_cast<uint16_t*>(grads_) + gslot(off, IC * OC),
                                      dout, x, static_cast<const uint16_t*>(params_) + off, N_, IC,
                                      OC);
  if (dtype_ == DType::bf16 && ops_.matmul_backward_bf16w) {
    ops_.matmul_backward_bf16w(dx, grad(off, IC * OC), dout, x,
                               static_cast<const uint16_t*>(params_) + off, N_, IC, OC);
  } else {
    ops_.matmul_backward(f32(dx), grad(off, IC * OC), f32(dout), f32(x), weight(off, IC * OC), N_,
                         IC, OC);
    rb(f32(dx), N_ * IC);
  }
  grad_done(off, IC * OC);
}

double Qwen3::forward(const Batch& batch) {
  const Config& c = cfg_;
  const Ops& o = ops_;
  const int64_t N = N_, C = c.C, H = c.H, K = c.KVH, D = c.D, F = c.F, QKV = c.qkv_rows();
  if (int64_t(batch.tokens.size()) != N || int64_t(batch.targets.size()) != N)
    throw Error("batch of " + std::to_string(batch.tokens.size()) + " tokens, model built for " +
                std::to_string(N));
  o.upload(tokens_, batch.tokens.data(), size_t(N) * 4);
  o.upload(targets_, batch.targets.data(), size_t(N) * 4);
  doc_ = nullptr;
  if (!batch.doc_start.empty()) {
    // (the kernels skip the keys before each query's start, and read the positions from it)
    if (int64_t(batch.doc_start.size()) != N) throw Error("batch's doc_start is not [B*T]");
    for (int64_t n = 0; n < N; ++n) {
      const int32_t d = batch.doc_start[size_t(n)], t = int32_t(n % T_);
      if (d < 0 || d > t || (t > 0 && d < batch.doc_start[size_t(n - 1)]))
        throw Error("batch's doc_start[" + std::to_string(n) + "] = " + std::to_string(d) +
                    " is not a document start (0 <= start <= t, never decreasing in a row)");
    }
    o.upload(docs_, batch.doc_start.data(), size_t(N) * 4);
    doc_ = docs_;
  }
  if (dtype_ == DType::bf16 && o.embedding_forward_bf16)
    o.embedding_forward_bf16(la_[0].res, tokens_,
                             static_cast<const uint16_t*>(params_) + layout_.tok_emb, N, C);
  else
    o.embedding_forward(la_[0].res, tokens_, weight(layout_.tok_emb, c.V * C), N, C);
  // the first layer's input normalized; each residual add after normalizes its sum for what
  // reads it next: the feed-forward, the next layer or the final norm's output
  o.rmsnorm_forward(la_[0].xn1, la_[0].rstd1, la_[0].res, weight(layout_.layers[0].attn_norm, C), N,
                    C, c.eps);
  rb(la_[0].xn1, N * C);
  for (int64_t l = 0; l < c.L; ++l) {
    const ParamLayout::Layer& w = layout_.layers[l];
    const LayerActs& a = la_[l];
    const bool last = l + 1 == c.L;
    const bool h16 = bf16_acts_;  // qkv, q, k, v, att, ab, m in bf16 storage
    linear_forward({a.qkv, h16}, {a.xn1}, w.wqkv, C, QKV);
    // q_norm and k_norm are adjacent: widened together in bf16 runs
    const float* qkw = weight(w.q_norm, 2 * D);
    if (qkn_) {  // attention reads qkv itself (att rounded by the op in bf16 runs)
      o.attention_qkn_forward(a.att, a.lse, a.qrstd, a.krstd, a.qkv, qkw, qkw + D, cos_, sin_, B_,
                              T_, H, K, D, c.eps, dtype_ == DType::bf16, h16, doc_);
    } else {
      if (o.qk_norm_rope_forward) {
        o.qk_norm_rope_forward(a.q, a.k, a.v, a.qrstd, a.krstd, a.qkv, qkw, qkw + D, cos_, sin_, B_,
                               T_, H, K, D, c.eps, dtype_ == DType::bf16, h16, doc_);
      } else {  // the split's q, k into backward scratch (free until backward)
        o.qkv_split_forward(dqr_, dkr_, a.v, a.qkv, N, H, K, D);
        o.rmsnorm_forward(a.q, a.qrstd, dqr_, qkw, N * H, D, c.eps);
        o.rmsnorm_forward(a.k, a.krstd, dkr_, qkw + D, N * K, D, c.eps);
        rb(a.q, N * H * D), rb(a.k, N * K * D);
        o.rope_forward(a.q, a.q, cos_, sin_, B_, T_, H, D, doc_);
        o.rope_forward(a.k, a.k, cos_, sin_, B_, T_, K, D, doc_);
        rb(a.q, N * H * D), rb(a.k, N * K * D);
      }
      if (dtype_ == DType::bf16 && o.attention_forward_bf16) {  // att rounded by the op
        o.attention_forward_bf16(a.att, a.lse, a.q, a.k, a.v, B_, T_, H, K, D, h16, doc_);
      } else {
        o.attention_forward(a.att, a.lse, a.q, a.k, a.v, B_, T_, H, K, D, doc_);
        rb(a.att, N * H * D);
      }
    }
    linear_forward({tmp_}, {a.att, h16}, w.wo, H * D, C);
    add_norm_forward(a.mid, a.xn2, a.rstd2, a.res, tmp_, w.ffn_norm);
    // w1 and w3 are adjacent: one [2F, C] matmul
    linear_forward({a.ab, h16}, {a.xn2}, w.w1, C, 2 * F);
    if (h16)
      o.swiglu_forward_bf16(u16(a.m), u16(a.ab), N, F);
    else
      o.swiglu_forward(a.m, a.ab, N, F, dtype_ == DType::bf16);
    linear_forward({tmp_}, {a.m, h16}, w.w2, F, C);
    if (last)
      add_norm_forward(res_final_, xnf_, rstdf_, a.mid, tmp_, layout_.norm);
    else
      add_norm_forward(la_[l + 1].res, la_[l + 1].xn1, la_[l + 1].rstd1, a.mid, tmp_,
                       layout_.layers[l + 1].attn_norm);
  }
  linear_forward({logits_}, {xnf_}, layout_.lm_head, C, c.V);
  return o.crossentropy_forward(lse_ce_, logits_, targets_, N, c.V);
}

void Qwen3::backward() {
  if (compact_grads_) throw Error("backward: this model keeps gradients only for the fused step");
  backward_pass();
}

void Qwen3::backward_pass() {
  const Config& c = cfg_;
  const Ops& o = ops_;
  const int64_t N = N_, C = c.C, H = c.H, K = c.KVH, D = c.D, F = c.F, QKV = c.qkv_rows();
  if (fuse_lr_ > 0) {
    // (a tied head stores its gradient into bf16 before the embedding adds to it: not zeroed)
    const bool stored =
        dtype_ == DType::bf16 && o.matmul_backward_bf16g && layout_.lm_head == layout_.tok_emb;
    const size_t t0 = layout_.tok_emb, t1 = stored ? t0 + size_t(c.V * C) : t0;
    const auto zero = [&](size_t a, size_t b) {
      if (b > a)
        o.zero(static_cast<char*>(grads_) + gslot(a, b - a) * dtype_size(dtype_),
               (b - a) * dtype_size(dtype_));
    };
    for (const auto& [off, n] : unfused_)
      zero(off, std::min(off + n, std::max(off, t0))), zero(std::max(off, t1), off + n);
  } else
    o.zero(grads_, layout_.total * dtype_size(dtype_));
  // Each gradient collected in fp32 is bracketed by grad(off, n) ... grad_done(off, n).
  // logits -> dlogits in place
  o.crossentropy_backward(logits_, logits_, lse_ce_, targets_, N, c.V, 1.0 / N);
  rb(logits_, N * c.V);
  const size_t head = layout_.lm_head, fnorm = layout_.norm;
  linear_backward({dxn_}, {logits_}, {xnf_}, head, C, c.V);
  o.rmsnorm_backward(dres_, grad(fnorm, C), dxn_, res_final_, rstdf_, weight(fnorm, C), N, C);
  grad_done(fnorm, C);
  rb(dres_, N * C);
  for (int64_t l = c.L - 1; l >= 0; --l) {
    const ParamLayout::Layer& w = layout_.layers[l];
    const LayerActs& a = la_[l];
    // feed-forward: dres is the gradient of this layer's output
    const bool h16 = bf16_acts_;  // as in forward, and their gradients
    linear_backward({dm_, h16}, {dres_}, {a.m, h16}, w.w2, F, C);
    if (h16)
      o.swiglu_backward_bf16(u16(dab_), u16(dm_), u16(a.ab), N, F);
    else
      o.swiglu_backward(dab_, dm_, a.ab, N, F, dtype_ == DType::bf16);
    linear_backward({dxn_}, {dab_, h16}, {a.xn2}, w.w1, C, 2 * F);
    norm_backward_add(w.ffn_norm, dxn_, a.mid, a.rstd2);  // dres is now d(mid)
    // attention
    linear_backward({datt_, h16}, {dres_}, {a.att, h16}, w.wo, H * D, C);
    const float* qkw = weight(w.q_norm, 2 * D);  // q_norm, k_norm (adjacent)
    float* dqkw = grad(w.q_norm, 2 * D);
    if (qkn_) {  // straight into dqkv (qkv_)
      o.attention_qkn_backward(qkv_, dqkw, dqkw + D, datt_, a.att, a.lse, a.qkv, a.qrstd, a.krstd,
                               qkw, qkw + D, cos_, sin_, B_, T_, H, K, D, dtype_ == DType::bf16,
                               h16, doc_);
    } else {
      if (dtype_ == DType::bf16 && o.attention_backward_bf16) {  // dq, dk, dv rounded by the op
        o.attention_backward_bf16(dq_, dk_, dv_, datt_, a.att, a.lse, a.q, a.k, a.v, B_, T_, H, K,
                                  D, h16, doc_);
      } else {
        o.attention_backward(dq_, dk_, dv_, datt_, a.att, a.lse, a.q, a.k, a.v, B_, T_, H, K, D,
                             doc_);
        rb(dq_, N * H * D), rb(dk_, N * K * D), rb(dv_, N * K * D);
      }
      if (o.qk_norm_rope_backward) {
        o.qk_norm_rope_backward(qkv_, dqkw, dqkw + D, dq_, dk_, dv_, a.qkv, a.qrstd, a.krstd, qkw,
                                qkw + D, cos_, sin_, B_, T_, H, K, D, dtype_ == DType::bf16, h16,
                                doc_);
      } else {
        o.rope_backward(dq_, dq_, cos_, sin_, B_, T_, H, D, doc_);
        o.rope_backward(dk_, dk_, cos_, sin_, B_, T_, K, D, doc_);
        rb(dq_, N * H * D), rb(dk_, N * K * D);
        // the norms' inputs again, from the saved projection: q, k, v fill qkv_ exactly
        float *qr = qkv_, *kr = qkv_ + N * H * D;
        o.qkv_split_forward(qr, kr, kr + N * K * D, a.qkv, N, H, K, D);
        o.rmsnorm_backward(dqr_, dqkw, dq_, qr, a.qrstd, qkw, N * H, D);
        o.rmsnorm_backward(dkr_, dqkw + D, dk_, kr, a.krstd, qkw + D, N * K, D);
        rb(dqr_, N * H * D), rb(dkr_, N * K * D);
        o.qkv_split_backward(qkv_, dqr_, dkr_, dv_, N, H, K, D);
      }
    }
    grad_done(w.q_norm, 2 * D);
    linear_backward({dxn_}, {qkv_, h16}, {a.xn1}, w.wqkv, C, QKV);
    norm_backward_add(w.attn_norm, dxn_, a.res, a.rstd1);  // dres is now d(res of layer l)
  }
  if (dtype_ == DType::bf16 && o.embedding_backward_bf16) {
    o.embedding_backward_bf16(static_cast<uint16_t*>(grads_) + gslot(layout_.tok_emb, c.V * C),
                              dres_, tokens_, N, C);
  } else {
    o.embedding_backward(grad(layout_.tok_emb, c.V * C), dres_, tokens_, N, C);
    grad_done(layout_.tok_emb, c.V * C);
  }
}

void Qwen3::sgd_update(float lr) {
  if (compact_grads_) throw Error("sgd_update: this model keeps gradients only for the fused step");
  if (dtype_ == DType::f32)
    ops_.sgd_update_f32(static_cast<float*>(params_), static_cast<const float*>(grads_),
                        layout_.total, lr);
  else
    ops_.sgd_update_bf16(static_cast<uint16_t*>(params_), static_cast<const uint16_t*>(grads_),
                         layout_.total, lr);
}

void Qwen3::backward_sgd(float lr) {
  fuse_lr_ = lr;
  backward_pass();
  fuse_lr_ = 0;
  for (const auto& [off, n] : unfused_) {
    const size_t g = gslot(off, n);
    if (dtype_ == DType::f32)
      ops_.sgd_update_f32(static_cast<float*>(params_) + off, static_cast<const float*>(grads_) + g,
                          int64_t(n), lr);
    else
      ops_.sgd_update_bf16(static_cast<uint16_t*>(params_) + off,
                           static_cast<const uint16_t*>(grads_) + g, int64_t(n), lr);
  }
}

int64_t Qwen3::correct(const Batch& batch) const {
  std::vector<float> logits(N_ * cfg_.V);
  ops_.download(logits.data(), logits_, logits.size() * 4);
  int64_t k = 0;
  for (int64_t n = 0; n < N_; ++n) {
    const float* row = logits.data() + n * cfg_.V;
    int64_t best = 0;
    for (int64_t j = 1; j < cfg_.V; ++j)
      if (row[j] > row[best]) best = j;
    k += best == batch.targets[n];
  }
  return k;
}

}  // namespace tq
