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
// bwd: the buffers only a backward uses (dqkv, dres, dtmp, dxn, dab, dm, datt, dq, dk, dv) are
// sized (forward-only uses leave them empty)
static std::vector<int64_t> scratch_sizes(const Config& c, int64_t B, int64_t T, bool h16, bool qkn,
                                          bool bwd) {
  const int64_t N = B * T, HD = c.H * c.D, KD = qkn ? 0 : c.KVH * c.D;
  const auto f = [h16](int64_t n) { return floats(n, h16); };  // those stored as bf16 in h16
  const int64_t b = bwd ? 1 : 0;
  // qkv, tmp, dres, dtmp, dxn, dab, dm, datt, dq, dk, dv, dqr, dkr, tokens, targets, cos, sin,
  // docs (with qkn no dq, dk, dv, dqr, dkr: KD 0 and QD for dq, dqr)
  const int64_t QD = qkn ? 0 : HD;
  return {b * f(N * c.qkv_rows()),
          N * c.C,
          b * N * c.C,
          b * N * c.C,
          b * N * c.C,
          b * f(N * 2 * c.F),
          b * f(N * c.F),
          b * f(N * HD),
          b * f(N * QD),
          b * f(N * KD),
          b * f(N * KD),
          N * QD,
          N * KD,
          N,
          N,
          T * c.D / 2,
          T * c.D / 2,
          N};
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
// is used.
struct Needs {
  bool h16;      // bf16_acts
  bool compact;  // Use::sgd, and the backend steps the matrices inside backward: gradient
                 // slots only for the unfused ranges
  std::vector<std::pair<size_t, size_t>> unfused;  // ranges sgd_update steps after backward
  size_t grads = 0;                                // elements of the gradient arena
  size_t wview = 0, gview = 0;  // bf16: fp32 elements of the weight view and gradient buffer
};
bool trains(Use u) {
  return u == Use::train || u == Use::sgd;
}
Needs needs(const Config& c, const ParamLayout& p, DType dtype, const Ops& o, Use use) {
  Needs n;
  n.h16 = bf16_acts(o, dtype);
  n.unfused = unfused_ranges(p, can_fuse(o, dtype));
  n.compact = use == Use::sgd && can_fuse(o, dtype);
  n.grads = trains(use) ? p.total : 0;
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
    n.gview = trains(use) ? std::max({small, o.embedding_backward_bf16 ? 0 : table, mats}) : 0;
  }
  return n;
}

// Floats of each arena and how the activations are laid out.
struct Sizes {
  int64_t rows;                // the most rows a pass takes: B T, or generate's max(T, B)
  std::vector<int64_t> layer;  // one layer's activations (LayerActs order)
  int64_t layer_sets;          // L, or 1 where every layer reuses one set (forward only)
  int64_t final_acts;          // res_final, xnf, rstdf, logits, lse_ce
  int64_t logit_rows;          // rows of logits
  std::vector<int64_t> scratch;
  int64_t gen;    // generate: q [rows, H D], new keys and values [B, KVH D], lens [B]
  int64_t cache;  // generate: the KV cache, in elements of the activations' storage
};
Sizes sizes(const Config& c, DType dtype, int64_t B, int64_t T, const Ops& o, Use use,
            const Needs& n) {
  Sizes z;
  const bool qkn = attn_qkn(o, dtype), gen = use == Use::generate;
  // a generate pass is one sequence's prefill (up to T tokens) or one token of each of B
  const int64_t AB = gen ? 1 : B, AT = gen ? std::max(T, B) : T;
  z.rows = AB * AT;
  // The attention stats of a pass of AB sequences of up to AT tokens: a forward-only model
  // takes shorter ones too, and the CPU's stats (which keep probabilities only up to some
  // length) are not monotonic in T
  int64_t stats = attn_stats(c, dtype, AB, AT, o);
  if (!trains(use))
    for (int64_t t = 1; t < AT; ++t) stats = std::max(stats, attn_stats(c, dtype, AB, t, o));
  z.layer = layer_act_sizes(c, AB, AT, n.h16, stats, qkn);
  z.layer_sets = trains(use) ? c.L : 1;
  z.logit_rows = gen ? B : z.rows;
  z.final_acts = z.rows * (2 * c.C + 2) + z.logit_rows * c.V;
  z.scratch = scratch_sizes(c, AB, AT, n.h16, qkn, trains(use));
  const int64_t KD = c.KVH * c.D;
  z.gen = gen ? floats(z.rows * c.H * c.D, n.h16) + 2 * floats(B * KD, n.h16) + B : 0;
  z.cache = gen ? c.L * 2 * B * T * KD : 0;
  return z;
}
}  // namespace

