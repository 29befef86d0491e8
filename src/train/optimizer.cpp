#include "train/optimizer.h"

#include <cmath>
#include <vector>

#include "core/common.h"

namespace tq::train {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptimizerKind::sgd;
  if (s == "adamw") return OptimizerKind::adamw;
  throw Error("--optimizer " + s + ": choose sgd or adamw");
}

const char* optimizer_name(OptimizerKind k) {
  return k == OptimizerKind::sgd ? "sgd" : "adamw";
}

OptimizerStep optimizer_scalars(OptimizerKind k, double lr, const AdamWConfig& c, int64_t step,
                                float gscale) {
  OptimizerStep s{};
  s.adamw = k == OptimizerKind::adamw;
  s.gscale = gscale;
  s.lr = float(lr);
  s.decay = float(1 - lr * c.weight_decay);
  s.w1 = float(1 - c.beta1), s.b2 = float(c.beta2), s.w2 = float(1 - c.beta2);
  s.step_size = float(lr / (1 - std::pow(c.beta1, double(step))));
  s.bc2_sqrt = float(std::sqrt(1 - std::pow(c.beta2, double(step))));
  s.eps = float(c.eps);
  return s;
}

void adamw_step(float* p, float* m, float* v, const float* g, size_t n, double lr,
                const AdamWConfig& c, int64_t step) {
  const OptimizerStep s = optimizer_scalars(OptimizerKind::adamw, lr, c, step, 1.f);
  const float decay = s.decay, w1 = s.w1, b2 = s.b2, w2 = s.w2;
  const float step_size = s.step_size, bc2_sqrt = s.bc2_sqrt, eps = s.eps;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    // torch's lerp for a weight below 0.5: self + weight * (end - self)
    const float mi = m[i] + w1 * (gi - m[i]);
    const float vi = v[i] * b2 + w2 * gi * gi;  // addcmul: value * t1 * t2
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

void sgd_step(float* p, const float* g, size_t n, double lr) {
  const float a = float(lr);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) p[i] -= a * g[i];
}

double global_norm(const float* g, size_t n) {
  constexpr size_t kChunk = 1 << 16;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(chunks);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    double s = 0;
    const size_t end = std::min(n, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < end; ++i) s += double(g[i]) * double(g[i]);
    part[c] = s;
  }
  double total = 0;
  for (double s : part) total += s;
  return std::sqrt(total);
}

void scale(float* g, size_t n, float s) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) g[i] *= s;
}

}  // namespace tq::train
