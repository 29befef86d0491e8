// Optimizers as flat loops over fp32 arenas: the master weights, the accumulated gradient and
// AdamW's moments. Each element's update is independent, and the gradient norm sums fixed
// chunks in a fixed order: the bits do not depend on the thread count. These are the readable
// reference; a training run takes the backend's fused kernels (Ops::scale_sum_squares and
// Ops::optimizer_step, model/ops.h) with the scalars of optimizer_scalars().
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/ops.h"

namespace tq::train {

enum class OptimizerKind { sgd, adamw };
OptimizerKind parse_optimizer(const std::string& s);
const char* optimizer_name(OptimizerKind k);

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One torch.optim.AdamW step (its single-tensor form, fp32) at 1-based step `step`:
//   p *= 1 - lr*wd;  m = lerp(m, g, 1 - beta1);  v = beta2*v + (1 - beta2)*g*g;
//   p += -(lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// with the scalars computed in double and used as fp32, as PyTorch does.
void adamw_step(float* p, float* m, float* v, const float* g, size_t n, double lr,
                const AdamWConfig& c, int64_t step);
// The scalars of one step at 1-based `step` and rate lr, the gradient scaled by gscale first.
OptimizerStep optimizer_scalars(OptimizerKind k, double lr, const AdamWConfig& c, int64_t step,
                                float gscale);

// p -= lr * g (torch.optim.SGD without momentum)
void sgd_step(float* p, const float* g, size_t n, double lr);

// The L2 norm of g (in double, over chunks of a fixed size summed in order).
double global_norm(const float* g, size_t n);
void scale(float* g, size_t n, float s);

}  // namespace tq::train