// The bytes of the arenas these needs and sizes make.
static MemoryPlan plan_of(const ParamLayout& p, DType dtype, const Needs& n, const Sizes& z) {
  MemoryPlan m{p.total * dtype_size(dtype), n.grads * dtype_size(dtype),
               size_t(z.layer_sets * sum(z.layer) + z.final_acts) * 4,
               size_t(sum(z.scratch) + z.gen) * 4 + (n.wview + n.gview) * 4};
  m.cache = size_t(z.cache) * (n.h16 ? 2 : 4);
  return m;
}

MemoryPlan memory_plan(const Config& c, DType dtype, int64_t B, int64_t T, const Ops& ops,
                       Use use) {
  const ParamLayout p = make_layout(c);
  const Needs n = needs(c, p, dtype, ops, use);
  return plan_of(p, dtype, n, sizes(c, dtype, B, T, ops, use, n));
}

Qwen3::Qwen3(const Config& cfg, DType dtype, int64_t B, int64_t T, const Ops& ops, Use use)
    : cfg_(cfg),
      layout_(make_layout(cfg)),
      dtype_(dtype),
      use_(use),
      Bmax_(B),
      Tmax_(T),
      B_(B),
      T_(T),
      N_(B * T),
      ops_(ops) {
  const Needs need = needs(cfg, layout_, dtype, ops, use);
  const Sizes z = sizes(cfg, dtype, B, T, ops, use, need);
  const MemoryPlan plan = plan_of(layout_, dtype, need, z);
  unfused_ = need.unfused;
  can_fuse_ = can_fuse(ops, dtype);
  qkn_ = attn_qkn(ops, dtype);
  compact_grads_ = need.compact;
  if (use == Use::generate) {
    if (!ops.attention_decode)
      throw Error("the " + ops.name + " backend cannot generate (no attention over a KV cache)");
    if (qkn_ && !ops.qk_norm_rope_forward)  // (the composition's buffers go with !qkn_)
      throw Error("the " + ops.name + " backend cannot generate (no qk_norm_rope_forward)");
  }
  size_t g = 0;  // gradient slots: the whole layout, or the unfused ranges one after another
  if (compact_grads_)
    for (const auto& [off, n] : unfused_) gslots_.push_back({off, n, g}), g += n;
  else
    gslots_.push_back({0, layout_.total, 0});
  params_ = ops.alloc(plan.params);
  grads_ = ops.alloc(plan.grads);
  acts_ = static_cast<float*>(ops.alloc(plan.activations));
  scratch_ = static_cast<float*>(ops.alloc(plan.scratch));
  if (plan.cache) cache_ = ops.alloc(plan.cache);
  float* p = acts_;
  for (int64_t l = 0; l < cfg.L; ++l) {
    if (l >= z.layer_sets) {  // forward only: every layer reuses the first one's set
      la_.push_back(la_[0]);
      continue;
    }
    LayerActs a;
    float** views[] = {&a.res, &a.xn1, &a.rstd1, &a.qkv, &a.v,   &a.qrstd, &a.krstd, &a.q,
                       &a.k,   &a.att, &a.lse,   &a.mid, &a.xn2, &a.rstd2, &a.ab,    &a.m};
    for (size_t i = 0; i < z.layer.size(); ++i) *views[i] = p, p += z.layer[i];
    la_.push_back(a);
  }
  const int64_t R = z.rows;
  res_final_ = p, p += R * cfg.C;
  xnf_ = p, p += R * cfg.C;
  rstdf_ = p, p += R;
  logits_ = p, p += z.logit_rows * cfg.V;
  lse_ce_ = p;
  float* ids[3];  // tokens, targets, docs: int32 in the backend's memory, as the kernels read them
  float** sviews[] = {&qkv_, &tmp_, &dres_, &dtmp_, &dxn_,   &dab_,   &dm_,  &datt_, &dq_,
                      &dk_,  &dv_,  &dqr_,  &dkr_,  &ids[0], &ids[1], &cos_, &sin_,  &ids[2]};
  p = scratch_;
  for (size_t i = 0; i < z.scratch.size(); ++i) *sviews[i] = p, p += z.scratch[i];
  tokens_ = reinterpret_cast<int32_t*>(ids[0]);
  targets_ = reinterpret_cast<int32_t*>(ids[1]);
  docs_ = reinterpret_cast<int32_t*>(ids[2]);
  if (use == Use::generate) {
    const int64_t KD = cfg.KVH * cfg.D;
    q_ = p, p += floats(R * cfg.H * cfg.D, bf16_acts_);
    knew_ = p, p += floats(B * KD, bf16_acts_);
    vnew_ = p, p += floats(B * KD, bf16_acts_);
    lens_ = reinterpret_cast<int32_t*>(p), p += B;
    len_.assign(size_t(B), 0);
  }
  if (dtype == DType::bf16) {
    wbuf_ = p;
    gbuf_ = p + need.wview;
    wview_ = need.wview, gview_ = need.gview;
  }
  std::vector<float> c, s;
  const int64_t positions = use == Use::generate ? T : z.rows / B;  // (generate: T positions)
  rope_tables(c, s, positions, cfg.D, cfg.theta);
  ops.upload(cos_, c.data(), c.size() * 4);
  ops.upload(sin_, s.data(), s.size() * 4);
}

