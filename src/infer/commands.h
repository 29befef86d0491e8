// `tiny-qwen3 generate`: what the CLI's flags ask, and the command itself (src/cli parses).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "infer/sampler.h"

namespace tq::infer {

struct GenerateArgs {
  std::string model, tokenizer, preset, dtype, prompt_file;
  std::vector<std::string> prompts;
  int64_t max_new_tokens = 64;
  SamplerConfig sampling;
  int threads = 0;  // resolved by the CLI
  bool json = false, profile = false;
};
int generate_command(const GenerateArgs& a);

}  // namespace tq::infer
