#include "train/schedule.h"

#include <cmath>

#include "core/common.h"

namespace tq::train {

DecayType parse_decay_type(const std::string& s) {
  if (s == "linear") return DecayType::linear;
  if (s == "sqrt") return DecayType::sqrt;
  if (s == "cosine") return DecayType::cosine;
  throw Error("--decay-type " + s + ": choose linear, sqrt or cosine");
}

const char* decay_type_name(DecayType t) {
  return t == DecayType::linear ? "linear" : t == DecayType::sqrt ? "sqrt" : "cosine";
}

Schedule Schedule::make(int64_t steps, int64_t warmup, std::optional<double> decay_ratio,
                        DecayType type, double min_factor) {
  Schedule s;
  s.warmup = std::min(warmup, steps);
  if (decay_ratio) {
    // Python's round(): halves to even, as std::nearbyint in the default rounding mode
    s.decay = int64_t(std::nearbyint(double(steps) * *decay_ratio));
    if (s.warmup + s.decay > steps) s.decay = steps - s.warmup;
  } else {
    s.decay = steps - s.warmup;
  }
  s.stable = steps + 1 - s.warmup - s.decay;
  s.type = type;
  s.min_factor = min_factor;
  return s;
}

double Schedule::factor(int64_t s) const {
  if (s < warmup) return double(s + 1) / double(warmup);
  if (s < warmup + stable) return 1.0;
  const double p = double(s + 1 - warmup - stable) / double(decay);
  double f;
  switch (type) {
    case DecayType::linear:
      f = 1 - p;
      break;
    case DecayType::sqrt:
      f = 1 - std::sqrt(p);
      break;
    default:
      f = 0.5 * (1.0 + std::cos(M_PI * p));
      break;
  }
  return min_factor + (1 - min_factor) * f;
}

}  // namespace tq::train
