#include "model/config.h"

#include "core/common.h"

namespace tq {

const std::vector<Config>& presets() {
  //                       V       C     L   H   KVH  D    F      ctx    theta tied  eps
  static const std::vector<Config> all = {
      {"debugmodel", 2048, 256, 8, 16, 8, 128, 3072, 4096, 1e6, true, 1e-6f},
      {"0.6B", 151936, 1024, 28, 16, 8, 128, 3072, 40960, 1e6, true, 1e-6f},
      {"1.7B", 151936, 2048, 28, 16, 8, 128, 6144, 40960, 1e6, true, 1e-6f},
      {"4B", 151936, 2560, 36, 32, 8, 128, 9728, 40960, 1e6, true, 1e-6f},
      {"8B", 151936, 4096, 36, 32, 8, 128, 12288, 40960, 1e6, false, 1e-6f},
      {"14B", 151936, 5120, 40, 40, 8, 128, 17408, 40960, 1e6, false, 1e-6f},
      {"32B", 151936, 5120, 64, 64, 8, 128, 25600, 40960, 1e6, false, 1e-6f},
  };
  return all;
}

const Config& preset(const std::string& name) {
  std::string known;
  for (const Config& c : presets()) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + c.name;
  }
  throw Error("unknown preset '" + name + "' (known: " + known + ")");
}

ParamLayout make_layout(const Config& c) {
  ParamLayout p;
  size_t off = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    p.params.push_back({name, std::move(shape), off, n});
    off += n;
    return off - n;
  };
  p.tok_emb = add("tok_embeddings.weight", {c.V, c.C});
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ParamLayout::Layer ly;
    ly.wqkv = add(pre + "attention.qkv_linear.wqkv.weight", {c.qkv_rows(), c.C});
    ly.wo = add(pre + "attention.wo.weight", {c.C, c.H * c.D});
    // q_norm and k_norm adjacent: the model hands them to QK-norm as one [2, D] block
    ly.q_norm = add(pre + "attention.q_norm.weight", {c.D});
    ly.k_norm = add(pre + "attention.k_norm.weight", {c.D});
    // w1 and w3 adjacent: together they are one [2F, C] matrix, one matmul
    ly.w1 = add(pre + "feed_forward.w1.weight", {c.F, c.C});
    ly.w3 = add(pre + "feed_forward.w3.weight", {c.F, c.C});
    ly.w2 = add(pre + "feed_forward.w2.weight", {c.C, c.F});
    ly.attn_norm = add(pre + "attention_norm.weight", {c.C});
    ly.ffn_norm = add(pre + "ffn_norm.weight", {c.C});
    p.layers.push_back(ly);
  }
  p.norm = add("norm.weight", {c.C});
  p.lm_head = c.tied ? p.tok_emb : add("lm_head.weight", {c.V, c.C});
  p.total = off;
  return p;
}

}  // namespace tq
