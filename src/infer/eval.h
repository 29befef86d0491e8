// `tiny-qwen3 eval`: a model's loss, perplexity and bits per byte on held-out text, over the
// same fixed windows the trainer validates on (train/trainer.cpp): window w is the T + 1 ids
// from w*T of the split's stream (or of a text file's ids), its T targets the ids after each.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/qwen3.h"

namespace tq::infer {

struct EvalArgs {
  std::string model;                                // any model file (infer/model.h)
  std::string data;                                 // a folder of token shards (prepare), or ""
  std::string split = "val";                        // with data: val or train
  std::string text;                                 // or a UTF-8 file, one document
  std::string tokenizer, preset, dtype, attention;  // "" where not given
  // Those not given (nullopt): all the targets the windows hold; the recorded run's T (its
  // validation's), else the walkthrough record's, else 2048 (at most the model's context); the
  // recorded run's batch size, else 1
  std::optional<int64_t> tokens;   // at most this many targets (whole windows, at least one)
  std::optional<int64_t> seq_len;  // T, the targets of a window
  std::optional<int64_t> batch;    // windows a forward takes
  int threads = 0;    // --threads (0: not given), then the count set (cpu::set_threads)
  bool json = false;  // one JSON object instead of the lines
};

// Token ids [at, at + n) of a stream of ids.
using ReadIds = std::function<void(uint64_t at, size_t n, int32_t* out)>;

struct WindowLoss {
  double nats = 0;       // the summed cross-entropy of every target
  uint64_t targets = 0;  // windows * T
  uint64_t bytes = 0;    // their bytes (token_bytes given)
};
// The loss of windows [0, windows) of T + 1 ids of `read` through model (built for B rows of
// at least T tokens, Use::eval), B at a time and the rest in one shorter forward; block-causal
// over documents ended by `eos` where eos >= 0. token_bytes, if not empty, gives each id's
// bytes, summed over the targets.
WindowLoss window_loss(Qwen3& model, const ReadIds& read, uint64_t windows, int64_t B, int64_t T,
                       int32_t eos, const std::vector<uint32_t>& token_bytes = {});

// Prints the result (lines, or one JSON object); returns 0. Bad input is an Error of one line.
int eval_command(const EvalArgs& a);

}  // namespace tq::infer
