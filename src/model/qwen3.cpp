#include "model/qwen3.h"

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

// Sizes (floats) of the per-layer saved activations, in LayerActs order.
static std::vector<int64_t> layer_act_sizes(const Config& c, int64_t B, int64_t T) {
  const int64_t N = B * T;
  return {N * c.C,         N * c.C,     N,         N * c.H * c.D, N * c.KVH * c.D,
          N * c.KVH * c.D, N * c.H,     N * c.KVH, N * c.H * c.D, N * c.KVH * c.D,
          N * c.H * c.D,   B * c.H * T, N * c.C,   N * c.C,       N,
          N * 2 * c.F,     N * c.F};
}
static int64_t final_act_size(const Config& c, int64_t N) {
  return N * c.C + N * c.C + N + N * c.V + N;  // res_final, xnf, rstdf, logits, lse_ce
}
static std::vector<int64_t> scratch_sizes(const Config& c, int64_t B, int64_t T) {
  const int64_t N = B * T, HD = c.H * c.D, KD = c.KVH * c.D;
  // qkv, tmp, dres, dtmp, dxn, dab, dm, datt, dq, dk, dv, dqr, dkr, cos, sin
  return {N * c.qkv_rows(), N * c.C, N * c.C, N * c.C, N * c.C, N * 2 * c.F, N * c.F,    N * HD,
          N * HD,           N * KD,  N * KD,  N * HD,  N * KD,  T * c.D / 2, T * c.D / 2};
}
static int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

MemoryPlan memory_plan(const Config& c, int64_t B, int64_t T) {
  const size_t P = make_layout(c).total * sizeof(float);
  return {P, P, size_t(c.L * sum(layer_act_sizes(c, B, T)) + final_act_size(c, B * T)) * 4,
          size_t(sum(scratch_sizes(c, B, T))) * 4};
}

Qwen3::Qwen3(const Config& cfg, DType dtype, int64_t B, int64_t T, const Ops& ops)
    : cfg_(cfg), layout_(make_layout(cfg)), dtype_(dtype), B_(B), T_(T), N_(B * T), ops_(ops) {
  const MemoryPlan plan = memory_plan(cfg, B, T);
  params_ = ops.alloc(plan.params / 4);
  grads_ = ops.alloc(plan.grads / 4);
  acts_ = ops.alloc(plan.activations / 4);
  scratch_ = ops.alloc(plan.scratch / 4);
  float* p = acts_;
  const std::vector<int64_t> ls = layer_act_sizes(cfg, B, T);
  for (int64_t l = 0; l < cfg.L; ++l) {
    LayerActs a;
    float** views[] = {&a.res, &a.xn1, &a.rstd1, &a.qr,  &a.kr,  &a.v,     &a.qrstd, &a.krstd, &a.q,
                       &a.k,   &a.att, &a.lse,   &a.mid, &a.xn2, &a.rstd2, &a.ab,    &a.m};
    for (size_t i = 0; i < ls.size(); ++i) *views[i] = p, p += ls[i];
    la_.push_back(a);
  }
  res_final_ = p, p += N_ * cfg.C;
  xnf_ = p, p += N_ * cfg.C;
  rstdf_ = p, p += N_;
  logits_ = p, p += N_ * cfg.V;
  lse_ce_ = p;
  float** sviews[] = {&qkv_, &tmp_, &dres_, &dtmp_, &dxn_, &dab_, &dm_, &datt_,
                      &dq_,  &dk_,  &dv_,   &dqr_,  &dkr_, &cos_, &sin_};
  const std::vector<int64_t> ss = scratch_sizes(cfg, B, T);
  p = scratch_;
  for (size_t i = 0; i < ss.size(); ++i) *sviews[i] = p, p += ss[i];
  std::vector<float> c, s;
  rope_tables(c, s, T, cfg.D, cfg.theta);
  ops.upload(cos_, c.data(), c.size());
  ops.upload(sin_, s.data(), s.size());
}

