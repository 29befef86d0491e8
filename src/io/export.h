// Exports for other tools: a Hugging Face Qwen3ForCausalLM folder and a plain state dict.
#pragma once
#include <string>

#include "io/checkpoint.h"

namespace tq {

// DIR/config.json (every Qwen3Config field explicit), DIR/model.safetensors (Hugging Face
// names, the tied weight once, the training record in __metadata__) and
// DIR/generation_config.json. DIR is created if missing; each file is written atomically.
void export_hf(const std::string& dir, const Config& cfg, const ParamReader& read, DType dtype,
               const TrainRecord* rec);

// A plain torch.save'd state dict: TorchTitan's keys, tied entries sharing one storage.
void export_pt(const std::string& path, const Config& cfg, const ParamReader& read, DType dtype);

}  // namespace tq
