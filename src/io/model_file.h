// Any file holding Qwen3 weights, opened for import: tiny-qwen3 checkpoints, torch.save'd
// TorchTitan state dicts (split or fused qkv, the older `output.weight` name, bare or under
// "model"), and Hugging Face safetensors (one file, a sharded index, or a folder with
// config.json). Names are mapped to TorchTitan's; the preset is given or inferred from the
// shapes; every key, shape, dtype and tie is checked before anything large is read.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/init.h"

namespace tq {

struct SourceTensor {
  std::string name;  // as stored in the file
  std::vector<int64_t> shape;
  std::string dtype;    // torch's name: float32, bfloat16, float16, float64, int64, ...
  std::string storage;  // identity of the bytes: equal for entries that share them (ties)
  // its elements [begin, begin + n) in dense order, as fp32, into out
  std::function<void(size_t begin, size_t n, float* out)> read;
  size_t numel() const;
  std::vector<float> read_all() const;  // all of them
};

// The longest piece of a tensor load_params reads and hands to its sink at once.
constexpr size_t kLoadPiece = size_t(1) << 22;

struct ModelFile {
  std::string path, kind;  // kind: "tiny-qwen3 checkpoint", "PyTorch state dict", "safetensors"
  std::vector<SourceTensor> tensors;
  std::string preset;                       // the recorded preset name, or ""
  std::optional<TrainRecord> record;        // when the file records a training run
  std::optional<DType> dtype;               // recorded, or the tensors' when all f32 or all bf16
  std::optional<nlohmann::json> hf_config;  // config.json beside a safetensors file
  std::string hf_config_path;
  std::vector<std::shared_ptr<const void>> keep;  // the mapped files the readers point into
};

// Error (one line naming the file and the problem) for anything unreadable or foreign.
ModelFile open_model_file(const std::string& path);

// The preset the file holds: `want` when non-empty (Error naming the first key whose
// shape differs), else the one whose dimensions match the shapes. Also checks every
// tensor's dtype, missing/unexpected keys, ties and config.json (check_model_file).
const Config& resolve_preset(const ModelFile& mf, const std::string& want = "");

// Error naming the first key, shape, dtype, tie or config.json field that does not fit cfg.
void check_model_file(const ModelFile& mf, const Config& cfg);

// Streams every parameter as fp32 into sink, in make_layout(cfg) arena offsets.
void load_params(const ModelFile& mf, const Config& cfg, const ParamSink& sink);
// The same values read where they lie: arena elements [off, off + n) straight from mf's
// tensors (checked as load_params checks), so that a writer converts a file tensor by tensor
// without holding the model (export). mf must outlive it.
ParamReader source_reader(const ModelFile& mf, const Config& cfg);

// Hugging Face Qwen3ForCausalLM name of a TorchTitan state-dict key (spec §8).
std::string hf_name(const std::string& titan_key);

struct Checkpoint {
  std::string preset;
  DType dtype = DType::f32;
  bool recorded = false;  // rec holds a training run (else only seq_len may be set)
  TrainRecord rec;
  std::vector<float> params;  // make_layout(preset(preset)) order, fp32
};
// Any model file, whole, in fp32: for `check` and tests. before_params, if set, sees the
// checkpoint (all but its params) before the weights are read, and may refuse it.
Checkpoint load_checkpoint(const std::string& path,
                           const std::function<void(const Checkpoint&)>& before_params = {});

}  // namespace tq
