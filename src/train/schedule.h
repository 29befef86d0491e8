// The learning rate schedule: TorchTitan's linear_warmup_stable_decay
// (torchtitan/components/optimizer/lr_scheduler.py), the factor LambdaLR multiplies the base
// learning rate by at each step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace tq::train {

enum class DecayType { linear, sqrt, cosine };
DecayType parse_decay_type(const std::string& s);  // Error naming the choices
const char* decay_type_name(DecayType t);

struct Schedule {
  int64_t warmup = 0, stable = 0, decay = 0;
  DecayType type = DecayType::linear;
  double min_factor = 0;

  // As TorchTitan builds it for `steps` steps: warmup capped at steps; decay round(steps *
  // ratio) (steps - warmup without a ratio), capped at steps - warmup; stable steps + 1 -
  // warmup - decay (its "virtual last step", so the last step's rate is not 0).
  static Schedule make(int64_t steps, int64_t warmup, std::optional<double> decay_ratio,
                       DecayType type, double min_factor);
  // The factor for 0-based step s: (s + 1) / warmup while warming up, 1 while stable, then
  // min + (1 - min) * f(p) with p = (s + 1 - warmup - stable) / decay and f linear 1 - p, sqrt
  // 1 - sqrt(p), cosine (1 + cos(pi p)) / 2.
  double factor(int64_t s) const;
};

}  // namespace tq::train
