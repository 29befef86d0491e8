// A model file opened for evaluation and generation (infer/eval.h, infer/generate.h): any file
// open_model_file reads (tiny-qwen3 checkpoints, TorchTitan state dicts, Hugging Face folders),
// with what it records about how it was trained: the dtype, the attention mode and, for a text
// run's checkpoint, the shards and so the tokenizer its ids belong to.
#pragma once
#include <optional>
#include <string>

#include "io/model_file.h"
#include "model/qwen3.h"
#include "text/tokenizer.h"
#include "train/trainer.h"

namespace tq::infer {

struct ModelInfo {
  ModelFile file;
  const Config* cfg = nullptr;
  DType dtype = DType::f32;  // asked, else the recorded run's, else the file's tensors', else fp32
  train::AttentionMask attention = train::AttentionMask::causal;  // asked, else the run's
  std::optional<train::RunConfig> run;  // a text run's checkpoint: its recorded configuration
  // The tokenizer its ids belong to, or "": a text run's shards' tokenizer.json (where its
  // meta.json still names the one the run recorded), or the tokenizer.json beside a Hugging
  // Face model's safetensors
  std::string tokenizer;
  // A text run's: the SHA-256 of the tokenizer its shards had when it trained (its own record,
  // not the shards' meta.json, which a later prepare may have replaced), and their eos id
  std::string tokenizer_sha256;
  std::optional<uint32_t> eos_id;
};

// Opens `path` (Error of one line for anything unreadable or foreign). preset, dtype and
// attention: the flags' values, "" where not given.
ModelInfo open_model(const std::string& path, const std::string& preset, const std::string& dtype,
                     const std::string& attention);

// The weights, converted to the model's dtype.
void load_weights(const ModelInfo& m, Qwen3& model);

// The tokenizer: `path` if given, else m.tokenizer. Error when there is none, when its ids do
// not fit the model's vocabulary, or when the run recorded another tokenizer (SHA-256) than
// the file holds.
text::Tokenizer open_tokenizer(const ModelInfo& m, const std::string& path);

}  // namespace tq::infer