Qwen3::~Qwen3() {
  for (void* p : {params_, grads_, static_cast<void*>(acts_), static_cast<void*>(scratch_), cache_})
    if (p) ops_.release(p);
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
  if (!trains(use_)) throw Error("get_grads: this model was built for forward passes only");
  if (compact_grads_) throw Error("get_grads: this model keeps gradients only for the fused step");
  download_arena(ops_, host, grads_, 0, layout_.total, dtype_);
}

void Qwen3::grads_into(float* dst, size_t off, size_t n) const {
  if (!trains(use_)) throw Error("grads_into: this model was built for forward passes only");
  if (compact_grads_) throw Error("grads_into: this model keeps gradients only for the fused step");
  if (dtype_ == DType::f32)
    return ops_.copy(dst + off, static_cast<const float*>(grads_) + off, int64_t(n));
  ops_.bf16_to_f32(dst + off, static_cast<const uint16_t*>(grads_) + off, int64_t(n));
}

void Qwen3::copy_params(const Qwen3& from) {
  if (from.layout_.total != layout_.total || from.dtype_ != dtype_)
    throw Error("copy_params: another size or dtype of parameters");
  const size_t bytes = layout_.total * dtype_size(dtype_);
  ops_.copy(static_cast<float*>(params_), static_cast<const float*>(from.params_),
            int64_t(bytes / 4));
  if (bytes % 4) {  // an odd count of bf16 values: the last one
    uint16_t last;
    ops_.download(&last, static_cast<const char*>(from.params_) + bytes - 2, 2);
    ops_.upload(static_cast<char*>(params_) + bytes - 2, &last, 2);
  }
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
void Qwen3::linear_forward(Act out, Act x, size_t off, int64_t IC, int64_t OC, int64_t N) {
  if (dtype_ == DType::bf16 && ops_.matmul_forward_bf16w)
    return ops_.matmul_forward_bf16w(out, x, static_cast<const uint16_t*>(params_) + off, N, IC,
                                     OC);  // out rounded to bf16 by the op
  ops_.matmul_forward(f32(out), f32(x), weight(off, IC * OC), N, IC, OC);
  rb(f32(out), N * OC);
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
  if (use_ == Use::generate) throw Error("forward: this model was built to generate");
  const bool fits = trains(use_)
                        ? batch.B == Bmax_ && batch.T == Tmax_
                        : batch.B >= 1 && batch.B <= Bmax_ && batch.T >= 1 && batch.T <= Tmax_;
  const int64_t N = batch.B * batch.T;
  if (!fits || int64_t(batch.tokens.size()) != N || int64_t(batch.targets.size()) != N)
    throw Error("batch of " + std::to_string(batch.tokens.size()) + " tokens (B " +
                std::to_string(batch.B) + ", T " + std::to_string(batch.T) +
                "), model built for B " + std::to_string(Bmax_) + ", T " + std::to_string(Tmax_));
  B_ = batch.B, T_ = batch.T, N_ = N;
  ops_.upload(tokens_, batch.tokens.data(), size_t(N) * 4);
  ops_.upload(targets_, batch.targets.data(), size_t(N) * 4);
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
    ops_.upload(docs_, batch.doc_start.data(), size_t(N) * 4);
    doc_ = docs_;
  }
  layers_forward(Attend::batch);
  linear_forward({logits_}, {xnf_}, layout_.lm_head, cfg_.C, cfg_.V);
  return ops_.crossentropy_forward(lse_ce_, logits_, targets_, N, cfg_.V);
}

