#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tq {

Mt19937::Mt19937(uint32_t seed) {
  mt_[0] = seed;
  for (uint32_t i = 1; i < kN; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
}

void Mt19937::twist() {
  constexpr size_t M = 397;
  const auto mix = [](uint32_t hi, uint32_t lo, uint32_t far) {
    const uint32_t y = (hi & 0x80000000u) | (lo & 0x7fffffffu);
    return far ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
  };
  // word k from words k, k + 1 and k + M (mod kN); the second loop reads words the first
  // wrote, kN - M = 227 back: far enough apart for vectors
  uint32_t* x = mt_;
#pragma omp simd
  for (size_t k = 0; k < kN - M; ++k) x[k] = mix(x[k], x[k + 1], x[k + M]);
  for (size_t k = kN - M; k < kN - 1; k += 16) {
    const size_t e = k + 16 < kN - 1 ? k + 16 : kN - 1;
#pragma omp simd
    for (size_t j = k; j < e; ++j) x[j] = mix(x[j], x[j + 1], x[j + M - kN]);
  }
  x[kN - 1] = mix(x[kN - 1], x[0], x[M - 1]);
  i_ = 0;
}

void Mt19937::fill(uint32_t* out, size_t n) {
  while (n > 0) {
    if (i_ == kN) twist();
    const size_t m = n < kN - i_ ? n : kN - i_;
#pragma omp simd
    for (size_t j = 0; j < m; ++j) out[j] = temper(mt_[i_ + j]);
    i_ += m, out += m, n -= m;
  }
}

void Mt19937::discard(uint64_t n) {
  for (uint64_t left = kN - i_; n > left; n -= left, left = kN) twist();
  i_ += size_t(n);
}

// torch's normal_fill_16: Box-Muller on 16 uniforms, cos half first.
static void normal_fill_16(float* data, float std) {
  for (int j = 0; j < 8; ++j) {
    const float u1 = 1.0f - data[j];
    const float u2 = data[j + 8];
    const float radius = std::sqrt(-2.0f * std::log(u1));
    const float theta = static_cast<float>(2.0 * M_PI * static_cast<double>(u2));
    data[j] = radius * std::cos(theta) * std;
    data[j + 8] = radius * std::sin(theta) * std;
  }
}

void TorchRng::normal(float* out, size_t n, float std) {
  uint32_t u[1024];  // uniform() of each draw, a block at a time
  for (size_t i = 0; i < n; i += 1024) {
    const size_t m = n - i < 1024 ? n - i : 1024;
    mt_.fill(u, m);
#pragma omp simd
    for (size_t j = 0; j < m; ++j) out[i + j] = uniform_of(u[j]);
  }
  // The draws are one stream; the transforms, each on its own 16 values, are most of the
  // time (libm's log, sin and cos): on every thread, the same values.
  const int64_t chunks = int64_t(n / 16);
#pragma omp parallel for schedule(static) if (chunks > 4096)
  for (int64_t i = 0; i < chunks; ++i) normal_fill_16(out + 16 * i, std);
  if (n % 16 != 0) {  // torch redraws the last 16 values
    float* tail = out + n - 16;
    for (int i = 0; i < 16; ++i) tail[i] = uniform();
    normal_fill_16(tail, std);
  }
}

void init_params(const ParamSink& sink, const Config& c, const ParamLayout& p, uint64_t seed) {
  TorchRng rng(seed);
  const uint64_t CV = c.C * c.V, QKV = c.qkv_rows() * c.C, HD = c.H * c.D;
  // Constructor draws: nn.Embedding normal_ (one uniform each), each nn.Linear's
  // kaiming_uniform_ (one each): wqkv, wo, w1, w2, w3 per layer, then lm_head.
  const uint64_t per_layer = QKV + c.C * HD + 3 * c.F * c.C;
  rng.skip(CV + c.L * per_layer + CV);

  const float std = 0.02f;
  std::vector<float> buf;
  // normal_ of a tensor, handed over by pieces of kInitPiece values (a multiple of 16: torch
  // transforms each 16 draws on their own), the last one at least 16 long (it redraws the
  // tensor's last 16 values where n is not a multiple of 16): the same values as one call
  auto normal = [&](size_t off, size_t n) {
    for (size_t i = 0, m; i < n; i += m) {
      m = n - i > kInitPiece + 16 ? kInitPiece : n - i;
      buf.resize(m);
      rng.normal(buf.data(), m, std);
      sink(off + i, buf.data(), m);
    }
  };
  auto ones = [&](size_t off, size_t n) {
    buf.assign(n, 1.0f);
    sink(off, buf.data(), n);
  };
  if (!c.tied) normal(p.tok_emb, CV);
  std::vector<float> q(HD * c.C), k(c.KVH * c.D * c.C), v(k.size());
  const int64_t G = c.H / c.KVH;
  const size_t head = c.D * c.C;
  for (int64_t l = 0; l < c.L; ++l) {
    const ParamLayout::Layer& ly = p.layers[l];
    rng.normal(q.data(), q.size(), std);
    rng.normal(k.data(), k.size(), std);
    rng.normal(v.data(), v.size(), std);
    // interleave into the fused layout: per kv group, G query heads, then k, then v
    buf.resize(QKV);
    for (int64_t g = 0; g < c.KVH; ++g) {
      float* blk = buf.data() + g * (G + 2) * head;
      std::copy_n(q.data() + g * G * head, G * head, blk);
      std::copy_n(k.data() + g * head, head, blk + G * head);
      std::copy_n(v.data() + g * head, head, blk + (G + 1) * head);
    }
    sink(ly.wqkv, buf.data(), QKV);
    normal(ly.wo, c.C * HD);
    ones(ly.q_norm, c.D);
    ones(ly.k_norm, c.D);
    normal(ly.w1, c.F * c.C);
    normal(ly.w2, c.C * c.F);
    normal(ly.w3, c.F * c.C);
    ones(ly.attn_norm, c.C);
    ones(ly.ffn_norm, c.C);
  }
  ones(p.norm, c.C);
  normal(p.lm_head, CV);
}

void init_params(float* params, const Config& c, const ParamLayout& p, uint64_t seed) {
  init_params([&](size_t off, const float* x, size_t n) { std::copy_n(x, n, params + off); }, c, p,
              seed);
}

}  // namespace tq