Qwen3::~Qwen3() {
  for (float* p : {params_, grads_, acts_, scratch_}) ops_.release(p);
}

void Qwen3::set_params(const float* host) {
  ops_.upload(params_, host, layout_.total);
  if (dtype_ == DType::bf16) ops_.round_bf16_inplace(params_, layout_.total);
}
void Qwen3::get_params(float* host) const {
  ops_.download(host, params_, layout_.total);
}
void Qwen3::get_grads(float* host) const {
  ops_.download(host, grads_, layout_.total);
}

float* Qwen3::rb(float* p, int64_t n) {
  if (dtype_ == DType::bf16) ops_.round_bf16_inplace(p, n);
  return p;
}

double Qwen3::forward(const Batch& batch) {
  const Config& c = cfg_;
  const Ops& o = ops_;
  const int64_t N = N_, C = c.C, H = c.H, K = c.KVH, D = c.D, F = c.F;
  tokens_ = batch.tokens;
  targets_ = batch.targets;
  const float* W = params_;
  o.embedding_forward(la_[0].res, tokens_.data(), W + layout_.tok_emb, N, C);
  for (int64_t l = 0; l < c.L; ++l) {
    const ParamLayout::Layer& w = layout_.layers[l];
    const LayerActs& a = la_[l];
    float* res_out = l + 1 < c.L ? la_[l + 1].res : res_final_;
    o.rmsnorm_forward(a.xn1, a.rstd1, a.res, W + w.attn_norm, N, C, c.eps);
    rb(a.xn1, N * C);
    o.matmul_forward(qkv_, a.xn1, W + w.wqkv, N, C, c.qkv_rows());
    rb(qkv_, N * c.qkv_rows());
    o.qkv_split_forward(a.qr, a.kr, a.v, qkv_, N, H, K, D);
    o.rmsnorm_forward(a.q, a.qrstd, a.qr, W + w.q_norm, N * H, D, c.eps);
    o.rmsnorm_forward(a.k, a.krstd, a.kr, W + w.k_norm, N * K, D, c.eps);
    rb(a.q, N * H * D), rb(a.k, N * K * D);
    o.rope_forward(a.q, a.q, cos_, sin_, B_, T_, H, D);
    o.rope_forward(a.k, a.k, cos_, sin_, B_, T_, K, D);
    rb(a.q, N * H * D), rb(a.k, N * K * D);
    o.attention_forward(a.att, a.lse, a.q, a.k, a.v, B_, T_, H, K, D);
    rb(a.att, N * H * D);
    o.matmul_forward(tmp_, a.att, W + w.wo, N, H * D, C);
    rb(tmp_, N * C);
    o.copy(a.mid, a.res, N * C);
    o.add_inplace(a.mid, tmp_, N * C);
    rb(a.mid, N * C);
    o.rmsnorm_forward(a.xn2, a.rstd2, a.mid, W + w.ffn_norm, N, C, c.eps);
    rb(a.xn2, N * C);
    o.matmul_forward(a.ab, a.xn2, W + w.w1, N, C, 2 * F);  // w1 and w3 are adjacent
    rb(a.ab, N * 2 * F);
    o.swiglu_forward(a.m, a.ab, N, F);
    rb(a.m, N * F);
    o.matmul_forward(tmp_, a.m, W + w.w2, N, F, C);
    rb(tmp_, N * C);
    o.copy(res_out, a.mid, N * C);
    o.add_inplace(res_out, tmp_, N * C);
    rb(res_out, N * C);
  }
  o.rmsnorm_forward(xnf_, rstdf_, res_final_, W + layout_.norm, N, C, c.eps);
  rb(xnf_, N * C);
  o.matmul_forward(logits_, xnf_, W + layout_.lm_head, N, C, c.V);
  rb(logits_, N * c.V);
  return o.crossentropy_forward(lse_ce_, logits_, targets_.data(), N, c.V);
}

