#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/common.h"
#include "cpu/vmath.h"

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

// sum_i exp(x[ix[i]] * s - m) (all of x where ix is null), in double: vexp (cpu/vmath.h, within
// 2 ulp of exp) vectorizes where std::exp is a call per element: a greedy token's
// log-probability over a 151,936-token vocabulary took 1.1 ms with std::exp in double, 0.5-0.8
// with vexp (a 0.6B decode step at batch 8 is ~50 ms, and takes one per sequence).
static double sum_exp(const float* x, const int32_t* ix, size_t n, float s, float m) {
  double z = 0;
  if (!ix) {
#pragma omp simd reduction(+ : z)
    for (size_t i = 0; i < n; ++i) z += double(cpu::vexp(x[i] * s - m));
  } else {
    for (size_t i = 0; i < n; ++i) z += double(cpu::vexp(x[ix[i]] * s - m));
  }
  return z;
}

int32_t Sampler::next(const float* logits, int64_t V, double* logprob) {
  // argmax: the first of equal maxima, as torch.argmax
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (logits[i] > logits[best]) best = i;
  int64_t pick = best;
  if (!c_.greedy && c_.temperature > 0) {
    // the kept candidates: idx_[0, n), most likely first where an order is needed
    idx_.resize(size_t(V));
    std::iota(idx_.begin(), idx_.end(), 0);
    const auto more_likely = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    const auto at = [&](size_t i) { return idx_.begin() + std::ptrdiff_t(i); };
    size_t n = size_t(V);
    if (c_.top_k > 0 && c_.top_k < V) {
      std::nth_element(idx_.begin(), at(size_t(c_.top_k)), idx_.end(), more_likely);
      n = size_t(c_.top_k);
    }
    // softmax(logits / temperature) over the candidates: p_[i] for idx_[i], kept ones' sum z
    const float inv_t = float(1.0 / c_.temperature), m = logits[best] * inv_t;
    const bool all = n == size_t(V);  // (idx_ is still 0, 1, ...: read in place)
    double z = sum_exp(logits, all ? nullptr : idx_.data(), n, inv_t, m);
    size_t keep = n;
    if (c_.top_p < 1) {
      // The smallest most-likely-first prefix whose mass reaches top_p (at least one token): only
      // a head of the order is sorted, grown until it holds that prefix (sorting a whole
      // 151,936-token vocabulary took 18-20 ms a token, the head 5)
      for (size_t head = std::min<size_t>(n, 256);; head = std::min(n, head * 8)) {
        if (head < n) std::nth_element(idx_.begin(), at(head), at(n), more_likely);
        std::sort(idx_.begin(), at(head), more_likely);
        p_.resize(head);
        double cum = 0;
        keep = 0;
        while (keep < head && (keep == 0 || cum < c_.top_p * z)) {
          cum += p_[keep] = double(cpu::vexp(logits[idx_[keep]] * inv_t - m));
          ++keep;
        }
        if (cum >= c_.top_p * z || head == n) {
          z = cum;
          break;
        }
      }
    } else {
      p_.resize(n);
      if (all) {
#pragma omp simd
        for (size_t k = 0; k < n; ++k) p_[k] = double(cpu::vexp(logits[k] * inv_t - m));
      } else {
        for (size_t k = 0; k < n; ++k) p_[k] = double(cpu::vexp(logits[idx_[k]] * inv_t - m));
      }
    }
    // u in [0, z): 53 random bits, independent of the standard library's distributions
    const double u = double(rng_() >> 11) * 0x1p-53 * z;
    double cum = 0;
    pick = idx_[keep - 1];
    for (size_t k = 0; k < keep; ++k)
      if (u < (cum += p_[k])) {
        pick = idx_[k];
        break;
      }
  }
  if (logprob) {
    const float m = logits[best];
    *logprob =
        double(logits[pick]) - double(m) - std::log(sum_exp(logits, nullptr, size_t(V), 1.0f, m));
  }
  return int32_t(pick);
}

}  // namespace tq::infer
