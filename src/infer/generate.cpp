#include "infer/generate.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "text/utf8.h"

namespace tq::infer {

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t context_needed(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  return int64_t(longest) + max_new_tokens;
}

std::vector<Generation> generate(Qwen3& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateConfig& c, GenerateStats* stats,
                                 const std::function<void(int64_t, int32_t)>& on_token) {
  const int64_t B = int64_t(prompts.size()), V = model.cfg().V;
  if (c.max_new_tokens < 1)
    throw Error("--max-new-tokens must be 1 or more, got " + std::to_string(c.max_new_tokens));
  std::vector<Generation> out(static_cast<size_t>(B));
  std::vector<Sampler> samplers;
  for (int64_t b = 0; b < B; ++b) samplers.emplace_back(c.sampling, uint64_t(b));
  std::vector<float> logits(static_cast<size_t>(B * V));
  std::vector<int32_t> next(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  GenerateStats st;
  // a sequence's next token from its logits row; false once it has stopped
  const auto choose = [&](int64_t b, const float* row) {
    Generation& g = out[size_t(b)];
    double lp = 0;
    const int32_t id = samplers[size_t(b)].next(row, V, &lp);
    g.ids.push_back(id);
    g.logprobs.push_back(lp);
    next[size_t(b)] = id;
    if (on_token) on_token(b, id);
    if (id == c.eos) g.stopped_at_eos = true;
    done[size_t(b)] = g.stopped_at_eos || int64_t(g.ids.size()) >= c.max_new_tokens;
  };
  double t0 = now();
  for (int64_t b = 0; b < B; ++b) {
    out[size_t(b)].prompt = prompts[size_t(b)];
    if (prompts[size_t(b)].empty()) throw Error("prompt " + std::to_string(b) + " is empty");
    model.prefill(b, prompts[size_t(b)].data(), int64_t(prompts[size_t(b)].size()), logits.data());
    st.prefill_tokens += int64_t(prompts[size_t(b)].size());
    choose(b, logits.data());
  }
  st.prefill_seconds = now() - t0;
  t0 = now();
  // Every sequence takes each step (a stopped one its last token again, its result unused):
  // the steps then read the weights once for all of them.
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    model.decode(next.data(), B, logits.data());
    for (int64_t b = 0; b < B; ++b)
      if (!done[size_t(b)]) choose(b, logits.data() + b * V), ++st.decode_tokens;
  }
  st.decode_seconds = now() - t0;
  if (stats) *stats = st;
  return out;
}

std::string TextStream::add(int32_t id) {
  const uint32_t u = uint32_t(id);
  tok_.decode_append(&u, 1, true, bytes_, first_);
  if (!tok_.decodes_bytes()) return std::exchange(bytes_, std::string());
  size_t held = 0;
  std::string s = text::repair_utf8(bytes_, false, &held);
  bytes_.erase(0, bytes_.size() - held);
  return s;
}

std::string TextStream::finish() {
  std::string s = tok_.decodes_bytes() ? text::repair_utf8(bytes_) : bytes_;
  bytes_.clear();
  return s;
}

}  // namespace tq::infer