void Qwen3::backward() {
  const Config& c = cfg_;
  const Ops& o = ops_;
  const int64_t N = N_, C = c.C, H = c.H, K = c.KVH, D = c.D, F = c.F;
  const float* W = params_;
  float* G = grads_;
  o.zero(G, layout_.total);
  // logits -> dlogits in place
  o.crossentropy_backward(logits_, logits_, lse_ce_, targets_.data(), N, c.V, 1.0 / N);
  rb(logits_, N * c.V);
  o.matmul_backward(dxn_, G + layout_.lm_head, logits_, xnf_, W + layout_.lm_head, N, C, c.V);
  rb(dxn_, N * C);
  o.rmsnorm_backward(dres_, G + layout_.norm, dxn_, res_final_, rstdf_, W + layout_.norm, N, C);
  rb(dres_, N * C);
  for (int64_t l = c.L - 1; l >= 0; --l) {
    const ParamLayout::Layer& w = layout_.layers[l];
    const LayerActs& a = la_[l];
    // feed-forward: dres is the gradient of this layer's output
    o.matmul_backward(dm_, G + w.w2, dres_, a.m, W + w.w2, N, F, C);
    rb(dm_, N * F);
    o.swiglu_backward(dab_, dm_, a.ab, N, F);
    rb(dab_, N * 2 * F);
    o.matmul_backward(dxn_, G + w.w1, dab_, a.xn2, W + w.w1, N, C, 2 * F);
    rb(dxn_, N * C);
    o.rmsnorm_backward(dtmp_, G + w.ffn_norm, dxn_, a.mid, a.rstd2, W + w.ffn_norm, N, C);
    o.add_inplace(dres_, rb(dtmp_, N * C), N * C);  // dres is now d(mid)
    rb(dres_, N * C);
    // attention
    o.matmul_backward(datt_, G + w.wo, dres_, a.att, W + w.wo, N, H * D, C);
    rb(datt_, N * H * D);
    o.attention_backward(dq_, dk_, dv_, datt_, a.att, a.lse, a.q, a.k, a.v, B_, T_, H, K, D);
    rb(dq_, N * H * D), rb(dk_, N * K * D), rb(dv_, N * K * D);
    o.rope_backward(dq_, dq_, cos_, sin_, B_, T_, H, D);
    o.rope_backward(dk_, dk_, cos_, sin_, B_, T_, K, D);
    rb(dq_, N * H * D), rb(dk_, N * K * D);
    o.rmsnorm_backward(dqr_, G + w.q_norm, dq_, a.qr, a.qrstd, W + w.q_norm, N * H, D);
    o.rmsnorm_backward(dkr_, G + w.k_norm, dk_, a.kr, a.krstd, W + w.k_norm, N * K, D);
    rb(dqr_, N * H * D), rb(dkr_, N * K * D);
    o.qkv_split_backward(qkv_, dqr_, dkr_, dv_, N, H, K, D);
    o.matmul_backward(dxn_, G + w.wqkv, qkv_, a.xn1, W + w.wqkv, N, C, c.qkv_rows());
    rb(dxn_, N * C);
    o.rmsnorm_backward(dtmp_, G + w.attn_norm, dxn_, a.res, a.rstd1, W + w.attn_norm, N, C);
    o.add_inplace(dres_, rb(dtmp_, N * C), N * C);  // dres is now d(res of layer l)
    rb(dres_, N * C);
  }
  o.embedding_backward(G + layout_.tok_emb, dres_, tokens_.data(), N, C);
  rb(G, layout_.total);
}

void Qwen3::sgd_update(float lr) {
  ops_.sgd_update(params_, grads_, layout_.total, lr, dtype_ == DType::bf16);
}

int64_t Qwen3::correct(const Batch& batch) const {
  std::vector<float> logits(N_ * cfg_.V);
  ops_.download(logits.data(), logits_, logits.size());
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
