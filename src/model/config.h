// Qwen3 dense presets (spec qwen3-model.md §1) and the flat parameter layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tq {

struct Config {
  std::string name;
  int64_t V;        // vocab
  int64_t C;        // model dim
  int64_t L;        // layers
  int64_t H;        // query heads
  int64_t KVH;      // kv heads
  int64_t D;        // head dim
  int64_t F;        // ffn hidden dim
  int64_t max_ctx;  // max context length
  double theta;     // rope base
  bool tied;        // lm_head is tok_embeddings
  float eps;        // every RMSNorm

  int64_t qkv_rows() const { return (H + 2 * KVH) * D; }
};

const Config& preset(const std::string& name);  // Error on an unknown name
const std::vector<Config>& presets();

// One trainable tensor inside the flat parameter arena, in model.parameters() order.
struct ParamView {
  std::string name;  // TorchTitan name; the fused qkv keeps its fused name
  std::vector<int64_t> shape;
  size_t offset;
  size_t numel;
};

// Offsets (in elements) of every parameter in the arena. The same layout serves the
// gradient arena, so the optimizer is one flat loop.
struct ParamLayout {
  struct Layer {
    size_t wqkv;       // [(H+2KVH)*D, C] fused rows, spec §3
    size_t wo;         // [C, H*D]
    size_t q_norm;     // [D]
    size_t k_norm;     // [D]
    size_t w1;         // [F, C] gate; w3 follows it directly
    size_t w3;         // [F, C] up
    size_t w2;         // [C, F] down
    size_t attn_norm;  // [C]
    size_t ffn_norm;   // [C]
  };
  size_t tok_emb;  // [V, C]
  std::vector<Layer> layers;
  size_t norm;     // [C]
  size_t lm_head;  // [V, C]; equals tok_emb when tied
  size_t total;    // elements, the tied weight once
  std::vector<ParamView> params;
};

ParamLayout make_layout(const Config& cfg);

}  // namespace tq
