#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/common.h"

namespace tq::infer {

static std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

void check(const SamplerConfig& c) {
  if (!(c.temperature >= 0) || !std::isfinite(c.temperature))
    throw Error("--temperature must be 0 or more, got " + num(c.temperature));
  if (c.top_k < 0) throw Error("--top-k must be 0 (off) or more, got " + std::to_string(c.top_k));
  if (!(c.top_p > 0 && c.top_p <= 1))
    throw Error("--top-p must be in (0, 1] (1: off), got " + num(c.top_p));
}

Sampler::Sampler(const SamplerConfig& c, uint64_t sequence) : c_(c) {
  check(c);
  std::seed_seq seq{uint32_t(c.seed), uint32_t(c.seed >> 32), uint32_t(sequence),
                    uint32_t(sequence >> 32)};
  rng_.seed(seq);
}

int32_t Sampler::next(const float* logits, int64_t V, double* logprob) {
  // argmax: the first of equal maxima, as torch.argmax
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  int64_t pick = best;
  if (!c_.greedy && c_.temperature > 0) {
    // the kept candidates, most likely first where an order is needed
    idx_.resize(size_t(V));
    std::iota(idx_.begin(), idx_.end(), 0);
    const auto more_likely = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    size_t n = size_t(V);
    if (c_.top_k > 0 && c_.top_k < V) {
      std::nth_element(idx_.begin(), idx_.begin() + c_.top_k, idx_.end(), more_likely);
      n = size_t(c_.top_k);
    }
    if (c_.top_p < 1) std::sort(idx_.begin(), idx_.begin() + std::ptrdiff_t(n), more_likely);
    // softmax(logits / temperature) over the candidates, in double
    const double inv_t = 1.0 / c_.temperature, m = double(logits[best]) * inv_t;
    p_.resize(n);
    double z = 0;
    for (size_t i = 0; i < n; ++i) z += p_[i] = std::exp(double(logits[idx_[i]]) * inv_t - m);
    if (c_.top_p < 1) {  // the smallest prefix whose mass reaches top_p (at least one token)
      double cum = 0;
      size_t keep = 0;
      while (keep < n && (keep == 0 || cum < c_.top_p * z)) cum += p_[keep++];
      n = keep, z = cum;
    }
    // u in [0, z): 53 random bits, independent of the standard library's distributions
    const double u = double(rng_() >> 11) * 0x1p-53 * z;
    double cum = 0;
    pick = idx_[n - 1];
    for (size_t i = 0; i < n; ++i)
      if (u < (cum += p_[i])) {
        pick = idx_[i];
        break;
      }
  }
  if (logprob) {
    const double m = logits[best];
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(double(logits[i]) - m);
    *logprob = double(logits[pick]) - m - std::log(z);
  }
  return int32_t(pick);
}

}  // namespace tq::infer
