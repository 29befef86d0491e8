#include "infer/commands.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cpu/runtime.h"
#include "infer/generate.h"
#include "infer/model.h"
#include "model/profile.h"

namespace tq::infer {

// One prompt a line (blank lines skipped), as UTF-8 text.
static std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot read --prompt-file " + path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) out.push_back(line);
  }
  if (out.empty()) throw Error("--prompt-file " + path + " holds no prompt (one a line)");
  return out;
}

// Where the time went, over the whole run (prefill and decode), with each kernel's least memory
// traffic and the rate it ran at (model/profile.h): decode's products are bound by reading the
// weights, so their GB/s against the machine's read bandwidth is their floor.
static void print_kernel_times(FILE* f) {
  std::fprintf(f, "profile: kernel times over the run\n");
  for (const KernelTime& k : kernel_times()) {
    std::fprintf(f, "  %-26s %9.2f ms %7ld calls", k.name.c_str(), k.seconds * 1e3, k.calls);
    if (k.bytes > 0)
      std::fprintf(f, " %9.1f MB %6.1f GB/s", k.bytes * 1e-6, k.bytes / k.seconds * 1e-9);
    std::fprintf(f, "\n");
  }
}

static std::string mib(size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", double(b) / (1 << 20));
  return s;
}

int generate_command(const GenerateArgs& a) {
  check(a.sampling);
  if (a.max_new_tokens < 1)
    throw Error("--max-new-tokens must be 1 or more, got " + std::to_string(a.max_new_tokens));
  std::vector<std::string> texts = a.prompts;
  if (!a.prompt_file.empty())
    for (std::string& p : read_prompts(a.prompt_file)) texts.push_back(std::move(p));
  if (texts.empty()) throw Error("no prompt: give --prompt TEXT or --prompt-file FILE");
  ModelInfo m = open_model(a.model, a.preset, a.dtype, "");
  const Config& c = *m.cfg;
  const text::Tokenizer tok = open_tokenizer(m, a.tokenizer);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<uint32_t> ids = tok.encode(texts[i]);
    if (ids.empty())
      throw Error("prompt " + std::to_string(i + 1) + " is empty: it has no tokens to continue");
    if (int64_t(ids.size()) + a.max_new_tokens > c.max_ctx)
      throw Error("prompt " + std::to_string(i + 1) + " has " + std::to_string(ids.size()) +
                  " tokens; with --max-new-tokens " + std::to_string(a.max_new_tokens) +
                  " that is past " + c.name + "'s context of " + std::to_string(c.max_ctx) +
                  " tokens");
    prompts.emplace_back(ids.begin(), ids.end());
  }
  const int64_t B = int64_t(prompts.size()), T = context_needed(prompts, a.max_new_tokens);
  const Ops& ops = a.profile ? profiled(cpu_ops()) : cpu_ops();
  const MemoryPlan plan = memory_plan(c, m.dtype, B, T, ops, Use::generate);
  const double have = cpu::available_memory_bytes();
  if (double(plan.total()) > have)
    throw Error("generating " + std::to_string(B) + " sequence(s) of up to " + std::to_string(T) +
                " tokens with " + c.name + " in " + dtype_name(m.dtype) + " needs " +
                mib(plan.total()) + " MiB, only " + mib(size_t(have)) + " MiB available");
  FILE* info = stderr;  // the text (or the JSON) goes to stdout alone
  std::fprintf(info, "model: %s (%s, %s, %s)\n", a.model.c_str(), m.file.kind.c_str(),
               c.name.c_str(), dtype_name(m.dtype));
  std::fprintf(info, "memory: %s MiB (parameters %s, KV cache %s, activations %s)\n",
               mib(plan.total()).c_str(), mib(plan.params).c_str(), mib(plan.cache).c_str(),
               mib(plan.activations + plan.scratch).c_str());
  Qwen3 model(c, m.dtype, B, T, ops, Use::generate);
  load_weights(m, model);
  GenerateConfig gc;
  gc.max_new_tokens = a.max_new_tokens;
  gc.sampling = a.sampling;
  if (const auto eos = tok.end_of_text()) gc.eos = int32_t(*eos);
  // One prompt streams its text as it comes; several are printed whole, each after its prompt.
  TextStream stream(tok);
  const bool streaming = !a.json && B == 1;
  if (streaming) {
    std::fputs(texts[0].c_str(), stdout);
    std::fflush(stdout);
  }
  GenerateStats st;
  const std::vector<Generation> gens = generate(model, prompts, gc, &st, [&](int64_t, int32_t id) {
    if (!streaming || id == gc.eos) return;
    std::fputs(stream.add(id).c_str(), stdout);
    std::fflush(stdout);
  });
  const auto continuation = [&](const Generation& g) {
    TextStream s(tok);
    std::string t;
    for (int32_t id : g.ids)
      if (id != gc.eos) t += s.add(id);
    return t + s.finish();
  };
  if (streaming) std::printf("%s\n", stream.finish().c_str());
  if (!a.json && !streaming)
    for (int64_t b = 0; b < B; ++b)
      std::printf("[%lld] %s%s\n", (long long)(b + 1), texts[size_t(b)].c_str(),
                  continuation(gens[size_t(b)]).c_str());
  const double pre = st.prefill_seconds > 0 ? double(st.prefill_tokens) / st.prefill_seconds : 0;
  const double dec = st.decode_seconds > 0 ? double(st.decode_tokens) / st.decode_seconds : 0;
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["preset"] = c.name;
    j["dtype"] = dtype_name(m.dtype);
    for (int64_t b = 0; b < B; ++b) {
      const Generation& g = gens[size_t(b)];
      j["generations"].push_back({{"prompt", texts[size_t(b)]},
                                  {"prompt_ids", g.prompt},
                                  {"ids", g.ids},
                                  {"text", continuation(g)},
                                  {"logprobs", g.logprobs},
                                  {"stop", g.stopped_at_eos ? "eos" : "length"}});
    }
    j["prefill"] = {{"tokens", st.prefill_tokens}, {"seconds", st.prefill_seconds}};
    j["decode"] = {{"tokens", st.decode_tokens}, {"seconds", st.decode_seconds}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  std::fprintf(info, "prefill: %lld tokens, %.1f tokens/s; decode: %lld tokens, %.1f tokens/s\n",
               (long long)st.prefill_tokens, pre, (long long)st.decode_tokens, dec);
  if (a.profile) print_kernel_times(info);
  return 0;
}

}  // namespace tq::infer
