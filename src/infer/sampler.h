// The next token from a model's logits: greedy, or sampled with temperature, top-k and top-p
// (nucleus) filtering, in Hugging Face generate()'s order (temperature, then top-k, then
// top-p). Reproducible: each sequence draws from its own generator, seeded from the seed and
// the sequence's index, so a prompt's continuation does not depend on the prompts beside it.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace tq::infer {

struct SamplerConfig {
  bool greedy = false;       // argmax (also when temperature is 0)
  double temperature = 1.0;  // >= 0
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the most likely tokens whose probabilities reach p; (0, 1]
  uint64_t seed = 0;
};
void check(const SamplerConfig& c);  // Error naming the flag for a value out of range

class Sampler {
 public:
  Sampler(const SamplerConfig& c, uint64_t sequence);
  // The token chosen from logits [V], and (if logprob) its log-probability under the model's
  // own distribution, log_softmax(logits), before temperature and filtering.
  int32_t next(const float* logits, int64_t V, double* logprob = nullptr);

 private:
  SamplerConfig c_;
  std::mt19937_64 rng_;
  std::vector<int32_t> idx_;
  std::vector<double> p_;
};

}  // namespace tq::infer
