// Generation: prompts -> continuations, on a Qwen3 built with Use::generate (its KV cache): each
// prompt prefilled alone into its sequence's cache, then one token for every sequence per
// decode step, until each has produced end-of-text or max_new_tokens tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "infer/sampler.h"
#include "model/qwen3.h"
#include "text/tokenizer.h"

namespace tq::infer {

struct GenerateConfig {
  int64_t max_new_tokens = 64;
  SamplerConfig sampling;
  int32_t eos = -1;  // stop a sequence at this id (not part of its text); -1: never
};

struct Generation {
  std::vector<int32_t> prompt;   // its ids
  std::vector<int32_t> ids;      // the new ones (an end-of-text id last where it stopped there)
  std::vector<double> logprobs;  // each new id's log-probability under the model
  bool stopped_at_eos = false;
};

struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;  // tokens through each (decode: one a sequence)
  double prefill_seconds = 0, decode_seconds = 0;
};

// The tokens a model must hold for these prompts: the longest prompt and max_new_tokens.
int64_t context_needed(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens);

// Runs them on `model` (built with Use::generate for at least prompts.size() sequences of
// context_needed tokens). on_token(sequence, id), if set, sees each new id as it is chosen.
std::vector<Generation> generate(Qwen3& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateConfig& c, GenerateStats* stats = nullptr,
                                 const std::function<void(int64_t, int32_t)>& on_token = {});

// Text as it is generated: the bytes of each new id appended, and what is complete UTF-8 of
// them handed back (an incomplete character is held until its last byte, invalid bytes become
// U+FFFD as the tokenizer's decode makes them).
class TextStream {
 public:
  explicit TextStream(const text::Tokenizer& tok) : tok_(tok) {}
  std::string add(int32_t id);  // the new text
  std::string finish();         // what is held, repaired

 private:
  const text::Tokenizer& tok_;
  std::string bytes_;
  bool first_ = false;  // (a continuation: the prompt came first)
};

}  // namespace tq::infer