void Qwen3::logits(float* host, int64_t n0, int64_t n) const {
  if (use_ == Use::generate || n0 < 0 || n < 0 || n0 + n > N_)
    throw Error("logits: rows [" + std::to_string(n0) + ", " + std::to_string(n0 + n) +
                ") of the last forward's " + std::to_string(N_));
  ops_.download(host, logits_ + n0 * cfg_.V, size_t(n * cfg_.V) * 4);
}

void Qwen3::qk_norm_rope(float* q, float* k, float* v, const LayerActs& a, const float* qkw,
                         const int32_t* doc) {
  const Ops& o = ops_;
  const int64_t N = N_, H = cfg_.H, K = cfg_.KVH, D = cfg_.D;
  if (o.qk_norm_rope_forward)
    return o.qk_norm_rope_forward(q, k, v, a.qrstd, a.krstd, a.qkv, qkw, qkw + D, cos_, sin_, B_,
                                  T_, H, K, D, cfg_.eps, dtype_ == DType::bf16, bf16_acts_, doc);
  // the split's q, k into backward scratch (free until backward)
  o.qkv_split_forward(dqr_, dkr_, v, a.qkv, N, H, K, D);
  o.rmsnorm_forward(q, a.qrstd, dqr_, qkw, N * H, D, cfg_.eps);
  o.rmsnorm_forward(k, a.krstd, dkr_, qkw + D, N * K, D, cfg_.eps);
  rb(q, N * H * D), rb(k, N * K * D);
  o.rope_forward(q, q, cos_, sin_, B_, T_, H, D, doc);
  o.rope_forward(k, k, cos_, sin_, B_, T_, K, D, doc);
  rb(q, N * H * D), rb(k, N * K * D);
}

void Qwen3::attention(const LayerActs& a, const float* q, const float* k, const float* v,
                      const int32_t* doc) {
  const Ops& o = ops_;
  const int64_t H = cfg_.H, K = cfg_.KVH, D = cfg_.D;
  if (dtype_ == DType::bf16 && o.attention_forward_bf16)  // att rounded by the op
    return o.attention_forward_bf16(a.att, a.lse, q, k, v, B_, T_, H, K, D, bf16_acts_, doc);
  o.attention_forward(a.att, a.lse, q, k, v, B_, T_, H, K, D, doc);
  rb(a.att, N_ * H * D);
}

void Qwen3::layers_forward(Attend how) {
  const Config& c = cfg_;
  const Ops& o = ops_;
  const int64_t N = N_, C = c.C, H = c.H, K = c.KVH, D = c.D, F = c.F, QKV = c.qkv_rows();
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
    if (how != Attend::batch) {
      attend_cached(a, l, qkw, how);
    } else if (qkn_) {  // attention reads qkv itself (att rounded by the op in bf16 runs)
      o.attention_qkn_forward(a.att, a.lse, a.qrstd, a.krstd, a.qkv, qkw, qkw + D, cos_, sin_, B_,
                              T_, H, K, D, c.eps, dtype_ == DType::bf16, h16, doc_);
    } else {
      qk_norm_rope(a.q, a.k, a.v, a, qkw, doc_);
      attention(a, a.q, a.k, a.v, doc_);
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
}

char* Qwen3::cache_at(int64_t l, int64_t kv, int64_t b, int64_t t) const {
  const int64_t KD = cfg_.KVH * cfg_.D, e = bf16_acts_ ? 2 : 4;
  return static_cast<char*>(cache_) + (((l * 2 + kv) * Bmax_ + b) * Tmax_ + t) * KD * e;
}

// Attention over the KV cache: the same QK-norm, RoPE and attention kernels as training's
// forward, with the keys and values kept in the cache. A prefill's are written straight into
// its sequence's rows (its [T, KVH, D] is the cache's layout) and it attends as a causal
// batch of one; a decode step's new key and value rows are copied to each sequence's next
// row, its positions are after the cached ones (doc = -position: t - doc[t] with t = 0), and
// attention_decode reads the cache.
void Qwen3::attend_cached(const LayerActs& a, int64_t l, const float* qkw, Attend how) {
  const Ops& o = ops_;
  const int64_t H = cfg_.H, K = cfg_.KVH, D = cfg_.D;
  const bool h16 = bf16_acts_, rnd = dtype_ == DType::bf16;
  if (how == Attend::prefill) {
    float* k = reinterpret_cast<float*>(cache_at(l, 0, gen_row_, 0));
    float* v = reinterpret_cast<float*>(cache_at(l, 1, gen_row_, 0));
    qk_norm_rope(q_, k, v, a, qkw, nullptr);
    return attention(a, q_, k, v, nullptr);
  }
  qk_norm_rope(q_, knew_, vnew_, a, qkw, docs_);
  const int64_t n = floats(K * D, h16);  // a row, in floats
  for (int64_t b = 0; b < B_; ++b) {
    o.copy(reinterpret_cast<float*>(cache_at(l, 0, b, len_[size_t(b)])), knew_ + b * n, n);
    o.copy(reinterpret_cast<float*>(cache_at(l, 1, b, len_[size_t(b)])), vnew_ + b * n, n);
  }
  o.attention_decode(a.att, q_, reinterpret_cast<const float*>(cache_at(l, 0, 0, 0)),
                     reinterpret_cast<const float*>(cache_at(l, 1, 0, 0)), lens_, B_, H, K, D,
                     Tmax_, rnd, h16);
}

void Qwen3::head_logits(int64_t n0, int64_t n, float* host) {
  linear_forward({logits_}, {xnf_ + n0 * cfg_.C}, layout_.lm_head, cfg_.C, cfg_.V, n);
  if (host) ops_.download(host, logits_, size_t(n * cfg_.V) * 4);
}

void Qwen3::prefill(int64_t row, const int32_t* tokens, int64_t n, float* logits) {
  if (use_ != Use::generate) throw Error("prefill: this model was not built to generate");
  if (row < 0 || row >= Bmax_ || n < 1 || n > Tmax_)
    throw Error("prefill: sequence " + std::to_string(row) + " of " + std::to_string(n) +
                " tokens, model built for " + std::to_string(Bmax_) + " of up to " +
                std::to_string(Tmax_));
  B_ = 1, T_ = n, N_ = n, gen_row_ = row;
  ops_.upload(tokens_, tokens, size_t(n) * 4);
  layers_forward(Attend::prefill);
  len_[size_t(row)] = n;
  head_logits(n - 1, 1, logits);
}

void Qwen3::decode(const int32_t* tokens, int64_t B, float* logits) {
  if (use_ != Use::generate) throw Error("decode: this model was not built to generate");
  if (B < 1 || B > Bmax_)
    throw Error("decode: " + std::to_string(B) + " sequences, model built for " +
                std::to_string(Bmax_));
  std::vector<int32_t> pos(static_cast<size_t>(B)), lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t = len_[size_t(b)];
    if (t < 1 || t >= Tmax_)
      throw Error("decode: sequence " + std::to_string(b) + " holds " + std::to_string(t) +
                  " tokens (1 to " + std::to_string(Tmax_ - 1) + " can take one more)");
    pos[size_t(b)] = int32_t(-t), lens[size_t(b)] = int32_t(t + 1);
  }
  B_ = B, T_ = 1, N_ = B;
  ops_.upload(tokens_, tokens, size_t(B) * 4);
  ops_.upload(docs_, pos.data(), size_t(B) * 4);
  ops_.upload(lens_, lens.data(), size_t(B) * 4);
  layers_forward(Attend::decode);
  for (int64_t b = 0; b < B; ++b) ++len_[size_t(b)];
  head_logits(0, B, logits);
}

void Qwen3::backward() {
  if (!trains(use_)) throw Error("backward: this model was built for forward passes only");
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
  // [norm, total) is final: the final norm's and an untied head's gradients (a tied head's is
  // the embedding's, at 0, final last)
  if (ready_) ready_(fnorm);
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
    if (ready_) ready_(w.wqkv);                            // the layer's parameters start at wqkv
  }
  if (dtype_ == DType::bf16 && o.embedding_backward_bf16) {
    o.embedding_backward_bf16(static_cast<uint16_t*>(grads_) + gslot(layout_.tok_emb, c.V * C),
                              dres_, tokens_, N, C);
  } else {
    o.embedding_backward(grad(layout_.tok_emb, c.V * C), dres_, tokens_, N, C);
    grad_done(layout_.tok_emb, c.V * C);
  }
  if (ready_) ready_(0);
}

void Qwen3::sgd_update(float lr) {
  if (!trains(use_)) throw Error("sgd_update: this model was built for forward passes only");
  if (compact_grads_) throw Error("sgd_update: this model keeps gradients only for the fused step");
  if (dtype_ == DType::f32)
    ops_.sgd_update_f32(static_cast<float*>(params_), static_cast<const float*>(grads_),
                        layout_.total, lr);
  else
    ops_.sgd_update_bf16(static_cast<uint16_t*>(params_), static_cast<const uint16_t*>(grads_),
                         layout_.total, lr);
}

void Qwen3::backward_sgd(float lr) {
  if (!trains(use_)) throw Error("backward_sgd: this model was built for forward passes only");
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
